"""A fluid (column-generation) lower bound on the slowest pipeline of every heterogeneous plan.

Idea (docs/formulation.md §14 proves it). Every pipeline of a plan is an ordered *shape*: stages
(option c = node and TP degree, ℓ ≥ 1 layers), with stage times u_k taken from the evaluator's
tabulated affine pieces (:mod:`.candidates`), bottleneck U = max u_k and sum S = Σ u_k. If the
slowest pipeline finishes within T', each pipeline runs m ≤ r(T') = 1 + (T' − S)/U micro-batches, the
pipelines fit the node capacities and there are at most P_max of them, and Σ m = M. So the *fluid
master* LP

    V(T') = max Σ_s r_s(T')·x_s   s.t.  Σ_s g_{s,n}·x_s ≤ G_n (every node n),  Σ_s x_s ≤ P_max,  x ≥ 0

(over all shapes with S ≤ T') is ≥ M for every T' ≥ T_pipe* (the plan's optimum pipeline term).
Weak duality gives, for *any* multipliers π ≥ 0, μ ≥ 0 (A = π·G + μ·P_max < M, ρ = (M − A)/P_max):

    V(T') < M   whenever   T' < T_cert(π, μ) = min_shapes [ S + U·(π·g + ρ − 1 + μ) ],

so T_cert is a valid lower bound on the pipeline term, whatever π and μ are; good multipliers come
from the restricted master's duals (column generation). The minimum over shapes is a shortest path
over (layers covered, node of the next stage and GPUs its run of consecutive stages uses) with the
bottleneck handled by branch and bound on U: for a bucket U ∈ [lo, hi] the path minimising
S + lo·π·g with every u_k ≤ hi gives a valid lower bound for the bucket (π·g ≥ 0), and the bucket
with the least bound is split until it is tight. Per pipeline count P (``fluid_bounds_by_pipelines``)
the master has Σ x ≤ P and the bound adds lower bounds on that P's sync and optimizer time.

Relaxations (each can only lower the bound): memory with one micro-batch in flight on every stage
(the most lenient count); node capacity per shape only for runs of consecutive stages on one node
(the master enforces it for the sum over shapes); fractional pipelines and micro-batches.
Reference: the decomposition is the classic Dantzig–Wolfe / Gilmore–Gomory column generation with a
Lagrangian (Farley-type) bound that is valid at every iteration, not only at convergence.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass, field

import highspy
import numpy as np
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan

from . import cost
from .candidates import CostTables
from .milp_plan import quiet_stdout

__all__ = ["FluidResult", "Shape", "certificate", "fluid_bounds_by_pipelines", "fluid_lower_bound",
           "optimizer_lower_bound", "shape_from_stages", "shape_of_pipeline", "sync_lower_bound"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Shape:
    """An ordered pipeline shape: ``stages`` = ((option, layers), ...), per-node GPU use, S and U."""

    stages: tuple[tuple[int, int], ...]
    gpus: tuple[int, ...]
    total: float        # S = Σ u_k
    bottleneck: float   # U = max u_k

    def micro_batches_within(self, t: float) -> float:
        """r(t) = 1 + (t − S)/U: the most micro-batches this shape runs within t (fractional)."""
        return 1.0 + (t - self.total) / self.bottleneck


@dataclass(frozen=True, kw_only=True)
class FluidResult:
    """``pipe_lb_s``: proven lower bound on max_p T_pipe; ``upper_s``: the restricted master's
    estimate (≥ the fluid optimum); ``iterations`` of column generation; ``converged``: the last
    pricing found no column of positive reduced cost beyond the tolerance."""

    pipe_lb_s: float
    upper_s: float
    iterations: int
    columns: int
    converged: bool
    shapes: tuple[Shape, ...] = field(default=(), repr=False)
    last_duals: tuple[tuple[float, ...], float] | None = field(default=None, repr=False)
    solution: tuple[tuple[Shape, float], ...] = field(default=(), repr=False)  # final master x > 0


def optimizer_lower_bound(tables: CostTables, pipelines: int = 1) -> float:
    """Seconds no plan (with ``pipelines`` pipelines) beats in its optimizer step: the first stage
    holds the embedding and ≥ 1 layer, the last the head and ≥ 1 layer; and some pipeline uses at
    most ⌊N/P⌋ GPUs, one of which holds ≥ total/⌊N/P⌋ parameters (optimizer time is linear in the
    parameters held: the per-layer slope of each option, scaled by its TP degree)."""
    opts = tables.options
    first = min(tables.opt_layer[o.index] + tables.opt_first[o.index] for o in opts)
    last = min(tables.opt_layer[o.index] + tables.opt_last[o.index] for o in opts)
    model = tables.problem.model
    share = model.total_params / max(1, tables.problem.cluster.num_gpus // max(1, pipelines))
    heavy = min(tables.opt_layer[o.index] * o.tp * share / model.params_per_layer for o in opts)
    return max(0.0, first, last, heavy)


class _Pricer:
    """Shortest paths over (layers covered, node of the next stage) for batches of caps."""

    def __init__(self, tables: CostTables) -> None:
        self.t = tables
        L = tables.layers
        self.L = L
        self.N = len(tables.problem.cluster.nodes)
        opts = tables.options
        self.C = len(opts)
        self.node = np.array([o.node for o in opts])
        self.tp = np.array([o.tp for o in opts], dtype=float)
        tau = np.array([tables.time_layer[o.index] for o in opts])
        emb = np.array([tables.time_first[o.index] for o in opts])
        head = np.array([tables.time_last[o.index] for o in opts])
        comm = np.array([[tables.comm.get((o.node, b), math.inf) for b in range(self.N)] for o in opts])  # (C, N)
        ell = np.arange(1, L + 1, dtype=float)

        def cap(first: bool, last: bool) -> np.ndarray:
            return np.array([min(L, tables.max_layers(o.index, first, last, 1)) for o in opts])

        ok = ell[None, :] <= cap(False, False)[:, None]                                  # (C, L)
        self.u_mid = np.where(ok[:, :, None], tau[:, None, None] * ell[None, :, None] + comm[:, None, :], math.inf)
        okf = ell[None, :] <= cap(True, False)[:, None]
        self.u_first = np.where(okf[:, :, None], (tau[:, None] * ell[None, :] + emb[:, None])[:, :, None]
                                + comm[:, None, :], math.inf)                            # (C, L, N)
        okl = ell[None, :] <= cap(False, True)[:, None]
        self.u_last = np.where(okl, tau[:, None] * ell[None, :] + head[:, None], math.inf)  # (C, L)
        oks = ell[None, :] <= cap(True, True)[:, None]
        self.u_single = np.where(oks, tau[:, None] * ell[None, :] + emb[:, None] + head[:, None], math.inf)
        # run states (node a, GPUs r used by the run of consecutive stages on a that starts here)
        counts = [node.count for node in tables.problem.cluster.nodes]
        states = [(a, r) for a in range(self.N) for r in range(1, counts[a] + 1)]
        sidx = {st: i for i, st in enumerate(states)}
        S = self.S = len(states)
        snode = np.array([a for a, _ in states])
        ns = np.full((self.C, S), -1, dtype=np.int64)      # state after putting option c before state s
        for c, o in enumerate(opts):
            for sb, (b, rb) in enumerate(states):
                r = o.tp + (rb if b == o.node else 0)
                ns[c, sb] = sidx.get((o.node, r), -1)
        self.valid = ns >= 0
        # candidates of each new state (a, r), as indices into [mv (C·S) | fresh run (C) | inf]:
        # option c on a with tp r after a stage on another node, or tp t < r before the run (a, r − t)
        pairs: list[list[int]] = [[] for _ in range(S)]
        for c, o in enumerate(opts):
            for sb, (b, _) in enumerate(states):
                if b == o.node and ns[c, sb] >= 0:
                    pairs[ns[c, sb]].append(c * S + sb)
            if (o.node, o.tp) in sidx:
                pairs[sidx[(o.node, o.tp)]].append(self.C * S + c)
        width = max(1, max(len(x) for x in pairs))
        self.gather = np.full((S, width), self.C * S + self.C, dtype=np.int64)
        for i, x in enumerate(pairs):
            self.gather[i, : len(x)] = x
        self.other_node = np.array([[b != o.node for b, _ in states] for o in opts])       # (C, S)
        self.last_into = np.zeros((S, self.C), dtype=bool)
        for c, o in enumerate(opts):
            if (o.node, o.tp) in sidx:
                self.last_into[sidx[(o.node, o.tp)], c] = True
        self.u_mid_s = self.u_mid[:, :, snode]                                           # (C, L, S)
        self.u_first_s = self.u_first[:, :, snode]
        n_gpus = tables.problem.cluster.num_gpus
        self.u_floor = L * float(tau.min()) / max(1, min(L, n_gpus))

    def solve(self, caps: np.ndarray, weights: np.ndarray, pi: np.ndarray) -> tuple[np.ndarray, list]:
        """For each k: min over shapes with every u ≤ caps[k] (and every run of consecutive stages on
        one node within its GPUs) of S + weights[k]·π·g; the values (inf when no shape fits) and the
        argmin shapes (None when infeasible). States: (node of the next stage, GPUs its run uses)."""
        K, L, C, S = len(caps), self.L, self.C, self.S
        inf = math.inf
        pen = weights[:, None] * (pi[self.node] * self.tp)[None, :]                      # (K, C)
        G = np.full((L + 1, K, S), inf)
        back: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        capk = caps[:, None, None, None]
        for j in range(L - 1, 0, -1):
            span = L - j
            ul = self.u_last[:, span - 1]
            lv = np.where(ul[None, :] <= caps[:, None], ul[None, :] + pen, inf)          # (K, C)
            lm = np.where(self.last_into[None], lv[:, None, :], inf)                     # (K, S, C)
            lc = lm.argmin(axis=2)
            new = np.take_along_axis(lm, lc[:, :, None], 2)[:, :, 0]
            code = C * S + lc
            lsel = None
            if span > 1:
                um = self.u_mid_s[:, : span - 1, :]                                       # (C, ℓ, S)
                nxt = G[j + 1: L].transpose(1, 0, 2)                                     # (K, ℓ, S)
                val = np.where(um[None] <= capk, um[None] + nxt[:, None], inf)           # (K, C, ℓ, S)
                lsel = val.argmin(axis=2)                                                # (K, C, S)
                mv = np.take_along_axis(val, lsel[:, :, None, :], 2)[:, :, 0, :] + pen[:, :, None]
                fresh_m = np.where(self.other_node[None], mv, inf)                       # (K, C, S)
                fresh_s = fresh_m.argmin(axis=2)
                fresh = np.take_along_axis(fresh_m, fresh_s[:, :, None], 2)[:, :, 0]     # (K, C)
                ext = np.concatenate([mv.reshape(K, C * S), fresh, np.full((K, 1), inf)], axis=1)
                into = ext[:, self.gather]                                               # (K, S, width)
                gi = into.argmin(axis=2)
                mvals = np.take_along_axis(into, gi[:, :, None], 2)[:, :, 0]
                mi = self.gather[np.arange(S)[None, :], gi]
                # a fresh run: recover the successor state of the chosen option
                is_fresh = mi >= C * S
                cf = np.clip(mi - C * S, 0, C - 1)
                mi = np.where(is_fresh, cf * S + np.take_along_axis(fresh_s, cf, 1), mi)
                better = mvals < new
                new = np.where(better, mvals, new)
                code = np.where(better, mi, code)
            G[j] = new
            back[j] = (code, lsel)
        us = self.u_single[:, L - 1]
        best = np.where(us[None, :] <= caps[:, None], us[None, :] + pen, inf)           # (K, C)
        choice = np.full((K, C), -1, dtype=np.int64)
        if L > 1:
            uf = self.u_first_s[:, : L - 1, :]
            nxt = G[1:L].transpose(1, 0, 2)
            val = np.where((uf[None] <= capk) & self.valid[None, :, None, :], uf[None] + nxt[:, None], inf)
            flat = val.reshape(K, C, -1)
            idx = flat.argmin(axis=2)
            mv = np.take_along_axis(flat, idx[:, :, None], 2)[:, :, 0] + pen
            better = mv < best
            best = np.where(better, mv, best)
            choice = np.where(better, idx, choice)
        c0 = best.argmin(axis=1)
        vals = best[np.arange(K), c0]
        shapes: list = []
        for k in range(K):
            if not math.isfinite(vals[k]):
                shapes.append(None)
                continue
            c, ch = int(c0[k]), int(choice[k, c0[k]])
            if ch < 0:
                shapes.append(self.shape([(c, L)]))
                continue
            li, state = divmod(ch, S)
            stages, j = [(c, li + 1)], li + 1
            while True:
                code, lsel = back[j]
                cd = int(code[k, state])
                if cd >= C * S:
                    stages.append((cd - C * S, L - j))
                    break
                c, state_b = divmod(cd, S)
                li = int(lsel[k, c, state_b])
                stages.append((c, li + 1))
                j, state = j + li + 1, state_b
            shapes.append(self.shape(stages))
        return vals, shapes

    def shape(self, stages: list[tuple[int, int]]) -> Shape:
        """Exact S and U of an ordered stage list from the tabulated evaluator pieces."""
        K = len(stages)
        u = []
        for k, (c, ell) in enumerate(stages):
            nxt = self.node[stages[k + 1][0]] if k + 1 < K else None
            if K == 1:
                u.append(self.u_single[c, ell - 1])
            elif k == 0:
                u.append(self.u_first[c, ell - 1, nxt])
            elif nxt is None:
                u.append(self.u_last[c, ell - 1])
            else:
                u.append(self.u_mid[c, ell - 1, nxt])
        g = [0] * self.N
        for c, _ in stages:
            g[self.node[c]] += int(self.tp[c])
        return Shape(stages=tuple(stages), gpus=tuple(g), total=float(sum(u)), bottleneck=float(max(u)))


def shape_of_pipeline(tables: CostTables, plan: Plan, p: int) -> Shape:
    """The shape of pipeline ``p`` of ``plan`` (S and U from the same tabulated pieces)."""
    idx = {(o.node, o.tp): o.index for o in tables.options}
    return shape_from_stages(tables, [(idx[(st.node, st.tp)], st.num_layers) for st in plan.pipelines[p].stages])


def shape_from_stages(tables: CostTables, stages: list[tuple[int, int]]) -> Shape:
    """The shape of an ordered list of (option index, layers); S and U are inf when a stage breaks
    the lenient memory cap (one micro-batch in flight)."""
    return _pricer_cache(tables).shape(stages)


_PRICERS: dict[int, tuple[CostTables, _Pricer]] = {}


def _pricer_cache(tables: CostTables) -> _Pricer:
    hit = _PRICERS.get(id(tables))
    if hit is None or hit[0] is not tables:
        _PRICERS.clear()
        hit = (tables, _Pricer(tables))
        _PRICERS[id(tables)] = hit
    return hit[1]


class _Master:
    """The restricted fluid master LP over the columns found so far (HiGHS)."""

    def __init__(self, caps: list[int], pmax: int) -> None:
        self.caps, self.pmax = caps, pmax
        self.cols: list[Shape] = []
        self.keys: set[tuple] = set()
        self.last: tuple[list[Shape], np.ndarray] = ([], np.zeros(0))

    def add(self, s: Shape) -> bool:
        if s.stages in self.keys:
            return False
        self.keys.add(s.stages)
        self.cols.append(s)
        return True

    def solve(self, t: float) -> tuple[float, np.ndarray, float]:
        """V_R(t), node duals π ≥ 0 and the pipeline-count dual μ ≥ 0."""
        live = [s for s in self.cols if s.total <= t]
        N = len(self.caps)
        if not live:
            return 0.0, np.zeros(N), 0.0
        with quiet_stdout():  # HiGHS prints its banner on stdout (would break --json output)
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        # one thread, as the MILP backend: HiGHS's scheduler is process-wide, and a later solve asking
        # for a different thread count than the first fails (PuLP's HiGHS then returns kNotset)
        h.setOptionValue("threads", 1)
        inf = highspy.kHighsInf
        for _ in live:
            h.addVar(0.0, inf)
        h.changeColsCost(len(live), np.arange(len(live), dtype=np.int32),
                         np.array([-s.micro_batches_within(t) for s in live]))
        for n in range(N):
            idx = np.array([i for i, s in enumerate(live) if s.gpus[n] > 0], dtype=np.int32)
            h.addRow(-inf, float(self.caps[n]), len(idx), idx, np.array([live[i].gpus[n] for i in idx], dtype=float))
        h.addRow(-inf, float(self.pmax), len(live),
                 np.arange(len(live), dtype=np.int32), np.ones(len(live)))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:  # e.g. fewer columns than P: no duals
            return 0.0, np.zeros(N), 0.0
        sol = h.getSolution()
        self.last = (live, np.asarray(sol.col_value))
        duals = -np.asarray(sol.row_dual)   # minimisation of −V: duals of ≤ rows are ≤ 0
        return -h.getInfo().objective_function_value, np.maximum(0.0, duals[:N]), max(0.0, float(duals[N]))


def fluid_lower_bound(tables: CostTables, *, pmax: int, upper_s: float | None = None,
                      seed_plans: tuple[Plan, ...] = (), deadline: float | None = None,
                      rel_tol: float = 1e-4, max_iterations: int = 200,
                      pool: tuple[Shape, ...] = ()) -> FluidResult:
    """Seconds: a valid lower bound on the slowest pipeline of every plan (module docstring).

    ``upper_s`` is any pipeline time at least the optimum's, or an estimate (it only brackets the
    search: the result is clamped to it and stays valid even when the estimate is too low);
    ``seed_plans`` provide the first columns (e.g. the heuristics' plans). Column generation stops
    when the proven bound is within ``rel_tol`` of the restricted master's estimate, when pricing finds
    no new column, at ``deadline`` (monotonic seconds) or after ``max_iterations``; the bound proven
    so far is returned in every case. ``pmax`` caps the number of pipelines (Σ x ≤ pmax);
    ``pool`` are columns from an earlier run on the same tables (e.g. another P).
    """
    pr = _pricer_cache(tables)
    M = tables.micro_batches
    caps = [node.count for node in tables.problem.cluster.nodes]
    master = _Master(caps, pmax)
    for s in pool:
        master.add(s)
    for plan in seed_plans:
        for p in range(len(plan.pipelines)):
            master.add(shape_of_pipeline(tables, plan, p))
    # columns at π = 0 over a spread of caps: the fastest shape for each bottleneck level
    if not pool:
        grid = pr.u_floor * np.geomspace(1.0, 4.0 * tables.layers * max(1, min(tables.layers, len(caps) * 8)), 24)
        _, shapes = pr.solve(grid, np.zeros(len(grid)), np.zeros(pr.N))
        for s in shapes:
            if s is not None:
                master.add(s)
    if upper_s is None:
        upper_s = min((s.total + (M - 1) * s.bottleneck for s in master.cols), default=math.inf)
    if not master.cols or not math.isfinite(upper_s):
        return FluidResult(pipe_lb_s=0.0, upper_s=math.inf, iterations=0, columns=0, converged=False)
    lb, est, it, converged, duals = 0.0, upper_s, 0, False, None
    while it < max_iterations and (deadline is None or time.monotonic() < deadline):
        it += 1
        est = _master_root(master, M, lb, upper_s)
        _, pi, mu = master.solve(est)
        cert, new, tight = certificate(tables, pi, mu, M, pmax, upper_s, deadline)
        duals = (tuple(pi.tolist()), mu)
        lb = max(lb, min(cert, upper_s))
        added = sum(master.add(s) for s in new)
        if est - lb <= rel_tol * est:
            converged = True
            break
        if not added:  # pricing proves no new column improves the master (within its tolerance)
            converged = tight
            break
    logger.info("fluid bound %.6g s (master %.6g s, %d iterations, %d columns)", lb, est, it, len(master.cols))
    master.solve(est)
    solution = tuple((sh, float(v)) for sh, v in zip(*master.last) if v > 1e-9)
    return FluidResult(pipe_lb_s=lb, upper_s=est, iterations=it, columns=len(master.cols), converged=converged,
                       shapes=tuple(master.cols), last_duals=duals, solution=solution)


def _master_root(master: _Master, M: int, lo: float, hi: float) -> float:
    """Least t in [lo, hi] with V_R(t) ≥ M (bisection; V_R is nondecreasing in t); hi if none."""
    if master.solve(hi)[0] < M:
        return hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if master.solve(mid)[0] >= M:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    return hi


def certificate(tables: CostTables, pi: np.ndarray, mu: float, M: int, pmax: int, top: float,
                 deadline: float | None, max_dp: int = 400, rel: float = 1e-5) -> tuple[float, list[Shape], bool]:
    """T_cert(π, μ) = min over shapes of S + U·(π·g + κ), κ = ρ − 1 + μ, by branch and bound on U.

    Bucket (lo, hi]: every shape with all u ≤ hi and bottleneck > lo has value ≥ DP(hi, lo) +
    min(lo·κ, hi·κ), DP(hi, w) = min S + w·π·g over shapes with every u ≤ hi. Returns the proven
    minimum (the least bucket bound), the argmin shapes met on the way (new columns) and whether the
    search closed (least bound within ``rel`` of the best shape found) rather than hit a limit."""
    pr = _pricer_cache(tables)
    caps = np.array([float(n.count) for n in tables.problem.cluster.nodes])
    A = float(pi @ caps) + mu * pmax
    if A >= M * (1 - 1e-9):  # at the master's root A = V_R = M: shrink the multipliers (any π, μ ≥ 0 are valid)
        shrink = M * (1 - 1e-9) / A
        pi, mu, A = pi * shrink, mu * shrink, M * (1 - 1e-9)
    kappa = (M - A) / pmax - 1.0 + mu
    lo0 = pr.u_floor
    if top <= lo0:
        return top, [], True
    edges = list(np.geomspace(lo0, top, 17))
    heap: list[tuple[float, float, float]] = []
    found: dict[tuple, Shape] = {}
    best_exact = math.inf

    def push(buckets: list[tuple[float, float]]) -> None:
        nonlocal best_exact
        his = np.array([b[1] for b in buckets])
        los = np.array([b[0] for b in buckets])
        vals, shapes = pr.solve(his, los, pi)
        for (lo, hi), v, s in zip(buckets, vals, shapes):
            if s is None:
                continue
            bound = v + min(lo * kappa, hi * kappa)
            heapq.heappush(heap, (bound, lo, hi))
            exact = s.total + s.bottleneck * (float(pi @ np.array(s.gpus, dtype=float)) + kappa)
            if exact < best_exact:
                best_exact = exact
            found.setdefault(s.stages, s)

    push([(edges[i], edges[i + 1]) for i in range(len(edges) - 1)])
    calls, closed = 1, not heap
    while heap and calls < max_dp and (deadline is None or time.monotonic() < deadline):
        bound, lo, hi = heap[0]
        if bound >= best_exact - rel * abs(best_exact) or hi <= lo * (1 + 1e-9):
            closed = True
            break
        heapq.heappop(heap)
        mid = math.sqrt(lo * hi)
        push([(lo, mid), (mid, hi)])
        calls += 1
    cert = heap[0][0] if heap else top
    good = sorted(found.values(), key=lambda s: s.total + s.bottleneck * (float(pi @ np.array(s.gpus, float)) + kappa))
    return min(cert, top), good[:8], closed


def sync_lower_bound(tables: CostTables, pipelines: int) -> float:
    """Seconds of gradient sync no plan with ``pipelines`` pipelines beats: every pipeline's first
    stage holds the embedding and ≥ 1 layer (its last the head and ≥ 1 layer), and one GPU of it
    all-reduces its 1/t share over the ``pipelines`` replicas — bounded below per option by
    :meth:`CostTables.sync_layer_lb` on the combined payload (one latency: never above the exact sum)."""
    if pipelines < 2:
        return 0.0
    model = tables.problem.model
    first = min(tables.sync_layer_lb(o.index, pipelines, model.params_per_layer + model.embedding_params)
                for o in tables.options)
    last = min(tables.sync_layer_lb(o.index, pipelines, model.params_per_layer + model.head_params)
               for o in tables.options)
    # some pipeline uses at most ⌊N/P⌋ GPUs, and its GPUs share all the model's parameters
    # (Σ_k t_k·params_k/t_k = total), so one of them holds at least total/⌊N/P⌋ of them
    share = model.total_params / max(1, tables.problem.cluster.num_gpus // pipelines)
    heavy = min(tables.sync_layer_lb(o.index, pipelines, share * o.tp) for o in tables.options)
    cl = tables.problem.cluster
    n = len(cl.nodes)
    if n > 1 and pipelines > max(node.count for node in cl.nodes):
        # the P holders of a piece (one GPU per pipeline) cannot share one node: their slowest link
        # is no faster than the fastest link between two nodes (gradsync's ordering)
        def key(lk: cost.Link) -> float:
            return lk.bandwidth / (1 + lk.bandwidth * lk.latency)

        links = [cost.cluster_link(cl, a, b) for a in range(n) for b in range(a, n)]
        top = max(key(cost.cluster_link(cl, a, b)) for a in range(n) for b in range(n) if a != b)
        payload = share * tables.problem.training.dtype_bytes
        heavy = max(heavy, min(cost.collective_time(OpClass.ALL_REDUCE, pipelines, payload, lk, tables.profile)
                               for lk in links if key(lk) <= top))
    return max(0.0, first, last, heavy)


def fluid_bounds_by_pipelines(tables: CostTables, *, pmax: int, upper_s: float,
                              seed_plans: tuple[Plan, ...] = (), deadline: float | None = None,
                              rel_tol: float = 1e-4) -> tuple[dict[int, float], dict[int, FluidResult]]:
    """Per pipeline count P = 1 … pmax: a lower bound on the iteration time of every plan with P
    pipelines: the fluid pipeline bound plus :func:`sync_lower_bound` and
    :func:`optimizer_lower_bound` for P, each at most ``upper_s`` (any plan time: bounds are only
    claimed below it). The master of P has Σ x ≤ P, so its certificate holds for every P' ≤ P too:
    P = pmax is solved first (a floor for all), then always the P with the least bound so far, the
    time left shared evenly; a P whose bound reaches ``upper_s`` is not solved. Also returns each
    solved P's :class:`FluidResult` (``exact_plan.round_master`` turns its master into plans)."""
    rest = {P: sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P) for P in range(1, pmax + 1)}
    out = {P: min(upper_s, rest[P]) for P in rest}
    runs: dict[int, FluidResult] = {}
    pool: list[Shape] = []
    todo = set(rest)
    P = pmax
    while todo:
        todo.discard(P)
        top = upper_s - rest[P]
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        if top > 0 and out[P] < upper_s:
            sub = None if deadline is None else time.monotonic() + left / (len(todo) + 1)
            fr = fluid_lower_bound(tables, pmax=P, upper_s=top, seed_plans=seed_plans, deadline=sub,
                                   rel_tol=rel_tol, pool=tuple(pool))
            pool = list(fr.shapes)
            runs[P] = fr
            for q in range(1, P + 1):  # Σ x ≤ P also covers every smaller pipeline count
                out[q] = max(out[q], min(upper_s, fr.pipe_lb_s + rest[q]))
            logger.info("fluid P=%d: pipeline >= %.6g s, total >= %.6g s (%d iterations)", P, fr.pipe_lb_s,
                        out[P], fr.iterations)
        if todo:
            P = min(todo, key=lambda q: (out[q], q))
    return out, runs
