"""How a change-stream batch collapses into per-key net effects, defined once as SQL.

The definition is rendered for DuckDB (the embedded path) and for Spark SQL
(executors), which differ only in identifier quoting here.

Input relations:

* ``events``: one row per change event with the table's data columns, the
  event's operation code ``__op`` (see :data:`OPS`) and the ordering
  columns that define "batch order";
* ``start``: the live image of each key of the batch before the batch
  (key columns, ``_row_id``, ``_row_created_at_version``,
  ``_row_last_updated_at_version``, the image's pointer columns, and the data
  columns when before-images are checked). Keys without a live image have
  no row.

Every event sets its key's state completely: ``+I``, ``+U`` and ``u`` make the
key live with the event's own image, ``-U`` and ``-D`` make it absent (also
when an upsert-mode batch ignores them: the key was absent already). So the
state *before* an event is the state after the previous event of the same key
(``LAG`` over the key ordered by batch position), or the ``start`` image for
the key's first event; the state after the batch is set by the key's last
event alone. Validation and the collapse are therefore two window queries,
with no loop over events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Canonical operation codes (``__op``).
INSERT = 0  # Flink +I, Debezium c (create) and r (snapshot read)
UPDATE_BEFORE = 1  # Flink -U: retracts the key's live image, which must equal the event's image
UPDATE_AFTER = 2  # Flink +U: the new image after a -U
DELETE = 3  # Flink -D, Debezium d
UPDATE = 4  # Debezium u: the after image of an update of a live key (no before image)

OPS: dict[str, int] = {
    "+I": INSERT,
    "-U": UPDATE_BEFORE,
    "+U": UPDATE_AFTER,
    "-D": DELETE,
    "INSERT": INSERT,
    "UPDATE_BEFORE": UPDATE_BEFORE,
    "UPDATE_AFTER": UPDATE_AFTER,
    "DELETE": DELETE,
    "c": INSERT,
    "r": INSERT,
    "u": UPDATE,
    "d": DELETE,
}
OP_LABELS = {INSERT: "+I", UPDATE_BEFORE: "-U", UPDATE_AFTER: "+U", DELETE: "-D", UPDATE: "u"}
OP_VERBS = {INSERT: "inserts", UPDATE_BEFORE: "retracts", UPDATE_AFTER: "adds", DELETE: "deletes", UPDATE: "updates"}
POSITIVE = (INSERT, UPDATE_AFTER, UPDATE)
NEGATIVE = (UPDATE_BEFORE, DELETE)

# Problems a strict-mode batch can have, by the name the SQL reports.
PROBLEMS = {
    "live": "adds key {key} that is already live",
    "absent": "{verb} key {key} that is not live",
    "image": "retracts key {key} with an image that differs from its live row",
    "tie": "shares its order value with another event of key {key} (the order is ambiguous)",
}


@dataclass(frozen=True)
class Relations:
    """Names and columns the SQL is rendered over."""

    key: Sequence[str]
    columns: Sequence[str]  # data columns of the table
    order: Sequence[str]  # ordering columns of ``events`` (ascending = batch order)
    pointers: Sequence[str]  # columns of ``start`` that address the live image (file id or path, position)
    quote: Callable[[str], str]
    events: str = "events"
    start: str = "start"


def _codes(codes: Sequence[int]) -> str:
    return "(" + ", ".join(str(c) for c in codes) + ")"


def _partition(r: Relations) -> str:
    return ", ".join(r.quote(k) for k in r.key)


def _order(r: Relations, descending: bool = False) -> str:
    suffix = " DESC" if descending else ""
    return ", ".join(r.quote(c) + suffix for c in r.order)


def _join(r: Relations, left: str, right: str) -> str:
    return " AND ".join(f"{left}.{r.quote(k)} = {right}.{r.quote(k)}" for k in r.key)


def problems_sql(r: Relations, *, upsert: bool, check_images: bool, check_ties: bool) -> str:
    """Per event that breaks the mode's rules (or that upsert mode ignores): key, order, ``__op``, ``__problem``.

    Strict mode reports ``live``, ``absent``, ``image`` and ``tie`` problems;
    upsert mode reports ``ignored`` for ``-U``/``-D`` of absent keys and ``tie``.
    """
    q = r.quote
    w = f"PARTITION BY {_partition(r)} ORDER BY {_order(r)}"
    lags = "".join(f", LAG({q(c)}) OVER ({w}) AS {q(f'__prev{i}')}" for i, c in enumerate(r.columns)) if check_images else ""
    ties = f", count(*) OVER (PARTITION BY {_partition(r)}, {', '.join(q(c) for c in r.order)}) AS __ties" if check_ties else ""
    first_live = f"s.{q('_row_id')} IS NOT NULL"
    prev_live = f"CASE WHEN e.__prev_op IS NULL THEN {first_live} ELSE e.__prev_op IN {_codes(POSITIVE)} END"
    rules = []
    if check_ties:
        rules.append("WHEN e.__ties > 1 THEN 'tie'")
    if upsert:
        rules.append(f"WHEN e.__op IN {_codes(NEGATIVE)} AND NOT ({prev_live}) THEN 'ignored'")
    else:
        rules.append(f"WHEN e.__op IN {_codes((INSERT, UPDATE_AFTER))} AND ({prev_live}) THEN 'live'")
        rules.append(f"WHEN e.__op IN {_codes((UPDATE_BEFORE, DELETE, UPDATE))} AND NOT ({prev_live}) THEN 'absent'")
        if check_images:
            same_first = " AND ".join(f"e.{q(c)} IS NOT DISTINCT FROM s.{q(c)}" for c in r.columns)
            same_prev = " AND ".join(f"e.{q(c)} IS NOT DISTINCT FROM e.{q(f'__prev{i}')}" for i, c in enumerate(r.columns))
            same = f"CASE WHEN e.__prev_op IS NULL THEN ({same_first}) ELSE ({same_prev}) END"
            rules.append(f"WHEN e.__op = {UPDATE_BEFORE} AND NOT ({same}) THEN 'image'")
    keys = ", ".join(f"e.{q(k)}" for k in r.key)
    order = ", ".join(f"e.{q(c)}" for c in r.order)
    return (
        f"SELECT {keys}, {order}, e.__op, CASE {' '.join(rules)} END AS __problem "
        f"FROM (SELECT *, LAG(__op) OVER ({w}) AS __prev_op{lags}{ties} FROM {r.events}) e "
        f"LEFT JOIN {r.start} s ON {_join(r, 'e', 's')}"
    )


def net_effects_sql(r: Relations) -> str:
    """One row per key of the batch: its last event's image and ``__op``, and its start image's lineage.

    ``__start_live``: the key had a live image before the batch (its lineage
    and pointer columns are filled); ``__end_live``: it has one after. Both →
    an update keeping ``_row_id``; only the end → an insert; only the start →
    a delete; neither → nothing.
    """
    q = r.quote
    cols = ", ".join(f"l.{q(c)}" for c in r.columns)
    lineage = ", ".join(f"s.{q(c)}" for c in ("_row_id", "_row_created_at_version", "_row_last_updated_at_version", *r.pointers))
    return (
        f"SELECT {cols}, l.__op, s.{q('_row_id')} IS NOT NULL AS __start_live, l.__op IN {_codes(POSITIVE)} AS __end_live, {lineage} "
        f"FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY {_partition(r)} ORDER BY {_order(r, descending=True)}) AS __rn "
        f"FROM {r.events}) l LEFT JOIN {r.start} s ON {_join(r, 'l', 's')} WHERE l.__rn = 1"
    )
