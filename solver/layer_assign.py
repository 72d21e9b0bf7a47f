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
ASSIGN_DUAL_ROUNDS = 4  # dual rounds of :meth:`StageCostTable.order_free`'s last memory test
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


@dataclass(frozen=True, slots=True)
class _Kind:
    """A stage of one (node, TP) anywhere in a pipeline of K stages: its seconds per layer and least
    fixed seconds over every position and successor, its most layers at each position, their
    maximum and minimum, and the most micro-batches in flight at a position where it holds
    min_layers (−1: none)."""

    time1: float
    time0: float
    caps: tuple[int, ...]
    most: int
    least: int
    tolerant: int


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
        self._kinds: dict[tuple, _Kind] = {}  # :meth:`_kind`
        self._need: dict[tuple[int, int], list[int]] = {}  # :meth:`_inflight`

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

    def _kind(self, node: int, tp: int, num_stages: int, micro_batches: int, mem_micro_batches: int,
              min_layers: int) -> _Kind:
        """A stage of this (node, TP) anywhere in a pipeline of ``num_stages`` (:class:`_Kind`)."""
        key = (node, tp, num_stages, micro_batches, mem_micro_batches, min_layers)
        hit = self._kinds.get(key)
        if hit is None:
            K, L = num_stages, self.problem.model.layers
            nodes = range(len(self.problem.cluster.nodes))
            timed = [self.probe(node, tp, k, K, micro_batches, nxt)
                     for k in sorted({0, min(1, K - 1), K - 1})
                     for nxt in ((None,) if k == K - 1 else nodes)]
            caps = tuple(min(L, self.probe(node, tp, k, K, mem_micro_batches, None if k == K - 1 else node).max_layers())
                         for k in range(K))
            tolerant = max((cost.inflight_microbatches(self.problem.schedule, k, K, mem_micro_batches)
                            for k in range(K) if caps[k] >= min_layers), default=-1)
            hit = self._kinds[key] = _Kind(time1=min(p.time1 for p in timed), time0=min(p.time0 for p in timed),
                                           caps=caps, most=max(caps), least=min(caps),
                                           tolerant=tolerant)
        return hit

    def fits_in_order(self, kinds: Sequence[tuple[int, int]], micro_batches: int, mem_micro_batches: int,
                      min_layers: int = 1) -> bool:
        """Whether memory admits these stages ((node, TP) each) in this order: each holds
        min_layers at its position and together they hold the L layers (what :func:`assign_layers`
        needs of its caps, without the layout)."""
        K, L = len(kinds), self.problem.model.layers
        caps = [self._kind(n, t, K, micro_batches, mem_micro_batches, min_layers).caps[k]
                for k, (n, t) in enumerate(kinds)]
        return K * min_layers <= L and min(caps) >= min_layers and sum(caps) >= L

    def order_free(self, kinds: Sequence[tuple[int, int]], micro_batches: int, mem_micro_batches: int,
                   min_layers: int = 1) -> tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]] | None:
        """These stages ((node, TP) each) relaxed so that no order of them is cheaper: per stage its
        seconds per layer, its least fixed seconds and its most layers over every position and
        successor. :func:`assign_layers` on them is a lower bound on the pipeline time of every
        order (its formula does not depend on the order). None where memory admits no order:

        * a stage holds min_layers nowhere, or the stages' most layers sum to less than L;
        * Hall's condition: admit each stage wherever no more micro-batches are in flight than at its
          most loaded admissible position (a superset of where it fits); the sets are nested, so
          some order gives every position a stage that holds min_layers only if the i-th most
          tolerant stage takes at least the i-th largest in-flight count (deep 1F1B pipelines
          without recompute fail here);
        * the most layers of any stage-to-position assignment is at most Σ row + Σ column of any
          feasible dual of the assignment LP (r_s + q_k ≥ caps[s, k], both free): a few rounds of
          coordinate descent from the column maxima (only where the stages' least layers anywhere
          do not already sum to L)."""
        K, L = len(kinds), self.problem.model.layers
        if K == 0 or K * min_layers > L:
            return None
        rows = [self._kind(n, t, K, micro_batches, mem_micro_batches, min_layers) for n, t in kinds]
        if min(r.most for r in rows) < min_layers or sum(r.most for r in rows) < L:
            return None
        need = self._inflight(K, mem_micro_batches)
        if any(a < b for a, b in zip(sorted((r.tolerant for r in rows), reverse=True), need)):
            return None
        if sum(r.least for r in rows) < L and self._dual_room(rows) < L:
            return None
        return (tuple(r.time1 for r in rows), tuple(r.time0 for r in rows), tuple(r.most for r in rows))

    @staticmethod
    def _dual_room(rows: Sequence[_Kind]) -> float:
        """An upper bound on the layers these stages hold together in any order: Σ r + Σ q of a
        feasible dual of the assignment LP (r_s + q_k ≥ caps[s, k])."""
        caps = np.array([r.caps for r in rows], dtype=float)
        q = caps.max(axis=0)
        r = np.zeros(len(rows))
        for _ in range(ASSIGN_DUAL_ROUNDS):
            r = (caps - q[None, :]).max(axis=1)
            q = (caps - r[:, None]).max(axis=0)
        return float(r.sum() + q.sum())

    def _inflight(self, num_stages: int, mem_micro_batches: int) -> list[int]:
        """In-flight micro-batch counts of the positions of a pipeline, largest first (remembered)."""
        key = (num_stages, mem_micro_batches)
        if key not in self._need:
            self._need[key] = sorted((cost.inflight_microbatches(self.problem.schedule, k, num_stages,
                                                                 mem_micro_batches) for k in range(num_stages)),
                                     reverse=True)
        return self._need[key]


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
