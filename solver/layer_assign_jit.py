""":func:`.layer_assign.assign_layers` compiled with numba: the same scan, as plain loops.

The numpy form builds every candidate bottleneck's caps and fills as arrays; at a few hundred
candidates and K ≤ 16 stages its cost is the numpy calls themselves (~0.3 ms per layout), and
HexiScale's phase 2 asks for ten thousand layouts on a 56-GPU cluster (half of its time on
hexiscale-het3). Here one layout is a few microseconds. Same candidates in the same (ascending)
order, the same rounding of the caps and the same greedy fill, so both return the same counts; the
numpy form stays the oracle (tests/test_planner_heuristics.py compares them) and the default where
numba is not installed or the problem is small (importing numba costs ~0.5 s).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .kernels import AVAILABLE, Kernel, signature
from .layer_assign import TIE_REL

__all__ = ["AVAILABLE", "assign_layers_compiled"]


def _scan(a: np.ndarray, b: np.ndarray, cap: np.ndarray, layers: int, micro_batches: int,
          lo: int) -> tuple[np.ndarray, float]:
    """Best counts (empty: none fits) and their pipeline time; ``cap`` already clipped to ``layers``.
    Candidates in any order, and among times within TIE_REL of the least the lowest bottleneck wins —
    the numpy form's choice over its sorted candidates; plain loops only (no sort, no np.unique),
    which numba compiles in a fraction of the time."""
    K = a.shape[0]
    none = np.empty(0, np.int64)
    total_cap = 0
    for k in range(K):
        if cap[k] < lo:
            return none, np.inf
        total_cap += cap[k]
    if K == 0 or K * lo > layers or total_cap < layers:
        return none, np.inf
    order = np.empty(K, np.int64)            # stable insertion sort by a: the numpy form's fill order
    for i in range(K):
        j = i
        while j > 0 and a[order[j - 1]] > a[i]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    n = K * layers
    ub = np.empty(K, np.int64)
    cnt = np.empty(K, np.int64)
    obj = np.full(n, np.inf)
    spare = layers - K * lo
    pick = -1
    for phase in range(2):                    # 0: every candidate's time; 1: the counts of the pick again
        for c in range(0, n) if phase == 0 else range(pick, pick + 1):
            U = (c % layers + 1) * a[c // layers] + b[c // layers]   # candidate bottleneck: a stage's time
            total, ok = 0, True
            for k in range(K):
                if a[k] > 0:
                    x = np.floor((U - b[k]) / a[k] + 1e-9)
                    u = cap[k] if x >= cap[k] else int(x)
                else:
                    u = min(layers, cap[k])
                if u < lo:
                    ok = False
                    break
                ub[k] = u
                total += u
            if not ok or total < layers:
                continue
            before = 0
            for i in range(K):                # cheapest stages first, each up to its cap
                k = order[i]
                extra = ub[k] - lo
                take = min(max(spare - before, 0), extra)
                cnt[k] = take + lo
                before += extra
            umax, usum = -np.inf, 0.0
            for k in range(K):
                t = cnt[k] * a[k] + b[k]
                usum += t
                umax = max(umax, t)
            obj[c] = (micro_batches - 1) * umax + usum
        if phase == 0:
            least = obj.min()
            if least == np.inf:
                return none, np.inf
            best_u = np.inf
            for c in range(n):                # within TIE_REL of the least: the lowest bottleneck
                if obj[c] <= least + TIE_REL * abs(least):
                    U = (c % layers + 1) * a[c // layers] + b[c // layers]
                    if U < best_u:
                        best_u, pick = U, c
    return cnt.copy(), obj[pick]


_scan_compiled = Kernel(_scan, (signature("f1 f1 i1 i i i"),))


def assign_layers_compiled(time1: Sequence[float], time0: Sequence[float], caps: Sequence[int], layers: int,
                           micro_batches: int, min_layers: int = 1) -> tuple[tuple[int, ...], float] | None:
    """:func:`.layer_assign.assign_layers` (same arguments, same result) on the compiled scan."""
    cap = np.minimum(np.array(caps, np.int64), layers)
    counts, t = _scan_compiled(np.array(time1, float), np.array(time0, float), cap, int(layers), int(micro_batches),
                          int(min_layers))
    if counts.shape[0] == 0:
        return None
    return tuple(int(x) for x in counts), float(t)
