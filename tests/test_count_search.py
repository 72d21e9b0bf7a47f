"""The outer search over pipeline counts (hexiscale's sweep): the counts it may visit and the order it
scores them in, checked on made-up landscapes against the paper's ascending sweep."""

from __future__ import annotations

import doctest
import math
import random

import pytest
from hexhelix.solver import count_search


def _ascending_sweep(counts, times, patience):
    """The paper's sweep alone: counts in order, stopping ``patience`` counts after its last improvement."""
    seen, best, best_i = [], math.inf, 0
    for i, P in enumerate(counts):
        if best < math.inf and i - best_i > patience:
            break
        seen.append(P)
        if times[P] < best:
            best, best_i = times[P], i
    return seen


def _scorer(times, budget=None):
    calls = []

    def score(P):
        if budget is not None and len(calls) >= budget:
            return None
        calls.append(P)
        return times[P]
    return score, calls


@pytest.mark.parametrize("pmax", [1, 3, 8, 20, 64, 326])
def test_the_count_search_scores_every_count_the_ascending_sweep_would_and_each_once(pmax):
    counts = count_search.pipeline_counts(pmax)
    rng = random.Random(pmax)
    for _ in range(200):
        times = {P: rng.choice([math.inf, rng.uniform(1, 10)]) for P in counts}
        score, calls = _scorer(times)
        visited = count_search.search_counts(counts, score, patience=4)
        assert visited == calls and len(set(calls)) == len(calls)
        assert set(_ascending_sweep(counts, times, 4)) <= set(calls)


def test_the_count_search_finds_a_best_count_beyond_the_ascending_sweeps_patience():
    # gen-64's landscape over the counts without powers of two (hexiscale's best time per count,
    # Llama-2 7B, before phase 2 re-split for the allocated micro-batches): a dip at 3, the best at 8
    times = {1: 3.347, 2: 2.979, 3: 2.876, 4: 2.894, 5: 2.930, 6: 2.941, 7: 2.985, 8: 2.803, 10: 2.913,
             12: 2.940, 15: 3.401}
    counts = count_search.pipeline_counts(15)
    assert 8 not in _ascending_sweep(counts, times, 4)
    score, _ = _scorer(times)
    assert 8 in count_search.search_counts(counts, score, patience=4)


def test_a_cut_count_search_reaches_the_large_counts_of_a_large_cluster_first():
    counts = count_search.pipeline_counts(326)
    assert [counts[i] for i in count_search.coarse_indices(counts)] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    times = {P: abs(math.log(P / 38)) + 1 for P in counts}   # one valley, at 38 pipelines
    score, _ = _scorer(times, budget=9)
    visited = count_search.search_counts(counts, score, patience=4)
    assert visited == [1, 2, 4, 8, 16, 32, 64, 38, 48]       # coarse until 64 fails, then 32..64 first
    assert counts.index(38) > 9                               # where the ascending sweep gets in 9 counts


def test_the_docstring_examples_hold():
    assert doctest.testmod(count_search).failed == 0
