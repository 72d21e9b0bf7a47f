"""Top-τ greedy path search: the order in which a pipeline visits its parts (HexiScale phase 2).

HexiScale (arXiv 2409.01143 §3; shared/reference/hexiscale.md §3.3 step 3) orders the coarsened
parts of a pipeline along a Hamiltonian path of high bandwidth: from every start, and for every
selection vector in {0..τ−1}^(n−1), walk to the k-th best unvisited neighbour; score a path by the
sum of its edge bandwidths.

The released code then (a) chose the path with the **minimum** score across starts and (b) applied
the path as ranks, i.e. the inverse permutation. :func:`top_tau_paths` / :func:`best_stage_order`
maximise bandwidth and return the visiting order itself; :func:`released_stage_order` reproduces
both quirks for the released-planner baseline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

__all__ = ["best_stage_order", "path_score", "released_stage_order", "top_tau_paths"]

_MAX_PATHS = 5000


def path_score(weights: Sequence[Sequence[float]], path: Sequence[int]) -> float:
    """Sum of ``weights[a][b]`` over consecutive parts of ``path``.

    >>> path_score([[0, 5, 1], [5, 0, 2], [1, 2, 0]], [0, 1, 2])
    7
    """
    return sum(weights[a][b] for a, b in itertools.pairwise(path))


def _effective_tau(n: int, tau: int) -> int:
    while tau > 1 and n * tau ** (n - 1) > _MAX_PATHS:
        tau -= 1
    return tau


def _ranked(weights: Sequence[Sequence[float]]) -> list[list[int]]:
    """Per part, the other parts by decreasing weight (ties by index)."""
    n = len(weights)
    return [sorted((v for v in range(n) if v != u), key=lambda v: (-weights[u][v], v)) for u in range(n)]


def _walk(ranked: list[list[int]], start: int, choice: Sequence[int]) -> list[int]:
    """Follow ``choice``: at each step the k-th best unvisited neighbour (the last one if fewer)."""
    path, seen = [start], {start}
    for k in choice:
        cand = [v for v in ranked[path[-1]] if v not in seen]
        nxt = cand[min(k, len(cand) - 1)]
        path.append(nxt)
        seen.add(nxt)
    return path


def top_tau_paths(weights: Sequence[Sequence[float]], tau: int = 3) -> list[tuple[float, tuple[int, ...]]]:
    """All distinct top-τ greedy Hamiltonian paths, best (highest bandwidth sum) first.

    Parameters
    ----------
    weights : n × n matrix of float
        Symmetric edge weights (bandwidth between parts; higher is better).
    tau : int
        At each step consider the τ best unvisited neighbours (``--kway``, default 3). When
        n·τ^(n−1) exceeds 5 000 paths, τ is lowered until it fits (τ = 1 is plain greedy).

    Returns
    -------
    list of (score, path)
        Sorted by score descending, then lexicographically (deterministic).

    Examples
    --------
    >>> w = [[0, 1, 9], [1, 0, 2], [9, 2, 0]]
    >>> top_tau_paths(w, 2)[0]
    (11, (0, 2, 1))

    References
    ----------
    HexiScale arXiv 2409.01143 §3 (shared/reference/hexiscale.md §3.3, ``get_stage_order``).
    """
    n = len(weights)
    if n == 0:
        return []
    if n == 1:
        return [(0.0, (0,))]
    t = _effective_tau(n, max(1, tau))
    ranked = _ranked(weights)
    found: list[tuple[float, tuple[int, ...]]] = []
    for start in range(n):
        _extend(ranked, weights, t, [start], {start}, 0, found)
    return sorted(found, key=lambda sp: (-sp[0], sp[1]))


def _extend(ranked: list[list[int]], weights: Sequence[Sequence[float]], t: int, path: list[int], seen: set[int],
            score: float, found: list[tuple[float, tuple[int, ...]]]) -> None:
    """Every completion of ``path`` by top-``t`` steps, each distinct path once: a choice k beyond
    the unvisited neighbours left takes the last one, the same path as the last k that fits, so each
    step branches over the first min(t, left) of them (what :func:`_walk` over every choice gives);
    the score adds edges in path order, as :func:`path_score` does."""
    if len(path) == len(ranked):
        found.append((score, tuple(path)))
        return
    u = path[-1]
    left = [v for v in ranked[u] if v not in seen]
    for v in left[:t]:
        path.append(v)
        seen.add(v)
        _extend(ranked, weights, t, path, seen, score + weights[u][v], found)
        seen.discard(v)
        path.pop()


def best_stage_order(weights: Sequence[Sequence[float]], tau: int = 3) -> tuple[int, ...]:
    """The highest-bandwidth top-τ path (the fixed ``get_stage_order``): part indices in visiting order.

    >>> best_stage_order([[0, 1, 9], [1, 0, 2], [9, 2, 0]])
    (0, 2, 1)
    """
    return top_tau_paths(weights, tau)[0][1]


def released_stage_order(weights: Sequence[Sequence[float]], tau: int = 3) -> tuple[int, ...]:
    """Reproduction of the released ``get_stage_order`` with its two defects (baseline only).

    Per start it keeps the best (max-score) path, then takes the start whose best path has the
    **minimum** score, and returns ``argsort(path)`` — the ranks, i.e. the inverse permutation.

    >>> released_stage_order([[0, 1, 9], [1, 0, 2], [9, 2, 0]])  # min-start path (2, 0, 1), inverted
    (1, 2, 0)
    """
    n = len(weights)
    if n <= 1:
        return tuple(range(n))
    t = _effective_tau(n, max(1, tau))
    per_start: list[tuple[float, tuple[int, ...]]] = []
    ranked = _ranked(weights)
    for start in range(n):
        best: tuple[float, tuple[int, ...]] | None = None
        for choice in itertools.product(range(t), repeat=n - 1):
            path = tuple(_walk(ranked, start, choice))
            s = path_score(weights, path)
            if best is None or s > best[0]:
                best = (s, path)
        assert best is not None
        per_start.append(best)
    path = min(per_start, key=lambda sp: sp[0])[1]   # the argmin-across-starts defect
    return tuple(sorted(range(n), key=lambda i: path[i]))  # the inverse-permutation defect
