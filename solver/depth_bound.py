"""A per-P lower bound that counts each stage's micro-batches in flight (docs/formulation.md §16).

The fluid bound of :mod:`.fluid_bound` prices every stage at one micro-batch in flight, which is
right with full recompute and far too lenient without it: a Llama-2 7B layer then keeps 3 GiB per
micro-batch, and 1F1B puts min(K − k, m) of them on stage k of K. This bound trades the fluid
bound's sync floors, node runs and whole micro-batches for exact memory at depth:

* *Shapes* are ordered stages (option class = TP degree on a group of interchangeable nodes, ℓ ≥ 1
  layers) with stage times from :class:`.candidates.CostTables` (the point-to-point send at its
  cheapest link, a relaxation). A shape's *cap* c_s is the most micro-batches m ≤ M whose memory
  fits: stage k holds ``cost.inflight_microbatches(schedule, k, K, m)``.
* *Master* (LP, HiGHS): max Σ_s x_s·min(r_s(t), c_s) over x ≥ 0 with Σ_s g_{s,n}·x_s ≤ G_n per node
  group and Σ_s x_s = P, r_s(t) = 1 + (t − S_s)/U_s for shapes with S_s ≤ t. A plan of P pipelines
  whose slowest pipeline takes ≤ t is a point of value Σ m_p = M, so V(t) < M proves t too short.
* *Certificate* at duals (π, μ): V(t) ≤ π·G + P·μ' for any μ' ≥ max_s (min(r_s, c_s) − π·g_s). The
  shapes of cap ≥ v fit at min(depth, v) in flight; for v < D, min(r, c) − π·g ≤ min(A_v, v − B_v)
  with A_v = max (r − π·g) and B_v = min π·g over them; the shapes of cap ≥ D count at A_D. A_v is
  bounded box by box in U ∈ [u_i, u_{i+1}]: r − π·g ≤ 1 + (t − min(S + u_i·π·g))/u_i, the minimum
  over shapes with every stage ≤ u_{i+1} (:mod:`.depth_dp_jit`).
* The bound on the iteration time is the greatest certified t plus the sync and optimizer floors
  of P pipelines (:func:`.fluid_bound.sync_lower_bound`, :func:`.fluid_bound.optimizer_lower_bound`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import highspy
import numpy as np

from . import cost
from .candidates import CostTables, identical_node_groups
from .depth_dp_jit import depth_dp
from .fluid_bound import _highs, rest_lower_bound

__all__ = ["DepthTables", "depth_lower_bounds", "depth_tables", "memory_depends_on_depth"]

BOX_RATIO = 1.02   # first boxes of U: geometric steps
# (λ, α = λ + γ) tried in this order for a class whose λ = 1 bound does not certify (module docstring)
MULTIPLIERS = ((0.0, 0.0), (0.5, 0.5), (0.0, 0.1), (0.75, 0.75), (0.5, 0.6), (0.25, 0.25), (0.9, 0.9),
               (0.0, 0.5), (0.25, 0.35), (0.75, 0.85), (0.97, 0.97), (0.9, 1.0), (0.5, 1.0), (0.0, 0.02))


@dataclass(frozen=True)
class DepthTables:
    """Stage times and memory limits per option class (TP degree on a node group), every table
    indexed [class option, layers − 1]; ``lm[(pos, v)]`` the most layers a stage of each option
    holds at position pos (mid/first/last/single) with v micro-batches in flight."""

    tables: CostTables
    groups: list[list[int]]       # interchangeable nodes
    gpus: np.ndarray              # GPUs per group
    ogroup: np.ndarray            # group of each class option
    tp: np.ndarray
    rep: list[int]                # a CostTables option index of each class option
    u_mid: np.ndarray
    u_first: np.ndarray
    u_last: np.ndarray
    u_single: np.ndarray
    _lm: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)

    @property
    def layers(self) -> int:
        return self.u_last.shape[1]

    def lm(self, pos: str, inflight: int) -> np.ndarray:
        """Most layers per class option at ``pos`` with ``inflight`` micro-batches (−1: none)."""
        key = (pos, inflight)
        if key not in self._lm:
            first, last = pos in ("first", "single"), pos in ("last", "single")
            self._lm[key] = np.array([self.tables.max_layers(c, first, last, inflight) for c in self.rep],
                                     dtype=np.int64)
        return self._lm[key]

    def inflight(self, depth: int, m: int) -> int:
        """Micro-batches in flight on a stage with ``depth`` stages from it to the last (itself
        included) in a pipeline of ``m`` (the cost model's rule, one place)."""
        return cost.inflight_microbatches(self.tables.problem.schedule, 0, depth, m)

    def class_tables(self, v: int, depth: int) -> tuple[np.ndarray, ...]:
        """The DP's memory limits for shapes of cap ≥ v: (lm_mid, lm_first) per depth state, lm_last,
        lm_single."""
        D = max(1, min(depth, v)) if self.tables.problem.schedule == "1f1b" else 1
        mid = np.stack([self.lm("mid", self.inflight(d + 1, v)) for d in range(D)], axis=1)
        first = np.stack([self.lm("first", self.inflight(d + 1, v)) for d in range(D)], axis=1)
        return mid, first, self.lm("last", self.inflight(1, v)), self.lm("single", self.inflight(1, v))


def depth_tables(tables: CostTables) -> DepthTables:
    """Class options of ``tables``: one per (node group, TP degree), at the group's first node."""
    groups = identical_node_groups(tables.problem)
    gof = {n: g for g, nodes in enumerate(groups) for n in nodes}
    first_of = {g[0] for g in groups}
    rep = [o.index for o in tables.options if o.node in first_of]
    L = tables.layers
    ell = np.arange(1, L + 1, dtype=float)
    n_nodes = len(tables.problem.cluster.nodes)
    rows = {k: [] for k in ("mid", "first", "last", "single")}
    for c in rep:
        o = tables.options[c]
        tau, emb, head = tables.time_layer[c], tables.time_first[c], tables.time_last[c]
        comm = min(tables.comm.get((o.node, b), math.inf) for b in range(n_nodes))
        rows["mid"].append(tau * ell + comm)
        rows["first"].append(tau * ell + emb + comm)
        rows["last"].append(tau * ell + head)
        rows["single"].append(tau * ell + emb + head)
    return DepthTables(tables=tables, groups=groups,
                       gpus=np.array([sum(tables.problem.cluster.nodes[n].count for n in g) for g in groups]),
                       ogroup=np.array([gof[tables.options[c].node] for c in rep], dtype=np.int64),
                       tp=np.array([tables.options[c].tp for c in rep], dtype=np.int64), rep=rep,
                       **{f"u_{k}": np.array(v) for k, v in rows.items()})


def memory_depends_on_depth(tables: CostTables, depth: int = 8, keep: float = 0.9) -> bool:
    """Whether memory at depth is worth this bound's time: the layers middle stages hold at ``depth``
    micro-batches in flight, summed over the options, are under ``keep`` of those at one (full
    recompute: 0.96-0.99 on the example clusters; selective 0.6-0.8; none 0.18-0.4). Only decides
    where time goes; the bound is valid either way."""
    L = tables.layers

    def held(v: int) -> int:
        return sum(min(L, max(0, tables.max_layers(o.index, False, False, v))) for o in tables.options)

    one = held(1)
    return one > 0 and held(depth) < keep * one


@dataclass(frozen=True)
class _Column:
    stages: tuple[tuple[int, int], ...]   # (class option, layers) from first to last
    g: np.ndarray                         # GPUs per node group
    total: float                          # S
    bottleneck: float                     # U
    cap: int                              # c_s: the most micro-batches its memory allows (≤ M)


def _column(dt: DepthTables, stages: tuple[tuple[int, int], ...], M: int) -> _Column | None:
    """The shape's S, U, GPUs per group and cap (None: it does not fit even one micro-batch)."""
    K = len(stages)
    u = []
    g = np.zeros(len(dt.groups), dtype=np.int64)
    for k, (o, ell) in enumerate(stages):
        pos = "single" if K == 1 else "first" if k == 0 else "last" if k == K - 1 else "mid"
        u.append(float(getattr(dt, f"u_{pos}")[o, ell - 1]))
        g[dt.ogroup[o]] += dt.tp[o]

    def fits(m: int) -> bool:
        for k, (o, ell) in enumerate(stages):
            pos = "single" if K == 1 else "first" if k == 0 else "last" if k == K - 1 else "mid"
            if ell > dt.lm(pos, dt.inflight(K - k, m))[o]:
                return False
        return True

    if not fits(1):
        return None
    lo, hi = 1, M  # memory grows with m: the largest m that fits, by bisection
    if fits(hi):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return _Column(stages=stages, g=g, total=sum(u), bottleneck=max(u), cap=lo)


class _DepthMaster:
    """max Σ x_s·min(r_s(t), c_s) s.t. Σ g_{s,n}·x_s ≤ G_n, Σ x_s = P, over the columns so far; an
    artificial column (no GPUs, value −big) keeps Σ x = P feasible while the columns are few."""

    BIG = 1e4

    def __init__(self, gpus: np.ndarray, P: int) -> None:
        self.gpus, self.P = gpus, P
        self.cols: list[_Column] = []
        self.keys: set[tuple] = set()

    def add(self, c: _Column) -> bool:
        if c.stages in self.keys:
            return False
        self.keys.add(c.stages)
        self.cols.append(c)
        return True

    def values(self, t: float) -> np.ndarray:
        """a_s(t) = min(r_s(t), c_s), −inf for columns with S > t (they run no micro-batch)."""
        S = np.array([c.total for c in self.cols])
        U = np.array([c.bottleneck for c in self.cols])
        cap = np.array([c.cap for c in self.cols], dtype=float)
        return np.where(S <= t, np.minimum(1.0 + (t - S) / U, cap), -math.inf)

    def solve(self, t: float) -> tuple[float, np.ndarray, float]:
        """V(t), group duals π ≥ 0 and the count dual μ (free)."""
        N = len(self.gpus)
        h = _highs()
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        for cap in self.gpus:
            h.addRow(-highspy.kHighsInf, float(cap), 0, np.zeros(0, dtype=np.int32), np.zeros(0))
        h.addRow(float(self.P), float(self.P), 0, np.zeros(0, dtype=np.int32), np.zeros(0))
        h.addCol(-self.BIG, 0.0, highspy.kHighsInf, 1, np.array([N], dtype=np.int32), np.array([1.0]))
        a = self.values(t) if self.cols else np.zeros(0)
        for c, ac in zip(self.cols, a):
            if not math.isfinite(ac):
                continue
            idx = [n for n in range(N) if c.g[n] > 0]
            h.addCol(float(ac), 0.0, highspy.kHighsInf, len(idx) + 1, np.array([*idx, N], dtype=np.int32),
                     np.array([*(float(c.g[n]) for n in idx), 1.0]))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return -math.inf, np.zeros(N), 0.0
        sol = h.getSolution()
        duals = np.asarray(sol.row_dual)
        return h.getInfo().objective_function_value, np.maximum(0.0, duals[:N]), float(duals[N])


class _Pricer:
    """The certificate's μ' (module docstring) over cap classes [v_i, v_{i+1}) of v = 1, 2, 4, … and
    a top class of shapes whose memory allows every m ≤ M, with the argmin shapes as candidate
    columns."""

    def __init__(self, dt: DepthTables, M: int) -> None:
        self.dt, self.M = dt, M
        self.depth = deepest_stage(dt, M)
        vs = [1]
        while vs[-1] * 2 < M:
            vs.append(vs[-1] * 2)
        self.vs = [*vs, M] if M > 1 else [1]
        self.class_tabs = {v: dt.class_tables(v, self.depth) for v in self.vs}
        finite = [x[np.isfinite(x)] for x in (dt.u_mid, dt.u_first, dt.u_last, dt.u_single)]
        self.u_lo = max(1e-9, min(float(f.min()) for f in finite if f.size))

    def _dp(self, v: int, caps: np.ndarray, weights: np.ndarray, alpha: float, pg: np.ndarray):
        dt = self.dt
        mid, first, last, single = self.class_tabs[v]
        return depth_dp(caps, weights, float(alpha), pg, dt.u_mid, dt.u_first, dt.u_last, dt.u_single,
                        mid, first, last, single)

    def price(self, t: float, pi: np.ndarray, edges: np.ndarray, need: float, certify: bool = True
              ) -> tuple[float, list[tuple], np.ndarray]:
        """μ' (an upper bound on max_s min(r_s, c_s) − π·g_s over shapes with S ≤ t), the argmin
        stage lists, and per box the largest bound that decides a class's term (for refining).
        ``need``: the level μ' must stay under to certify; a class whose plain terms exceed it is
        bounded again with the multipliers of :data:`MULTIPLIERS` (module docstring) when ``certify``
        (else λ = 1 alone: valid, weaker, and where the improving columns come from)."""
        pg = pi[self.dt.ogroup] * self.dt.tp
        keep = edges[:-1] < t  # boxes of U above t hold no shape with S ≤ t
        lo, hi = edges[:-1][keep], np.minimum(edges[1:][keep], t)
        found: list[tuple] = []
        per_box = np.full(len(edges) - 1, -math.inf)
        mu = -math.inf

        def boxes(v: int, lam: float, alpha: float, sel: np.ndarray | slice = slice(None)) -> np.ndarray:
            """Per box (of ``sel``): max over its shapes with S ≤ t of λ·r − π·g + γ·(t − S)/u_i
            (γ = α − λ ≥ 0)."""
            vals, rows, counts = self._dp(v, hi[sel], lo[sel], alpha, pg)
            for k in range(len(vals)):
                if math.isfinite(vals[k]):
                    found.append(tuple((int(o), int(ell)) for o, ell in rows[k, :counts[k]]))
            return lam + (alpha * t - vals) / lo[sel]

        for i, v in enumerate(self.vs):
            bound = boxes(v, 1.0, 1.0)
            if certify and len(bound) and bound.max() > need:  # caps in [v, next v): ≤ next v − 1 micro-batches (last: M)
                top = self.vs[i + 1] - 1 if i + 1 < len(self.vs) else self.M
                for lam, alpha in MULTIPLIERS:  # per box, the least of (1 − λ)·top + the bound above
                    sel = np.flatnonzero(bound > need)  # only the boxes that still stop the certificate
                    bound[sel] = np.minimum(bound[sel], (1.0 - lam) * top + boxes(v, lam, alpha, sel))
                    if bound.max() <= need:
                        break
            if len(bound):
                mu = max(mu, float(bound.max()))
                per_box[keep] = np.maximum(per_box[keep], bound)
        return mu, found, per_box


def deepest_stage(dt: DepthTables, M: int) -> int:
    """Depth states the DP needs: one more than the deepest a middle or first stage holding a layer
    can sit with M micro-batches (no stage fits there), at most the layers and GPUs."""
    cap = min(dt.layers, int(dt.gpus.sum()), M)
    d = 1
    while d < cap and any((dt.lm(pos, dt.inflight(d + 1, M)) >= 1).any() for pos in ("mid", "first")):
        d += 1
    return min(cap, d + 1)


def _edges(lo: float, hi: float, ratio: float) -> np.ndarray:
    n = max(1, math.ceil(math.log(hi / lo) / math.log(ratio)))
    return lo * (hi / lo) ** (np.arange(n + 1) / n)


def _refine(edges: np.ndarray, per_box: np.ndarray, cut: float) -> np.ndarray:
    """Split every box whose bound reaches ``cut`` in two (geometric midpoint)."""
    out = [edges[0]]
    for i in range(len(edges) - 1):
        if per_box[i] >= cut:
            out.append(math.sqrt(edges[i] * edges[i + 1]))
        out.append(edges[i + 1])
    return np.array(out)


class DepthRun:
    """The depth bound of one P, resumable round by round (:meth:`step`): column generation at the
    master's root, each round certifying just below it (``rel_tol``, widened when the pricing
    cannot close); ``proven`` is a valid lower bound on the slowest pipeline of every plan with P
    pipelines (0 until a certificate), ``upper`` only brackets the search."""

    def __init__(self, dt: DepthTables, P: int, upper: float, pricer: _Pricer, rel_tol: float = 2e-3) -> None:
        self.dt, self.P, self.upper, self.pricer, self.rel_tol = dt, P, upper, pricer, rel_tol
        self.M = dt.tables.micro_batches
        self.master = _DepthMaster(dt.gpus, P)
        self.proven = 0.0
        self.done = False
        self.edges = _edges(pricer.u_lo, max(upper, pricer.u_lo * 1.01), BOX_RATIO)
        self.eps = rel_tol
        self.certify = False  # the multipliers only once λ = 1 prices no new column
        self.at_upper = True  # until upper itself fails to certify with every multiplier
        self.stalls = 0  # rounds since the last new column that neither certified nor found one

    def step(self) -> None:
        """One round: price at the master's duals, certify or add columns or refine."""
        M, upper, dt = self.M, self.upper, self.dt
        master = self.master
        root = _root(master, M, self.proven, upper) if master.cols else upper
        if self.at_upper and root >= upper * (1 - 1e-9) and master.solve(upper)[0] < M * (1 - 1e-9):
            t = upper  # the columns so far cannot reach M within upper: try to certify upper itself
        else:
            t = max(self.proven, root * (1 - self.eps))
        _, pi, mu0 = master.solve(t)
        need = (M * (1 - 1e-9) - float(pi @ dt.gpus)) / self.P
        mu, found, per_box = self.pricer.price(t, pi, self.edges, need, self.certify)
        if mu < need:
            self.proven = max(self.proven, min(t, upper))
        added = 0
        for stages in set(found):  # the argmins the master would take (positive reduced value)
            col = _column(dt, stages, M)
            if col is not None and col.total <= t and min(1.0 + (t - col.total) / col.bottleneck, col.cap) \
                    - float(col.g @ pi) - mu0 > 1e-9 and master.add(col):
                added += 1
        if added:
            self.certify, self.stalls = False, 0
            return
        if not self.certify and mu >= need:  # the same t again, with the multipliers
            self.certify = True
            return
        if mu < need:  # certified with no new column: done unless the root is still above it
            if t >= upper * (1 - 1e-9) or self.proven >= root * (1 - 2 * self.rel_tol):
                self.done = True
            self.eps = max(self.rel_tol, self.eps / 2)
            return
        self.stalls += 1
        if self.stalls > MAX_STALLS:
            self.done = True
        if t >= upper * (1 - 1e-9):
            self.at_upper = False
        if len(self.edges) < 4 * MAX_BOXES:  # no new column, not certified: finer boxes, then a wider margin
            self.edges = _refine(self.edges, per_box, need)
        self.eps = min(0.1, self.eps * 2)


def depth_pipeline_bound(dt: DepthTables, P: int, upper: float, *, deadline: float, rel_tol: float = 2e-3,
                         max_rounds: int = 200, keep: list | None = None) -> float:
    """Seconds: a valid lower bound on the slowest pipeline of every plan with P pipelines (0 when
    nothing could be certified in time), by :class:`DepthRun` until it is done or ``deadline``."""
    run = DepthRun(dt, P, upper, _Pricer(dt, dt.tables.micro_batches), rel_tol)
    if keep is not None:  # the caller inspects the master (scratch measurements)
        keep.append(run.master)
    for _ in range(max_rounds):
        if run.done or time.monotonic() > deadline:
            break
        run.step()
    return run.proven


MAX_BOXES = 2000  # refinement stops at four times this many boxes of U
# rounds without a new column nor a certificate before a P gives up: each splits boxes, so rounds grow
# about twofold (small-mixed's P = 1 reached 18 s at the tenth); on het1-3 none past the third raised a bound
MAX_STALLS = 4


def _root(master: _DepthMaster, M: int, lo: float, hi: float) -> float:
    """Just below the least t in [lo, hi] with V(t) ≥ M (bisection on the master alone)."""
    reach = M * (1 - 1e-9)
    if master.solve(hi)[0] < reach:
        return hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if master.solve(mid)[0] >= reach:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    return lo


def depth_lower_bounds(tables: CostTables, pmax: int, upper_s: float, *, deadline: float,
                       only: frozenset[int] | None = None, max_rounds: int = 200) -> dict[int, float]:
    """Per pipeline count P: a valid lower bound on the iteration time of every plan with P
    pipelines (the depth bound plus the sync and optimizer floors), each P as far as time allowed.
    Best first: each round goes to the unfinished P of least bound so far (the least over P is
    the planner's bound), ties to the fewer pipelines."""
    dt = depth_tables(tables)
    pricer = _Pricer(dt, tables.micro_batches)
    runs: dict[int, tuple[float, DepthRun]] = {}
    for P in range(1, pmax + 1):
        if only is None or P in only:
            rest = rest_lower_bound(tables, P)
            runs[P] = (rest, DepthRun(dt, P, max(upper_s - rest, 1e-6), pricer))
    rounds = {P: 0 for P in runs}
    last = {P: 0.0 for P in runs}  # seconds of each P's last round: one that would overrun the deadline waits
    while (now := time.monotonic()) < deadline:
        live = [P for P, (_, run) in runs.items() if not run.done and rounds[P] < max_rounds
                and now + last[P] <= deadline]
        if not live:
            break
        P = min(live, key=lambda q: (runs[q][0] + runs[q][1].proven, q))
        runs[P][1].step()
        rounds[P] += 1
        last[P] = time.monotonic() - now
    return {P: rest + run.proven for P, (rest, run) in runs.items()}
