"""The outer search over pipeline counts: which counts exist, and in which order they are scored
(a pure policy over a ``score(P)`` callback, so it is tested on made-up landscapes)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["coarse_indices", "pipeline_counts", "search_counts"]


def pipeline_counts(pmax: int) -> list[int]:
    """Pipeline counts the outer search visits: every P ≤ 8, then steps of about 25 % and every power
    of two (the even splits of power-of-two nodes) up to ``pmax``.

    >>> pipeline_counts(20)
    [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16, 19, 20]
    """
    out = list(range(1, min(8, pmax) + 1))
    while out[-1] < pmax:
        out.append(min(pmax, max(out[-1] + 1, round(out[-1] * 1.25))))
    return sorted(set(out) | {1 << k for k in range(pmax.bit_length()) if 1 << k <= pmax})


def coarse_indices(counts: Sequence[int]) -> list[int]:
    """Indices into ``counts`` of the sweep's coarse pass: the powers of two.

    >>> [pipeline_counts(326)[i] for i in coarse_indices(pipeline_counts(326))]
    [1, 2, 4, 8, 16, 32, 64, 128, 256]
    """
    return [i for i, P in enumerate(counts) if P & (P - 1) == 0]


def search_counts(counts: Sequence[int], score: Callable[[int], float | None], patience: int) -> list[int]:
    """The outer search's order over the pipeline counts ``counts`` (ascending); ``score(P)`` scores
    P's candidates and gives their best time (``inf``: none), or None when time ran out, which ends
    the search. Three passes, each count scored at most once:

    1. *coarse*: the powers of two (:func:`coarse_indices`), until one fails to improve the best
       time found;
    2. *fine*: the counts between the best coarse count's two coarse neighbours, first those on the
       side of the better neighbour, nearest first;
    3. *ascending*: the paper's sweep, stopping after ``patience`` counts without improving its own
       running best (counts already scored count by their results).

    Passes 1-2 reach the large pipeline counts of a large cluster early, so a time limit cuts the
    search near its best count (gen-512: its best count, 64, is scored within 7.5 s, where P = 1-8
    alone take ~4 s); pass 3 then scores every count the ascending sweep alone would on the same
    scores, so the first two passes add counts and take none away. Returns the counts scored, in order."""
    got: dict[int, float] = {}

    def visit(P: int) -> bool:
        t = score(P)
        if t is None:
            return False
        got[P] = t
        return True

    def best() -> float:
        return min(got.values(), default=math.inf)

    coarse, win = coarse_indices(counts), None
    for j, i in enumerate(coarse):
        before = best()
        if not visit(counts[i]):
            return list(got)
        if best() < before:
            win = j
        elif win is not None:
            break                                   # a coarse step without improvement
    if win is not None:
        lo = coarse[win - 1] if win > 0 else -1
        hi = coarse[win + 1] if win + 1 < len(coarse) else len(counts)
        # the side of the better coarse neighbour first (the valley is likelier there), nearest first
        up = hi < len(counts) and (lo < 0 or got[counts[hi]] < got[counts[lo]])
        for i in sorted(range(lo + 1, hi), key=lambda i: ((i > coarse[win]) != up, abs(i - coarse[win]))):
            if counts[i] not in got and not visit(counts[i]):
                return list(got)
    run_best, run_i = math.inf, 0
    for i, P in enumerate(counts):
        if run_best < math.inf and i - run_i > patience:
            break                                   # no improvement for ``patience`` pipeline counts
        if P not in got and not visit(P):
            break
        if got[P] < run_best:
            run_best, run_i = got[P], i
    return list(got)
