"""The position strategy's Arrow collapse (lineage.writes.changelog_arrow) against its SQL definition.

Random batches of every operation, valid and not, strict and upsert mode,
with nulls and NaN in the images, are planned both ways on the same table
state: the removed images, new images, inserts and ignored counts agree, and
a batch one path refuses the other refuses with the same error. The kept
rows of small files (what a merge-on-read write folds) read by position
equal the DuckDB scan's.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import lineage
import lineage.duck as duck
import lineage.writes.changelog_arrow as changelog_arrow
from lineage.errors import KeyViolationError
from lineage.writes.changelog import PositionDeletes, prepare_batch

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("amount", pa.float64())])
OPS = ["+I", "-U", "+U", "-D", "c", "u", "d"]
COLLAPSED: list[bool] = []


def _rows(rng: np.random.Generator, ids: np.ndarray) -> dict[str, list]:
    names = [None if rng.random() < 0.1 else f"n{int(rng.integers(3))}" for _ in ids]
    amounts = [None if r < 0.1 else (float("nan") if r < 0.2 else float(rng.integers(3))) for r in rng.random(len(ids))]
    return {"id": ids.tolist(), "name": names, "amount": amounts}


def _events(rng: np.random.Generator, live: dict[int, dict]) -> tuple[list[str], dict[str, list]]:
    """A batch that follows the table's state (each event valid for its key's state), with a few wrong events."""
    state = {k: (r["name"], r["amount"]) for k, r in live.items()}
    ops: list[str] = []
    events: dict[str, list] = {"id": [], "name": [], "amount": []}

    def emit(op: str, k: int, image: tuple) -> None:
        ops.append(op)
        events["id"].append(k)
        events["name"].append(image[0])
        events["amount"].append(image[1])

    for _ in range(int(rng.integers(1, 20))):
        k = int(rng.integers(0, 60))
        fresh = tuple(_rows(rng, np.array([k])).values())[1:]
        image = (fresh[0][0], fresh[1][0])
        if rng.random() < 0.05:  # any operation, valid or not
            emit(OPS[int(rng.integers(len(OPS)))], k, image)
        elif state.get(k) is None:
            emit(str(rng.choice(["+I", "c"])), k, image)
        else:
            choice = int(rng.integers(3))
            if choice == 0:  # -U with the key's image (now and then another one), then +U
                emit("-U", k, state[k] if rng.random() < 0.95 else image)
                emit("+U", k, image)
            else:
                emit(["-D", "u"][choice - 1], k, image)
        if ops[-1] in ("-D", "d", "-U"):
            state[k] = None
        elif ops[-1] != "-U":
            state[k] = image
    return ops, events


def _plan(t: lineage.Table, batch: pa.Table, upsert: bool, arrow: bool, monkeypatch: pytest.MonkeyPatch):
    ctx = t._context
    with monkeypatch.context() as m:
        if not arrow:
            m.setattr(changelog_arrow, "applies", lambda batch: False)
        else:  # the Arrow path itself plans every batch the SQL path accepts (None hands a batch to SQL)
            collapse = changelog_arrow.collapse

            def recorded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                out = collapse(*args, **kwargs)
                COLLAPSED.append(out is not None)
                return out

            m.setattr(changelog_arrow, "collapse", recorded)
        prepared = prepare_batch(ctx, batch, "_op", None)
        con = duck.connect()
        try:
            return PositionDeletes().plan(ctx, prepared, upsert, ctx.state_in_hand(), con)
        except KeyViolationError as exc:
            return exc
        finally:
            con.close()


def _sorted(table: pa.Table, by: str) -> list[dict]:
    return table.sort_by(by).to_pylist()


def _same(a: object, b: object) -> None:
    if isinstance(a, Exception) or isinstance(b, Exception):
        assert type(a) is type(b) and str(a) == str(b)
        return
    assert a.ignored == b.ignored and (a.inserted, a.updated, a.deleted) == (b.inserted, b.updated, b.deleted)
    assert [f.path for f in a.files] == [f.path for f in b.files]
    key = "__lineage_row_id"
    assert repr(_sorted(a.removed, "_row_id")) == repr(_sorted(b.removed, "_row_id"))  # repr: NaN equals NaN
    assert repr(_sorted(a.new_images, key)) == repr(_sorted(b.new_images, key))
    assert repr(_sorted(a.inserts, "id")) == repr(_sorted(b.inserts, "id"))
    assert a.new_images.schema == b.new_images.schema and a.inserts.schema == b.inserts.schema
    assert a.key_index.removed_keys.sort_by("id").equals(b.key_index.removed_keys.sort_by("id"))


@pytest.mark.parametrize("upsert", [False, True])
def test_arrow_collapse_matches_sql(tmp_path, monkeypatch: pytest.MonkeyPatch, upsert: bool) -> None:
    rng = np.random.default_rng(7 + upsert)
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=str(tmp_path))
    t.append(pa.table(_rows(rng, np.arange(40)), schema=SCHEMA))
    live = {r["id"]: r for r in t.scan().to_pylist()}
    refused = 0
    for _ in range(30):
        ops, events = _events(rng, live)
        batch = pa.table({"_op": ops, **events})
        COLLAPSED.clear()
        fast, slow = _plan(t, batch, upsert, True, monkeypatch), _plan(t, batch, upsert, False, monkeypatch)
        _same(fast, slow)
        assert COLLAPSED == [not isinstance(slow, Exception)]
        if isinstance(fast, Exception):
            refused += 1
            continue
        t.apply_changelog(batch, upsert=upsert)
        live = {r["id"]: r for r in t.scan().to_pylist()}
    assert (upsert or refused) and refused < 20  # strict mode refused some batches, and applied most
    assert len(live) > 0


def test_arrow_collapse_applies_only_to_its_batches(tmp_path) -> None:
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=str(tmp_path))
    ctx = t._context
    batch = pa.table({"_op": ["+I"], "id": [1], "name": ["a"], "amount": [1.0], "seq": [1]})
    assert changelog_arrow.applies(prepare_batch(ctx, batch.drop_columns(["seq"]), "_op", None))
    assert not changelog_arrow.applies(prepare_batch(ctx, batch, "_op", "seq"))  # explicit order: SQL (ties are checked)
    assert not changelog_arrow.applies(prepare_batch(ctx, batch.drop_columns(["seq"]).slice(0, 0), "_op", None))
    t.append(pa.table({"id": [1], "name": ["a"], "amount": [1.0]}, schema=SCHEMA))
    info = t.apply_changelog(batch.drop_columns(["seq"]).slice(0, 0))  # an empty batch commits nothing
    assert not info.committed and t.scan().num_rows == 1


@pytest.mark.parametrize("format_version", [2, 3])
def test_kept_rows_by_position_match_the_scan(tmp_path, monkeypatch: pytest.MonkeyPatch, format_version: int) -> None:
    """The kept rows of small files read by position (values and lineage) equal the DuckDB scan's."""
    import lineage.writes.rows as rows
    from lineage.iceberg.schema import projection_field_ids

    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=str(tmp_path), properties={"format-version": str(format_version)})
    rng = np.random.default_rng(3)
    for start in range(0, 300, 100):
        t.append(pa.table(_rows(rng, np.arange(start, start + 100)), schema=SCHEMA))
    t.delete("id % 7 = 0")  # earlier deletes the files carry (vectors on v3)
    t.upsert(pa.table(_rows(rng, np.arange(0, 300, 5)), schema=SCHEMA))  # rows that moved: lineage runs of several values
    state = t._context.state_in_hand()
    files = state.live_files()
    groups = {i: {"__pos": np.sort(rng.choice(int(f.data_file.record_count), 5, replace=False))} for i, f in enumerate(files)}
    field_ids = projection_field_ids(t.iceberg.metadata)
    con = duck.connect()
    try:
        fast = rows.kept_rows(con, files, groups, t.arrow_schema, field_ids)
        monkeypatch.setattr(rows, "_kept_by_position", lambda *a: None)
        slow = rows.kept_rows(con, files, groups, t.arrow_schema, field_ids)
    finally:
        con.close()
    assert fast.num_rows > 0 and len(files) > 1
    assert repr(fast.to_pylist()) == repr(slow.to_pylist())
