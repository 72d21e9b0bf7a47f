"""Layer and micro-batch assignment for fixed pipeline shapes: the exact inner steps of the HexiScale
heuristic (:mod:`.hexiscale`), usable on their own.

* :class:`StageCostTable` probes a stage's time and memory from the evaluator as affine functions of
  its layer count;
* :func:`assign_layers` gives the exact minimum of (m−1)·max_k u_k + Σ_k u_k over contiguous layer
  counts with per-stage memory caps (compiled in :mod:`.layer_assign_jit`, this one the oracle);
* :func:`allocate_micro_batches` gives the exact min-max split of the micro-batches over pipelines;
* :func:`tp_splits` lists the compositions of a machine block's GPUs into TP degrees.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from hexhelix.ir.plan import PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from . import cost
from .evaluate import stage_cost

__all__ = ["Stage", "StageCostTable", "StageProbe", "allocate_micro_batches", "assign_layers", "tp_splits", "valid_tp"]

Stage = tuple[int, tuple[int, ...]]  # (node index, GPU ids)
TIE_REL = 1e-12  # layer counts whose pipeline times differ by less (relative) are ties: the first one wins


@dataclass(frozen=True, slots=True)
class StageProbe:
    """The evaluator's stage cost as affine functions of the layer count l:
    u(l) = time0 + l·time1 seconds, memory(l) = mem0 + l·mem1 bytes, against ``capacity`` bytes."""

    time0: float
    time1: float
    mem0: float
    mem1: float
    capacity: float

    def max_layers(self) -> int:
        """Largest l whose memory fits (−1 when even the fixed part does not)."""
        if self.mem0 > self.capacity:
            return -1
        if self.mem1 <= 0:
            return 1 << 30
        lmax = int((self.capacity - self.mem0) / self.mem1)
        while lmax >= 0 and self.mem0 + lmax * self.mem1 > self.capacity:
            lmax -= 1
        return lmax


class StageCostTable:
    """Cached probes of :func:`hexhelix.solver.evaluate.stage_cost` (so no formula is re-derived here).

    Both the stage time and its memory are affine in the layer count for a fixed GPU type, TP
    degree, position, successor and in-flight count; two evaluator calls (l = 0, 1) give them.
    """

    def __init__(self, problem: PlanProblem, profile: Profile = DEFAULT_PROFILE):
        self.problem, self.profile = problem, profile
        self._time: dict[tuple, tuple[float, float, float]] = {}
        self._mem: dict[tuple, tuple[float, float]] = {}
        self._cache: dict[tuple, StageProbe] = {}

    def probe(self, node: int, tp: int, index: int, num_stages: int, micro_batches: int,
              next_node: int | None) -> StageProbe:
        """Time depends on (GPU, TP, end stage?, successor), memory on (GPU, TP, end stage?, in-flight
        count); each half is cached on its own key (checked against the evaluator in the tests)."""
        infl = cost.inflight_microbatches(self.problem.schedule, index, num_stages, micro_batches)
        first, last = index == 0, index == num_stages - 1
        key = (node, tp, first, last, next_node, infl)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        tkey, mkey = (node, tp, first, last, next_node), (node, tp, first, last, infl)
        if tkey not in self._time or mkey not in self._mem:
            gpus = tuple(range(tp))
            nxt = StagePlan(node=next_node, gpus=(0,), layers=(0, 1)) if next_node is not None else None
            c0, c1 = (stage_cost(self.problem, StagePlan(node=node, gpus=gpus, layers=(0, n)), index, num_stages,
                                 micro_batches, nxt, self.profile) for n in (0, 1))
            self._time[tkey] = (c0.time, c1.time - c0.time, c0.capacity_bytes)
            self._mem[mkey] = (c0.memory_bytes, c1.memory_bytes - c0.memory_bytes)
        t0, t1, capacity = self._time[tkey]
        m0, m1 = self._mem[mkey]
        p = StageProbe(time0=t0, time1=t1, mem0=m0, mem1=m1, capacity=capacity)
        self._cache[key] = p
        return p

    def probes(self, stages: Sequence[Stage], micro_batches: int) -> list[StageProbe]:
        n = len(stages)
        return [self.probe(node, len(g), k, n, micro_batches, stages[k + 1][0] if k + 1 < n else None)
                for k, (node, g) in enumerate(stages)]


def assign_layers(time1: Sequence[float], time0: Sequence[float], caps: Sequence[int], layers: int,
                  micro_batches: int, min_layers: int = 1) -> tuple[tuple[int, ...], float] | None:
    """Exact contiguous layer counts minimising the pipeline time (m−1)·max_k u_k + Σ_k u_k.

    Parameters
    ----------
    time1, time0 : per-stage seconds per layer and fixed seconds (u_k = l_k·time1_k + time0_k).
    caps : per-stage maximum layer count (memory).
    layers : L, the model's layers; every stage gets min_layers ≤ l_k ≤ caps_k and Σ l_k = L.
    micro_batches : m of the pipeline.
    min_layers : 1, or 2 under W-shape folding (each stage holds a down-leg and an up-leg layer).

    Returns
    -------
    (counts, pipeline_time) or None when no assignment fits.

    Notes
    -----
    The optimum's bottleneck U* is one of the values l·time1_k + time0_k. For every candidate U
    (ascending), ub_k = min(caps_k, ⌊(U − time0_k)/time1_k⌋); the minimum Σ u under these upper
    bounds fills layers into the cheapest stages first (exchange argument), so scanning all U is
    exact. Vectorised over U with numpy: O(K·L) candidates × O(K).

    Examples
    --------
    >>> assign_layers([1.0, 2.0], [0.0, 0.0], [10, 10], 6, 4)
    ((4, 2), 20.0)
    """
    a, b = np.asarray(time1, float), np.asarray(time0, float)
    cap = np.minimum(np.asarray(caps, int), layers)
    K = len(a)
    lo = min_layers
    if K == 0 or K * lo > layers or (cap < lo).any() or cap.sum() < layers:
        return None
    cand = np.unique((np.arange(1, layers + 1)[None, :] * a[:, None] + b[:, None]).ravel())
    with np.errstate(divide="ignore", invalid="ignore"):
        ub = np.floor((cand[:, None] - b[None, :]) / np.where(a > 0, a, np.inf)[None, :] + 1e-9)
    ub = np.where(a[None, :] > 0, ub, layers)
    ub = np.minimum(ub, cap[None, :]).astype(int)
    ok = (ub >= lo).all(axis=1) & (ub.sum(axis=1) >= layers)
    if not ok.any():
        return None
    ub = ub[ok]
    order = np.argsort(a, kind="stable")
    extra = ub[:, order] - lo                         # room above the mandatory minimum
    before = np.cumsum(extra, axis=1) - extra
    take = np.clip(layers - K * lo - before, 0, extra)
    cnt = np.empty_like(take)
    cnt[:, order] = take + lo
    u = cnt * a[None, :] + b[None, :]
    obj = (micro_batches - 1) * u.max(axis=1) + u.sum(axis=1)
    # the first (lowest bottleneck) within TIE_REL of the least: equal times in exact arithmetic may
    # differ in the last bit with the order of the sum, and the compiled form must choose alike
    least = obj.min()
    best = int(np.argmax(obj <= least + TIE_REL * abs(least)))
    return tuple(int(x) for x in cnt[best]), float(obj[best])


def allocate_micro_batches(bottleneck: Sequence[float], total: Sequence[float], num_micro_batches: int,
                           max_micro_batches: Sequence[int] | None = None) -> list[int] | None:
    """Split N micro-batches over pipelines minimising max_p (m_p − 1)·U_p + S_p, 1 ≤ m_p ≤ max_p.

    Each pipeline time is increasing in m_p, so handing the next micro-batch to the pipeline whose
    time after taking it is smallest is exact for the min-max (a standard greedy argument).

    Examples
    --------
    >>> allocate_micro_batches([1.0, 3.0], [4.0, 12.0], 8)
    [7, 1]
    """
    P = len(bottleneck)
    mx = list(max_micro_batches) if max_micro_batches is not None else [num_micro_batches] * P
    if P == 0 or P > num_micro_batches or any(x < 1 for x in mx) or sum(mx) < num_micro_batches:
        return None
    m = [1] * P
    heap = [(total[p] + bottleneck[p], p) for p in range(P) if mx[p] > 1]
    heapq.heapify(heap)
    for _ in range(num_micro_batches - P):
        t, p = heapq.heappop(heap)
        m[p] += 1
        if m[p] < mx[p]:
            heapq.heappush(heap, (t + bottleneck[p], p))
    return m


@lru_cache(maxsize=256)
def _compositions(n: int, degrees: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    if n == 0:
        return ((),)
    out = []
    for d in degrees:
        if d <= n:
            out.extend((d, *rest) for rest in _compositions(n - d, tuple(x for x in degrees if x <= d)))
    return tuple(out)


def valid_tp(problem: PlanProblem, n: int) -> list[int]:
    """TP degrees 1 … n that the model admits (they divide its heads)."""
    out = []
    for t in range(1, n + 1):
        try:
            problem.model.check_tp(t)
            out.append(t)
        except ValueError:
            pass
    return out


def tp_splits(n: int, valid_tp: Sequence[int]) -> list[tuple[int, ...]]:
    """Every split of an n-GPU machine block into consecutive TP stages (non-increasing degrees
    from ``valid_tp``), largest TP first; the released menu (reference §3.3) is a subset.

    >>> tp_splits(4, [1, 2, 4])
    [(4,), (2, 2), (2, 1, 1), (1, 1, 1, 1)]
    """
    return list(_compositions(n, tuple(sorted(set(valid_tp), reverse=True))))
