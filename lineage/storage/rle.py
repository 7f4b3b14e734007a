"""Run-length encodings of per-row lineage columns.

Two kinds of run are used:

* *value runs* ``(value, length)``: ``length`` rows carry the same value
  (created and updated versions);
* *sequence runs* ``(start, length)``: ``length`` rows carry ``start``,
  ``start + 1``, ... (row ids, which a fresh append assigns consecutively).

A fresh append of any size is therefore one run per column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lineage.arrays import unique


@dataclass(frozen=True)
class Runs:
    """A run-length encoded int64 column: parallel arrays of values and lengths."""

    values: np.ndarray
    lengths: np.ndarray

    @property
    def total(self) -> int:
        """Number of rows the runs cover."""
        return int(self.lengths.sum())

    def __len__(self) -> int:
        return len(self.values)


def _as_int64(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def encode_values(values: object) -> Runs:
    """Encode a column as runs of equal values."""
    arr = _as_int64(values)
    if arr.size == 0:
        return Runs(arr, arr.copy())
    breaks = np.flatnonzero(arr[1:] != arr[:-1]) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [arr.size])))
    return Runs(arr[starts], lengths.astype(np.int64))


def encode_sequence(values: object) -> Runs:
    """Encode a column as runs of consecutive integers (``x, x+1, x+2, ...``)."""
    arr = _as_int64(values)
    if arr.size == 0:
        return Runs(arr, arr.copy())
    breaks = np.flatnonzero(arr[1:] != arr[:-1] + 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [arr.size])))
    return Runs(arr[starts], lengths.astype(np.int64))


def decode_values(runs: Runs) -> np.ndarray:
    """Expand value runs back into one value per row."""
    return np.repeat(runs.values, runs.lengths)


def decode_sequence(runs: Runs) -> np.ndarray:
    """Expand sequence runs back into one value per row."""
    if len(runs) == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.arange(runs.total, dtype=np.int64)
    run_first_pos = np.repeat(np.cumsum(runs.lengths) - runs.lengths, runs.lengths)
    return np.repeat(runs.values, runs.lengths) + (offsets - run_first_pos)


def sequence_run(start: int, length: int) -> Runs:
    """One sequence run ``start .. start + length - 1`` (a fresh append)."""
    return Runs(np.array([start], dtype=np.int64), np.array([length], dtype=np.int64))


def value_run(value: int, length: int) -> Runs:
    """One value run of ``length`` copies of ``value``."""
    return Runs(np.array([value], dtype=np.int64), np.array([length], dtype=np.int64))


def combined_breakpoints(row_ids: Runs, created: Runs, updated: Runs) -> tuple[np.ndarray, ...]:
    """Merge three encodings into runs on which all three are "simple".

    Returns ``(pos_start, row_id_start, created, updated)`` arrays: from
    ``pos_start`` up to the next start, row ids increase by one per position
    and both versions are constant. This is the shape an ASOF join needs.
    """
    bounds = [np.cumsum(r.lengths) - r.lengths for r in (row_ids, created, updated)]
    # Each bounds array is sorted and unique and starts at 0. A file written by one commit has one run of
    # `updated` (and often of `created`): those add no break, and the union is the other array as it is.
    several = [b for b in bounds if len(b) > 1]
    pos_start = several[0] if len(several) == 1 else unique(np.concatenate(several or bounds[:1]))

    def lookup(runs: Runs, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each of pos_start: the start of the run holding it, and the run's value."""
        if len(starts) == len(pos_start):  # starts is a subset of pos_start, so the same array
            return starts, runs.values
        if len(starts) == 1:
            return np.zeros(len(pos_start), np.int64), np.full(len(pos_start), runs.values[0], np.int64)
        idx = np.searchsorted(starts, pos_start, side="right") - 1
        return starts[idx], runs.values[idx]

    rid_first, rid_vals = lookup(row_ids, bounds[0])
    row_id_start = rid_vals + (pos_start - rid_first)
    _, created_vals = lookup(created, bounds[1])
    _, updated_vals = lookup(updated, bounds[2])
    return pos_start, row_id_start, created_vals, updated_vals
