"""Pairing a snapshot's removed and added images into moves, updates, deletes and inserts.

Keyed table: a removed and an added image with the same key are one row (the
added image keeps the removed one's row id and created version); equal in
every column it is a *move* (no change event, its updated version is kept),
otherwise an update at the snapshot's version. Keyless table, and every
``replace`` snapshot: removed and added images with identical values pair as
moves (a multiset match, ties broken by position order); the rest are deletes
and inserts. Unpaired added images get fresh row ids from the high-water mark
in order (added files in manifest order, positions ascending); so do the
positions the snapshot deleted in its own files (never visible, but lineage
covers every position; their created and updated versions are 0, so no
change-feed range includes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

import lineage.duck as duck
from lineage.sql.predicate import quote_ident

_I, _J = "__i", "__j"


@dataclass
class Pairs:
    """Index pairs (removed image, added image) and which of them are moves."""

    removed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    added: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    move: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))


def pair_images(removed: pa.Table, added: pa.Table, key: list[str], columns: list[str]) -> Pairs:
    """Pairs of rows of ``removed`` and ``added`` (both with the data ``columns``).

    With a ``key`` rows pair by key (one to one, in row order within a key);
    without one, by all ``columns`` (NULL equals NULL). ``move`` marks pairs
    equal in every column.
    """
    if not removed.num_rows or not added.num_rows:
        return Pairs()
    by = key or columns
    con = duck.connect()
    try:
        con.register("r_in", removed.append_column(_I, pa.array(np.arange(removed.num_rows), pa.int64())))
        con.register("a_in", added.append_column(_J, pa.array(np.arange(added.num_rows), pa.int64())))
        part = ", ".join(quote_ident(c) for c in by)
        on = " AND ".join(f"r.{quote_ident(c)} IS NOT DISTINCT FROM a.{quote_ident(c)}" for c in by)
        same = " AND ".join(f"r.{quote_ident(c)} IS NOT DISTINCT FROM a.{quote_ident(c)}" for c in columns) or "TRUE"
        found = con.execute(
            f"WITH r AS (SELECT *, row_number() OVER (PARTITION BY {part} ORDER BY {_I}) AS __n FROM r_in), "
            f"a AS (SELECT *, row_number() OVER (PARTITION BY {part} ORDER BY {_J}) AS __n FROM a_in) "
            f"SELECT r.{_I} AS i, a.{_J} AS j, ({same}) AS move FROM r JOIN a ON {on} AND r.__n = a.__n ORDER BY j"
        ).fetchnumpy()
    finally:
        con.close()
    return Pairs(np.asarray(found["i"], np.int64), np.asarray(found["j"], np.int64), np.asarray(found["move"], bool))
