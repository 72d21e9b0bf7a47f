"""A lower bound on plans of one pipeline that counts every node's GPUs (docs/formulation.md §18).

One pipeline runs all M micro-batches in (M−1)·U + S and then its optimizer step (no gradient sync).
Drop the order of its stages: a stage of option c (node n, TP t) with ℓ layers costs at least
u = ℓ·τ_c + its embedding/head time if it is the first/last stage + the cheapest boundary send
leaving n (to another node for one *exit* stage per node that does not hold the last stage; none
for the last stage), holds at most Lmax(c, first, last, 1 in flight) layers, and takes an optimizer
step o affine in its parameters. Under caps U on every u and O on every o the least S is a knapsack
per node — stages of that node within its G_n GPUs, indexed by the layers they hold — joined over
the nodes by layers; the bound is the least over caps of (M−1)·U + S*(U, O) + max(O, the optimizer
floor), searched by branch and bound over boxes of the sorted candidate caps.

Why: the fluid bound's shapes cap each *run* of consecutive stages on a node but may come back to
the node in a later run, and its master mixes such shapes fractionally; with one pipeline that is
most of its gap (hexiscale-het1, LLaMA 30B, which fits only as one pipeline: 17.38 s against a
19.74 s plan, every column of the master using more GPUs of some node than it has)."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from hexhelix.ir.plan import PipelinePlan, Plan, StagePlan

from .candidates import CostTables
from .fluid_bound import optimizer_lower_bound
from .layer_assign import StageCostTable, assign_layers

__all__ = ["CANDIDATES", "REL_TOL", "SinglePipeline", "lay_out", "single_pipeline_bound"]

CANDIDATES = 6  # stage multisets laid out as plans: those of the evaluated caps of least value
REL_TOL = 1e-6  # boxes of caps within this share of the best value are not split (the planner's gap_tol)

# A stage's flags, one bit each: it holds the embedding (1), the head (2), or it is its node's *exit*
# (4): the last stage on a node other than the last stage's sends to another node (a node whose last
# stage in pipeline order were followed by one on the same node would have a later stage there).
FIRST, LAST, EXIT = 1, 2, 4
_STAGE_FLAGS = (0, FIRST, LAST, FIRST | LAST, EXIT, FIRST | EXIT)


class _Stages:
    """Every relaxed stage time u(c, ℓ, flags) of the cluster's options, per node, as arrays over
    ℓ = 0 … L (inf where ℓ = 0 or beyond the memory cap): ℓ·τ_c, the embedding and head where
    flagged, and the send to the next stage at the cheapest link leaving the node — for an exit, the
    cheapest to another node; none for the last stage. Beside it the stage's optimizer step o (exact:
    affine in the parameters it holds)."""

    def __init__(self, tables: CostTables) -> None:
        L = tables.layers
        nodes = range(len(tables.problem.cluster.nodes))
        ell = np.arange(L + 1, dtype=float)
        send = {a: min(tables.comm[(a, b)] for b in nodes) for a in nodes}
        away = {a: min((tables.comm[(a, b)] for b in nodes if b != a), default=math.inf) for a in nodes}
        self.by_node: dict[int, list[tuple[int, int, np.ndarray, np.ndarray]]] = {n: [] for n in nodes}
        times: list[np.ndarray] = []
        steps: list[np.ndarray] = []
        for o in tables.options:
            c = o.index
            for fl in _STAGE_FLAGS:
                f, h = bool(fl & FIRST), bool(fl & LAST)
                cap = tables.max_layers(c, f, h, 1)
                out = 0.0 if h else away[o.node] if fl & EXIT else send[o.node]
                u = ell * tables.time_layer[c] + f * tables.time_first[c] + h * tables.time_last[c] + out
                u[0] = math.inf
                u[cap + 1 if cap >= 0 else 0:] = math.inf
                if np.isfinite(u).any():
                    opt = ell * tables.opt_layer[c] + f * tables.opt_first[c] + h * tables.opt_last[c]
                    self.by_node[o.node].append((o.tp, fl, u, opt))
                    times.append(u[np.isfinite(u)])
                    steps.append(opt[np.isfinite(u)])
        self.caps = sorted(set(np.concatenate(times).tolist())) if times else []  # of the bottleneck U
        self.opt_caps = sorted(set(np.concatenate(steps).tolist())) if steps else []  # of the optimizer step O
        # nodes with the same GPUs and stage tables share one knapsack table per pair of caps
        cl = tables.problem.cluster
        self.kind = {n: (cl.nodes[n].gpu, cl.nodes[n].count,
                         tuple((t, fl, u.tobytes(), o.tobytes()) for t, fl, u, o in self.by_node[n])) for n in nodes}
        j = np.arange(L + 1)
        idx = j[:, None] - j[None, :]
        self.valid = idx >= 0  # the joins' min-plus convolutions over layer counts gather through these
        self.idx = np.where(self.valid, idx, 0)


def _minplus(row: np.ndarray, kernel: np.ndarray, idx: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """out[j] = min over ℓ of row[j − ℓ] + kernel[ℓ] (a min-plus convolution over layer counts)."""
    m = np.where(valid, row[idx], math.inf) + kernel[None, :]
    return m.min(axis=1)


def _shift_min(row: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """The same convolution for a kernel finite at a few ℓ only (a stage's layer counts within the
    caps): one shifted row per such ℓ."""
    out = np.full_like(row, math.inf)
    for ell in np.flatnonzero(np.isfinite(kernel)):
        np.minimum(out[ell:], row[:len(row) - ell] + kernel[ell], out=out[ell:])
    return out


def _node_table(items: list[tuple[int, int, np.ndarray, np.ndarray]], gpus: int, caps: tuple[float, float],
                L: int) -> np.ndarray:
    """D[g, flags, j]: the least Σu of a set of this node's stages, each within the caps (u ≤ U,
    o ≤ O), on g GPUs, holding j layers, whose flags (disjoint: one first, one last, one exit
    charged) make ``flags``."""
    D = np.full((gpus + 1, 8, L + 1), math.inf)
    D[0, 0, 0] = 0.0
    kernels = _kernels(items, caps)
    for g in range(1, gpus + 1):
        for t, fl, k in kernels:
            if t > g:
                continue
            src = D[g - t]
            for a in range(8):
                if a & fl or not np.isfinite(src[a]).any():
                    continue
                np.minimum(D[g, a | fl], _shift_min(src[a], k), out=D[g, a | fl])
    return D


def _node_best(D: np.ndarray) -> np.ndarray:
    """F[flags, j] over (first, last) flags: a node's least Σu on at most its GPUs, its exit charged
    unless it holds the last stage or nothing (j = 0)."""
    M = D.min(axis=0)
    F = M[EXIT:EXIT + 4].copy()  # an exit charged: always allowed
    F[LAST] = np.minimum(F[LAST], M[LAST])
    F[FIRST | LAST] = np.minimum(F[FIRST | LAST], M[FIRST | LAST])
    F[0, 0] = min(F[0, 0], M[0, 0])  # the node unused
    return F


def _kernels(items: list[tuple[int, int, np.ndarray, np.ndarray]],
             caps: tuple[float, float]) -> list[tuple[int, int, np.ndarray]]:
    """The node's stage times with every stage over the caps (u > U or o > O) left out (inf)."""
    u_cap, o_cap = caps
    out = [(t, fl, np.where((u <= u_cap) & (o <= o_cap), u, math.inf)) for t, fl, u, o in items]
    return [k for k in out if np.isfinite(k[2]).any()]


class _Knapsack:
    """S*(U, O) for one pair of caps, with the tables kept so that an optimal stage multiset can be
    read back."""

    def __init__(self, stages: _Stages, tables: CostTables, caps: tuple[float, float]) -> None:
        self.stages, self.tables, self.caps = stages, tables, caps
        L = self.L = tables.layers
        idx, valid = stages.idx, stages.valid
        H = np.full((4, L + 1), math.inf)
        H[0, 0] = 0.0
        self.H = [H]  # H[i]: the joint table over the first i nodes with stages
        self.D: list[tuple[int, np.ndarray]] = []  # (node, its D) per step
        memo: dict[tuple, np.ndarray] = {}
        for n, node in enumerate(tables.problem.cluster.nodes):
            items = stages.by_node[n]
            if not items:
                continue
            D = memo.get(stages.kind[n])
            if D is None:
                D = memo[stages.kind[n]] = _node_table(items, node.count, caps, L)
            F = _node_best(D)
            G = np.full((4, L + 1), math.inf)
            for a in range(4):
                if not np.isfinite(H[a]).any():
                    continue
                for b in range(4):
                    if a & b or not np.isfinite(F[b]).any():
                        continue
                    np.minimum(G[a | b], _minplus(H[a], F[b], idx, valid), out=G[a | b])
            H = G
            self.H.append(H)
            self.D.append((n, D))
        self.value = float(H[3, L])

    def stages_of_optimum(self) -> list[tuple[int, int, int, int]]:
        """An optimal multiset as (node, tp, flags, layers), read back through the tables."""
        if not math.isfinite(self.value):
            return []
        out: list[tuple[int, int, int, int]] = []
        flags, j = FIRST | LAST, self.L
        for i in range(len(self.D), 0, -1):  # undo the joins, last node first
            n, D = self.D[i - 1]
            F, H = _node_best(D), self.H[i - 1]
            a, b, jb = next((flags ^ b, b, jb) for b in range(4) if b & flags == b for jb in range(j + 1)
                            if _close(H[flags ^ b, j - jb] + F[b, jb], self.H[i][flags, j]))
            if jb:
                full = b | EXIT if _close(D.min(axis=0)[b | EXIT, jb], F[b, jb]) else b
                out += self._node_stages(n, D, full, jb)
            flags, j = a, j - jb
        return out

    def _node_stages(self, n: int, D: np.ndarray, flags: int, j: int) -> list[tuple[int, int, int, int]]:
        g = int(np.argmin(D[:, flags, j]))
        target = D[g, flags, j]
        out = []
        kernels = _kernels(self.stages.by_node[n], self.caps)
        while g > 0 and (flags or j):
            t, fl, ell = next((t, fl, ell) for t, fl, k in kernels if t <= g and fl & flags == fl
                              for ell in range(1, j + 1) if _close(D[g - t, flags ^ fl, j - ell] + k[ell], target))
            out.append((n, t, fl, ell))
            g, flags, j = g - t, flags ^ fl, j - ell
            target = D[g, flags, j]
        return out


def _close(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-9 * max(1.0, abs(b))


@dataclass(frozen=True, slots=True)
class SinglePipeline:
    """``bound_s``: seconds no plan of one pipeline beats (inf: none fits); ``multisets``: stage
    multisets (node, TP, flags, layers), each optimal for the relaxation at one of the caps with the
    least values it evaluated, best first; ``caps``: how many caps it evaluated."""

    bound_s: float
    multisets: tuple[tuple[tuple[int, int, int, int], ...], ...] = ()
    caps: int = 0

    def plans(self, tables: CostTables) -> list[Plan]:
        """Each multiset laid out as one pipeline (:func:`lay_out`) where it fits."""
        return [plan for ms in self.multisets if (plan := lay_out(tables, ms)) is not None]


def lay_out(tables: CostTables, multiset: Sequence[tuple[int, int, int, int]]) -> Plan | None:
    """A stage multiset as one pipeline: the embedding's node first, the head's last, each node's
    stages in one run (its exit last), GPUs in blocks by TP degree, and the layers laid out exactly
    for that order (:func:`assign_layers`, with the real in-flight memory); None when that order
    fits no layout."""
    if not multiset:
        return None
    problem = tables.problem
    i_first = next(i for i, x in enumerate(multiset) if x[2] & FIRST)
    i_last = next(i for i, x in enumerate(multiset) if x[2] & LAST)
    first, last = multiset[i_first], multiset[i_last]
    nodes = [first[0], *sorted({x[0] for x in multiset} - {first[0], last[0]})]
    nodes += [last[0]] if last[0] != first[0] else []
    order: list[tuple[int, int, int, int]] = [first]
    for n in nodes:
        order += sorted((x for i, x in enumerate(multiset) if x[0] == n and i not in (i_first, i_last)),
                        key=lambda x: x[2] & EXIT)
    order += [last] if i_last != i_first else []
    free = {n: problem.cluster.node_gpus(n) for n in nodes}
    gpus: dict[int, tuple[int, ...]] = {}
    for k in sorted(range(len(order)), key=lambda k: -order[k][1]):  # aligned TP blocks, widest first
        n, t = order[k][0], order[k][1]
        gpus[k], free[n] = tuple(free[n][:t]), free[n][t:]
    M = tables.micro_batches
    probes = StageCostTable(problem, tables.profile).probes([(x[0], gpus[k]) for k, x in enumerate(order)], M)
    laid = assign_layers([q.time1 for q in probes], [q.time0 for q in probes], [q.max_layers() for q in probes],
                         tables.layers, M)
    if laid is None:
        return None
    stages, lo = [], 0
    for k, (x, c) in enumerate(zip(order, laid[0])):
        stages.append(StagePlan(node=x[0], gpus=gpus[k], layers=(lo, lo + c)))
        lo += c
    return Plan(problem=problem, pipelines=(PipelinePlan(stages=tuple(stages), micro_batches=M),),
                meta={"solver": "single-pipeline relaxation"})


def single_pipeline_bound(tables: CostTables, *, upper_s: float | None = None, deadline: float | None = None,
                          rel_tol: float = REL_TOL) -> SinglePipeline | None:
    """The bound for plans of one pipeline and a stage multiset that attains it, or None when the
    deadline came before any.

    For caps U (every stage time) and O (every optimizer step) a plan within them takes
    ≥ (M−1)·U + S*(U, O) + max(O, the optimizer floor of :func:`optimizer_lower_bound`). S* is
    nonincreasing in both, so on a box of caps [U_i, U_k] × [O_a, O_b] every value is
    ≥ (M−1)·U_i + S*(U_k, O_b) + max(O_a, floor): branch and bound, least bound first. First over U
    alone with the floor for O (a few dozen knapsacks), then over both (the optimizer step exact;
    many more); the larger of the two bounds, each the least bound of its open boxes when the
    deadline stops it. ``upper_s`` (an incumbent) prunes boxes that cannot beat it, so the bound may
    be only ≥ ``upper_s``; a box within ``rel_tol`` of the best value is not split further."""
    search = _CapSearch(tables, upper_s, deadline, rel_tol)
    if not search.Us:
        return SinglePipeline(math.inf)
    try:
        if not math.isfinite(search.S(len(search.Us) - 1, len(search.Os) - 1)):
            return SinglePipeline(math.inf, caps=len(search.memo))
    except TimeoutError:
        return None
    first = search.run(exact_optimizer=False)
    if first is None:
        return None
    settled = upper_s is not None and first >= upper_s * (1 - rel_tol)  # cannot beat the incumbent anyway
    second = None if settled else search.run(exact_optimizer=True)
    bound = first if second is None else max(first, second)
    return SinglePipeline(bound, search.best_multisets(CANDIDATES), len(search.memo))


class _CapSearch:
    """Branch and bound over boxes of caps (U, O), the knapsacks remembered across both passes."""

    def __init__(self, tables: CostTables, upper_s: float | None, deadline: float | None, rel_tol: float) -> None:
        self.tables, self.upper, self.deadline, self.tol = tables, upper_s, deadline, rel_tol
        self.st = _Stages(tables)
        self.Us, self.Os = self.st.caps, self.st.opt_caps
        self.floor = optimizer_lower_bound(tables, 1)
        self.M1 = tables.micro_batches - 1
        self.memo: dict[tuple[int, int], _Knapsack] = {}

    def S(self, i: int, a: int) -> float:
        if (i, a) not in self.memo:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise TimeoutError
            self.memo[i, a] = _Knapsack(self.st, self.tables, (self.Us[i], self.Os[a]))
        return self.memo[i, a].value

    def best_multisets(self, n: int) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
        """The optimal multisets of the (up to) ``n`` evaluated caps of least value, distinct, best first."""
        floor, M1 = self.floor, self.M1
        ranked = sorted((M1 * self.Us[i] + k.value + max(self.Os[a], floor), (i, a))
                        for (i, a), k in self.memo.items() if math.isfinite(k.value))
        out: list[tuple[tuple[int, int, int, int], ...]] = []
        for _, ia in ranked:
            ms = tuple(self.memo[ia].stages_of_optimum())
            if ms not in out:
                out.append(ms)
            if len(out) == n:
                break
        return tuple(out)

    def _least(self, feasible: Callable[[int], bool], n: int) -> int:
        """The first index at which ``feasible`` (monotone in the index) holds; it holds at n − 1."""
        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if feasible(mid) else (mid + 1, hi)
        return lo

    def run(self, exact_optimizer: bool) -> float | None:
        """The pass's bound; None when the deadline came before any value (the multisets are read
        from every evaluated pair of caps afterwards, :meth:`best_multisets`)."""
        Us, Os, M1, floor = self.Us, self.Os, self.M1, self.floor
        nU, nO = len(Us), len(Os)
        best, boxes = math.inf, []

        def charge(a: int) -> float:
            return max(Os[a], floor) if exact_optimizer else floor

        def value(i: int, a: int) -> float:
            return M1 * Us[i] + self.S(i, a) + charge(a)

        def box(i: int, k: int, a: int, b: int) -> tuple[float, int, int, int, int]:
            return (M1 * Us[i] + self.S(k, b) + charge(a), i, k, a, b)

        try:
            quick = M1 * Us[0] + self.S(nU - 1, nO - 1) + charge(0 if exact_optimizer else nO - 1)
            if self.upper is not None and quick >= self.upper:  # every cap's value is at least this
                return quick
            u0 = self._least(lambda i: math.isfinite(self.S(i, nO - 1)), nU)  # the least feasible U (any O)
            o0 = self._least(lambda a: math.isfinite(self.S(nU - 1, a)), nO) if exact_optimizer else nO - 1
            best = min(value(i, a) for i in (u0, nU - 1) for a in (o0, nO - 1))
            cut = best if self.upper is None else min(best, self.upper)
            boxes = [box(u0, nU - 1, o0, nO - 1)]  # all four corners evaluated; least bound first
            while boxes and boxes[0][0] < cut * (1 - self.tol):
                _, i, k, a, b = heapq.heappop(boxes)
                if k - i <= 1 and b - a <= 1:
                    continue
                if k - i >= b - a:  # split the longer side
                    m = (i + k) // 2
                    halves, new = [(m, k, a, b), (i, m, a, b)], [(m, a), (m, b)]
                else:
                    m = (a + b) // 2
                    halves, new = [(i, k, m, b), (i, k, a, m)], [(i, m), (k, m)]
                best = min(best, *(value(*ia) for ia in new))
                cut = min(cut, best)
                for h in halves:
                    heapq.heappush(boxes, box(*h))
        except TimeoutError:
            if math.isinf(best):
                return None
        top = best if self.upper is None else min(best, self.upper)
        return min([top] + [bx[0] for bx in boxes])
