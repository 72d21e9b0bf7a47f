"""DHelix's dynamic program for segment pairing (paper Eq. 2, shared/reference/dhelix.md §2.4).

Two equivalent implementations over a :class:`~hexhelix.solver.pairing_costs.CostTable`:

* :func:`pairing_dp` — Eq. 2 with the segmentation folded into the recursion: the state (x, y)
  is "the first x forward ops and the first y backward ops are done, barrier here", and

      T(x', y') = min{ T(x, y') + P(f[x:x'], ∅),          (forward segment alone)
                       T(x', y) + P(∅, b[y:y']),          (backward segment alone)
                       T(x, y)  + P(f[x:x'], b[y:y']) }   (co-execute, legal pairs only)

  over every candidate segment ending at x' (resp. y'). Ties go toward *not* pairing (forward
  alone, then backward alone, then pair — the authors' order). O(|segments_f|·|segments_b|).
* :func:`pairing_dp_enumerate` — the paper's procedure literally: enumerate every pair of
  segmentations (refinements of the base groups, §2.3), run Eq. 2 on each, keep the best. It
  visits exactly the same plans, so both return the same optimum; the first is the one used,
  the second is kept as a check (exponential in the optional cut points).

Both charge a barrier after every block: the plan cost is the sum of its block costs.
"""

from __future__ import annotations

import itertools
import math

from .pairing_costs import CostTable

__all__ = ["Edge", "pairing_dp", "pairing_dp_enumerate", "path_cost"]

Seg = tuple[int, int]
Edge = tuple[Seg | None, Seg | None]   # (forward segment or None, backward segment or None)


def pairing_dp(table: CostTable) -> tuple[float, list[Edge]]:
    """Optimal barrier plan over the table's candidate segments.

    Parameters
    ----------
    table : block costs P over candidate segments (see :func:`build_cost_table`).

    Returns
    -------
    (cost, blocks) : minimal Σ P and the blocks in execution order, each a pair (forward
        segment [a, b) or None, backward segment [c, d) or None). ``cost`` is inf when the
        segments cannot cover a strand.

    Examples
    --------
    >>> t = CostTable(nf=1, nb=1, fwd_segs=[(0, 1)], bwd_segs=[(0, 1)], alone_f={(0, 1): 2.0},
    ...               alone_b={(0, 1): 3.0}, pair={((0, 1), (0, 1)): 3.5})
    >>> pairing_dp(t)
    (3.5, [((0, 1), (0, 1))])

    References
    ----------
    DHelix (arXiv 2411.15871) Eq. 2; shared/reference/dhelix.md §2.4.
    """
    nf, nb = table.nf, table.nb
    f_end: dict[int, list[Seg]] = {}
    b_end: dict[int, list[Seg]] = {}
    for s in table.fwd_segs:
        f_end.setdefault(s[1], []).append(s)
    for s in table.bwd_segs:
        b_end.setdefault(s[1], []).append(s)
    INF = math.inf
    T = [[INF] * (nb + 1) for _ in range(nf + 1)]
    back: list[list[Edge | None]] = [[None] * (nb + 1) for _ in range(nf + 1)]
    T[0][0] = 0.0
    for x in range(nf + 1):
        for y in range(nb + 1):
            if x == y == 0:
                continue
            best, arg = INF, None
            for s in f_end.get(x, ()):
                v = T[s[0]][y] + table.alone_f[s]
                if v < best:
                    best, arg = v, (s, None)
            for s in b_end.get(y, ()):
                v = T[x][s[0]] + table.alone_b[s]
                if v < best:
                    best, arg = v, (None, s)
            for sf in f_end.get(x, ()):
                for sb in b_end.get(y, ()):
                    c = table.pair.get((sf, sb))
                    if c is not None:
                        v = T[sf[0]][sb[0]] + c
                        if v < best:
                            best, arg = v, (sf, sb)
            T[x][y], back[x][y] = best, arg
    if T[nf][nb] == INF:
        return INF, []
    path: list[Edge] = []
    x, y = nf, nb
    while (x, y) != (0, 0):
        e = back[x][y]
        assert e is not None
        path.append(e)
        x = e[0][0] if e[0] else x
        y = e[1][0] if e[1] else y
    path.reverse()
    return path_cost(table, path), path


def path_cost(table: CostTable, path: list[Edge]) -> float:
    """Σ P over the blocks of ``path``, summed in execution order (so equal plans give bit-equal sums)."""
    total = 0.0
    for f, b in path:
        total += table.pair[(f, b)] if f and b else (table.alone_f[f] if f else table.alone_b[b])
    return total


def _segmentations(n: int, segs: list[Seg]) -> list[list[Seg]]:
    by_start: dict[int, list[Seg]] = {}
    for s in segs:
        by_start.setdefault(s[0], []).append(s)
    out: list[list[Seg]] = []

    def rec(pos: int, acc: list[Seg]) -> None:
        if pos == n:
            out.append(list(acc))
            return
        for s in by_start.get(pos, ()):
            acc.append(s)
            rec(s[1], acc)
            acc.pop()

    rec(0, [])
    return out


def pairing_dp_enumerate(table: CostTable, limit: int = 1 << 16) -> tuple[float, list[Edge]]:
    """The paper's search: every (forward, backward) segmentation pair, Eq. 2 on each.

    Raises
    ------
    ValueError
        if the number of segmentation pairs exceeds ``limit`` (use :func:`pairing_dp`).
    """
    sfs, sbs = _segmentations(table.nf, table.fwd_segs), _segmentations(table.nb, table.bwd_segs)
    if len(sfs) * len(sbs) > limit:
        raise ValueError(f"{len(sfs)} x {len(sbs)} segmentation pairs exceed the limit {limit}")
    best, best_path = math.inf, []
    for Sf, Sb in itertools.product(sfs, sbs):
        cost, path = _eq2(table, Sf, Sb)
        if cost < best:
            best, best_path = cost, path
    return best, best_path


def _eq2(table: CostTable, Sf: list[Seg], Sb: list[Seg]) -> tuple[float, list[Edge]]:
    """Eq. 2 on fixed segmentations: T(i, j) over segment counts, ties toward not pairing."""
    INF = math.inf
    nf, nb = len(Sf), len(Sb)
    T = [[INF] * (nb + 1) for _ in range(nf + 1)]
    back: list[list[Edge | None]] = [[None] * (nb + 1) for _ in range(nf + 1)]
    T[0][0] = 0.0
    for i in range(nf + 1):
        for j in range(nb + 1):
            if i == j == 0:
                continue
            best, arg = INF, None
            if i and T[i - 1][j] + table.alone_f[Sf[i - 1]] < best:
                best, arg = T[i - 1][j] + table.alone_f[Sf[i - 1]], (Sf[i - 1], None)
            if j and T[i][j - 1] + table.alone_b[Sb[j - 1]] < best:
                best, arg = T[i][j - 1] + table.alone_b[Sb[j - 1]], (None, Sb[j - 1])
            if i and j:
                c = table.pair.get((Sf[i - 1], Sb[j - 1]))
                if c is not None and T[i - 1][j - 1] + c < best:
                    best, arg = T[i - 1][j - 1] + c, (Sf[i - 1], Sb[j - 1])
            T[i][j], back[i][j] = best, arg
    path: list[Edge] = []
    i, j = nf, nb
    while (i, j) != (0, 0):
        e = back[i][j]
        assert e is not None
        path.append(e)
        i, j = i - (e[0] is not None), j - (e[1] is not None)
    path.reverse()
    return path_cost(table, path), path
