"""lineage/arrays.py: the sorting helpers give numpy's answers on random and nearly sorted arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lineage.arrays import member, merge_sorted, sort_in_place, stable_argsort, unique


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 40), st.integers(1, 2**40), st.integers(0, 2**32 - 1))
def test_sorts_of_random_and_nearly_sorted_arrays_match_numpy(n, swaps, span, seed):
    """``swaps`` adjacent swaps of a sorted array (nearly sorted: timsort) or a shuffle (numpy's default sort)."""
    rng = np.random.default_rng(seed)
    base = np.sort(rng.integers(-span, span, n))
    for kind in ("nearly", "random"):
        values = base.copy()
        if kind == "random":
            rng.shuffle(values)
        elif n > 1:
            at = rng.integers(0, n - 1, swaps)
            values[at], values[at + 1] = values[at + 1], values[at].copy()
        assert sort_in_place(values.copy()).tolist() == np.sort(values).tolist()
        assert unique(values).tolist() == np.unique(values).tolist()
        assert stable_argsort(values).tolist() == np.argsort(values, kind="stable").tolist()
        probe = rng.integers(-span, span, 50)
        assert member(probe, values).tolist() == np.isin(probe, values).tolist()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 6), max_size=30), max_size=7), st.booleans())
def test_merge_of_sorted_runs_is_the_stable_argsort_of_their_concatenation(runs, unsorted):
    """Equal values (small ones repeat) keep their order in the concatenation, as numpy's stable argsort has them;
    a run out of order is refused (None), never merged wrongly."""
    arrays = [np.sort(np.array(r, np.uint64)) for r in runs]
    if unsorted and any(len(set(r)) > 1 for r in runs):
        i = next(i for i, r in enumerate(runs) if len(set(r)) > 1)
        arrays[i] = arrays[i][::-1].copy()
        assert merge_sorted(arrays) is None
        return
    got = merge_sorted(arrays)
    assert got is not None
    order, values = got
    concatenated = np.concatenate(arrays) if arrays else np.empty(0, np.uint64)
    assert order.tolist() == np.argsort(concatenated, kind="stable").tolist()
    assert values.tolist() == np.sort(concatenated).tolist()
