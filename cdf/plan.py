"""The change data feed, defined once as SQL over an ``images`` relation.

Input relation ``images``: one row per row image with the data columns,
``_row_id``, ``_row_created_at_version``, ``_valid_from`` (the version that
wrote the image) and ``_valid_to`` (the version that removed it, null while
live). Input relation ``commits``: ``__version`` and ``_commit_timestamp``.

Per-version mode: every image starting in ``(a, b]`` is a start event and
every image ending there an end event. Events are ordered per ``_row_id`` by
version (end before start); an end directly followed by a start of the same
row at the same version is an update pair (LAG/LEAD), otherwise an end is a
delete and a start an insert.

Net mode keeps, per ``_row_id``, the image live at ``a`` and the image live at
``b``: both present → an update pair (dropped when equal in every selected
column), only the first → a delete, only the second → an insert. Everything
is partitioned by ``_row_id`` only; no step shuffles on all columns.

``a`` and ``b`` are SQL expressions, so the same text serves literal ranges
and DuckDB macro parameters.
"""

from __future__ import annotations

from cdf.dialect import Dialect

OUTPUT_COLUMNS = (
    "_change_type",
    "_commit_version",
    "_commit_timestamp",
    "_row_id",
    "_row_created_at_version",
    "_row_last_updated_at_version",
    "_changed_columns",
)


def _changed(d: Dialect, columns: list[str], partner_prefix: str) -> str:
    items = [
        f"CASE WHEN {d.ident(c)} IS DISTINCT FROM {d.ident(f'{partner_prefix}{i}')} THEN {d.string(c)} END"
        for i, c in enumerate(columns)
    ]
    return d.non_null_strings(items)


def _partners(d: Dialect, columns: list[str], take_previous: str) -> str:
    """Each column's value in the partner image (previous row if ``take_previous`` holds, else next)."""
    return "".join(
        f", CASE WHEN {take_previous} THEN LAG({d.ident(c)}) OVER w ELSE LEAD({d.ident(c)}) OVER w END AS {d.ident(f'__p{i}')}"
        for i, c in enumerate(columns)
    )


def changes_sql(
    d: Dialect, images: str, commits: str, columns: list[str], a: str, b: str, net: bool = False, extra: list[str] | None = None
) -> str:
    """The SQL text of the change feed over ``(a, b]``.

    ``extra`` image columns (e.g. ``_purged``) are carried through unchanged
    and appended to the output; they do not count as changed columns.
    """
    return (_net_sql if net else _per_version_sql)(d, images, commits, columns, str(a), str(b), list(extra or []))


def _trailing(d: Dialect, extra: list[str], alias: str) -> str:
    return "".join(f", {alias}{d.ident(c)}" for c in extra)


def _select_cols(d: Dialect, columns: list[str], alias: str = "") -> str:
    return "".join(f"{alias}{d.ident(c)}, " for c in columns)


def _per_version_sql(d: Dialect, images: str, commits: str, columns: list[str], a: str, b: str, extra: list[str]) -> str:
    cols = _select_cols(d, columns + extra)
    return f"""
WITH events AS (
    SELECT {cols}_row_id, _row_created_at_version, _valid_from AS _row_last_updated_at_version,
           _valid_from AS _commit_version, 1 AS __kind
    FROM {images} WHERE _valid_from > {a} AND _valid_from <= {b}
    UNION ALL
    SELECT {cols}_row_id, _row_created_at_version, _valid_from AS _row_last_updated_at_version,
           _valid_to AS _commit_version, 0 AS __kind
    FROM {images} WHERE _valid_to > {a} AND _valid_to <= {b}
),
paired AS (
    SELECT *,
        COALESCE(CASE WHEN __kind = 1
                      THEN LAG(__kind) OVER w = 0 AND LAG(_commit_version) OVER w = _commit_version
                      ELSE LEAD(__kind) OVER w = 1 AND LEAD(_commit_version) OVER w = _commit_version END, FALSE) AS __paired
        {_partners(d, columns, "__kind = 1")}
    FROM events
    WINDOW w AS (PARTITION BY _row_id ORDER BY _commit_version, __kind)
)
SELECT {_select_cols(d, columns, "p.")}
    CASE WHEN p.__paired THEN CASE WHEN p.__kind = 1 THEN 'update_postimage' ELSE 'update_preimage' END
         ELSE CASE WHEN p.__kind = 1 THEN 'insert' ELSE 'delete' END END AS _change_type,
    p._commit_version, c._commit_timestamp, p._row_id, p._row_created_at_version, p._row_last_updated_at_version,
    CASE WHEN p.__paired THEN {_changed(d, columns, "__p")} END AS _changed_columns{_trailing(d, extra, "p.")}
FROM paired p LEFT JOIN {commits} c ON c.__version = p._commit_version
ORDER BY p._commit_version, p._row_id, p.__kind
"""


def _net_sql(d: Dialect, images: str, commits: str, columns: list[str], a: str, b: str, extra: list[str]) -> str:
    cols = _select_cols(d, columns + extra)
    starts = f"(_valid_from > {a} AND _valid_from <= {b})"
    ends = f"(_valid_to > {a} AND _valid_to <= {b})"
    return f"""
WITH imgs AS (
    SELECT {cols}_row_id, _row_created_at_version, _valid_from,
           _valid_from <= {a} AS __at_a,
           _valid_from > {a} AND (_valid_to IS NULL OR _valid_to > {b}) AS __at_b,
           GREATEST(CASE WHEN {starts} THEN _valid_from ELSE 0 END, CASE WHEN {ends} THEN _valid_to ELSE 0 END) AS __last
    FROM {images}
    WHERE {starts} OR {ends}
),
last_change AS (
    SELECT *, MAX(__last) OVER (PARTITION BY _row_id) AS _commit_version FROM imgs
),
paired AS (
    SELECT *, COUNT(*) OVER (PARTITION BY _row_id) = 2 AS __paired
        {_partners(d, columns, "__at_b")}
    FROM last_change
    WHERE __at_a OR __at_b
    WINDOW w AS (PARTITION BY _row_id ORDER BY __at_b)
),
typed AS (
    SELECT *, {_changed(d, columns, "__p")} AS __changed FROM paired
)
SELECT {_select_cols(d, columns, "t.")}
    CASE WHEN t.__paired THEN CASE WHEN t.__at_b THEN 'update_postimage' ELSE 'update_preimage' END
         ELSE CASE WHEN t.__at_b THEN 'insert' ELSE 'delete' END END AS _change_type,
    t._commit_version, c._commit_timestamp, t._row_id, t._row_created_at_version, t._valid_from AS _row_last_updated_at_version,
    CASE WHEN t.__paired THEN t.__changed END AS _changed_columns{_trailing(d, extra, "t.")}
FROM typed t LEFT JOIN {commits} c ON c.__version = t._commit_version
WHERE NOT t.__paired OR {d.size("t.__changed")} > 0
ORDER BY t._commit_version, t._row_id, t.__at_b
"""
