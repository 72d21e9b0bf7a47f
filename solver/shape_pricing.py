"""Pipeline shapes and their pricing: the shortest-path DP behind the fluid bound (docs/formulation.md §14).

A *shape* is an ordered list of stages (option c = node and TP degree, ℓ ≥ 1 layers) with its sum
S = Σ u_k and bottleneck U = max u_k of the evaluator's tabulated stage times. :class:`ShapePricer`
finds, for batches of caps on u (and optionally on w, and a floor on U), the shape minimising
S + w·π·g (π = node multipliers, g = GPUs used per node) by a vectorised backward DP over (layers
covered, node of the next stage and GPUs its run of consecutive stages on that node uses).

*Extras* (w): per-stage floors on the plan's gradient-sync plus optimizer seconds for a given number
of pipelines and layer locality (:mod:`.stage_floors`); the DP can cap them like u.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hexhelix.ir.plan import Plan

from . import shape_dp_jit, shape_labels_jit
from .candidates import CostTables
from .stage_floors import (
    NO_LOCALITY,
    Locality,
    StageExtras,
    stage_extras,
    stage_maxima,
    sync_tables,
    w_of_maxima,
)

__all__ = ["Shape", "ShapePricer", "micro_batches_within", "pricer_for", "shape_from_stages", "shape_of_pipeline"]


@dataclass(frozen=True, slots=True)
class Shape:
    """An ordered pipeline shape: ``stages`` = ((option, layers), ...), per-node GPU use, S and U."""

    stages: tuple[tuple[int, int], ...]
    gpus: tuple[int, ...]
    total: float        # S = Σ u_k
    bottleneck: float   # U = max u_k

    def micro_batches_within(self, t: float) -> float:
        """r(t) = 1 + (t − S)/U: the most micro-batches this shape runs within t (fractional)."""
        return micro_batches_within(t, self.total, self.bottleneck)


def micro_batches_within(t: float | np.ndarray, total: float | np.ndarray,
                         bottleneck: float | np.ndarray) -> float | np.ndarray:
    """r = 1 + (t − S)/U for shapes of sum S and bottleneck U (scalars or arrays of columns): a
    pipeline's first micro-batch takes S, each further one U."""
    return 1.0 + (t - total) / bottleneck


@dataclass(frozen=True, slots=True)
class _States:
    """The DP's state space for one set of required nodes V: (node a of the next stage, GPUs r its
    run of consecutive stages on a uses, mask m of the nodes of V that the stages from here on
    visit), with the transition tables the vectorised recursion gathers from."""

    S: int                  # number of states
    masks: int              # 2^|V|
    first_ok: np.ndarray    # (C, S) c fits before s and the shape then visits every node of V
    single_ok: np.ndarray   # (C,) a one-stage shape of option c visits every node of V
    run_after: np.ndarray   # (C, S) GPUs of the run that starts with c placed before s (0 where invalid)
    gather: np.ndarray      # (S, width) candidates into [continue a run (C·S) | fresh run (C·masks) | inf]
    fresh_sel: np.ndarray   # (masks, C, S) c starts a fresh run before s (another node) that gets mask m
    last_into: np.ndarray   # (S, C) the state a last stage of option c is
    u_mid_s: np.ndarray     # (C, L, S) middle stage times towards each state's node
    u_first_s: np.ndarray   # (C, L, S)
    snode: np.ndarray       # (S,) node of each state
    ns: np.ndarray          # (C, S) the state after placing c before s (−1: not allowed)
    last_state: np.ndarray  # (C,) the state a last stage of option c is (−1: none)
    smask: np.ndarray       # (S,) required-node mask of each state
    fresh_to: np.ndarray    # (C, masks) the state a fresh run of c starts before a suffix of mask m (−1: none)


def _build_states(pricer: ShapePricer, visit: tuple[int, ...], vcap: tuple[int, ...] = ()) -> _States:
    """States and transitions for shapes that must use a GPU of every node in ``visit``, with no run
    on such a node above its ``vcap`` GPUs and a single run where that cap is 1
    (:func:`.stage_floors.fits_visits`)."""
    opts = pricer.t.options
    C = pricer.C
    bit = {n: 1 << i for i, n in enumerate(visit)}
    full_mask = (1 << len(visit)) - 1
    masks = 1 << len(visit)
    counts = [node.count for node in pricer.t.problem.cluster.nodes]
    for n, cap in zip(visit, vcap):
        counts[n] = min(counts[n], cap)                   # a run on a visited node stays within its cap
    once = {n for n, cap in zip(visit, vcap) if cap == 1}  # one GPU there: a second run is not allowed
    states = [(a, r, m) for a in range(pricer.N) for r in range(1, counts[a] + 1) for m in range(masks)
              if m & bit.get(a, 0) == bit.get(a, 0)]
    sidx = {st: i for i, st in enumerate(states)}
    S = len(states)
    snode = np.array([a for a, _, _ in states])
    ns = np.full((C, S), -1, dtype=np.int64)  # state after putting option c before state s (−1: none)
    fresh_mask = np.zeros((C, S), dtype=np.int64)
    again = np.zeros((C, S), dtype=bool)     # a fresh run on a once-only node the suffix already used
    for c, o in enumerate(opts):
        for sb, (b, rb, mb) in enumerate(states):
            r = o.tp + (rb if b == o.node else 0)
            fresh_mask[c, sb] = mb | bit.get(o.node, 0)
            again[c, sb] = b != o.node and o.node in once and bool(mb & bit[o.node])
            ns[c, sb] = -1 if again[c, sb] else sidx.get((o.node, r, mb | bit.get(o.node, 0)), -1)
    valid = ns >= 0
    state_mask = np.array([m for _, _, m in states])
    first_ok = valid & (state_mask[np.maximum(ns, 0)] == full_mask)
    single_ok = np.array([bit.get(o.node, 0) == full_mask and o.tp <= counts[o.node] for o in opts])
    state_r = np.array([r for _, r, _ in states])
    run_after = np.where(valid, state_r[np.maximum(ns, 0)], 0)
    # candidates of each state (a, r, m): option c (tp t) on a before the run (a, r − t, m) it extends,
    # or a fresh run of c (tp r) after a stage on another node whose mask, plus c's node, is m
    pairs: list[list[int]] = [[] for _ in range(S)]
    for c, o in enumerate(opts):
        for sb, (b, _, _) in enumerate(states):
            if b == o.node and ns[c, sb] >= 0:
                pairs[ns[c, sb]].append(c * S + sb)
        for m in range(masks):
            if (o.node, o.tp, m) in sidx:
                pairs[sidx[(o.node, o.tp, m)]].append(C * S + c * masks + m)
    width = max(1, max(len(x) for x in pairs))
    gather = np.full((S, width), C * S + C * masks, dtype=np.int64)
    for i, x in enumerate(pairs):
        gather[i, : len(x)] = x
    other_node = np.array([[b != o.node for b, _, _ in states] for o in opts])
    fresh_sel = np.stack([other_node & ~again & (fresh_mask == m) for m in range(masks)])
    fresh_to = np.full((C, masks), -1, dtype=np.int64)
    for c, o in enumerate(opts):
        for m in range(masks):
            if not (o.node in once and m & bit[o.node]):
                fresh_to[c, m] = sidx.get((o.node, o.tp, m | bit.get(o.node, 0)), -1)
    last_into = np.zeros((S, C), dtype=bool)
    last_state = np.full(C, -1, dtype=np.int64)
    for c, o in enumerate(opts):
        if (o.node, o.tp, bit.get(o.node, 0)) in sidx:
            last_state[c] = sidx[(o.node, o.tp, bit.get(o.node, 0))]
            last_into[last_state[c], c] = True
    return _States(S=S, masks=masks, first_ok=first_ok, single_ok=single_ok,
                   run_after=run_after, gather=gather, fresh_sel=fresh_sel,
                   last_into=last_into, u_mid_s=pricer.u_mid[:, :, snode], u_first_s=pricer.u_first[:, :, snode],
                   snode=snode, ns=ns, last_state=last_state, smask=state_mask, fresh_to=fresh_to)


class ShapePricer:
    """Shortest paths over (layers covered, state of the next stage) for batches of caps."""

    def __init__(self, tables: CostTables, engine: str = "auto") -> None:
        if engine not in ("auto", "numpy", "jit"):
            raise ValueError(f"engine must be auto, numpy or jit, not {engine!r}")
        if engine == "jit" and not shape_dp_jit.AVAILABLE:
            raise ValueError("engine 'jit' needs numba, which is not installed")
        # the compiled loops where numba is there (:mod:`.shape_dp_jit`), the vectorised numpy DP else
        self.engine = engine if engine != "auto" else "jit" if shape_dp_jit.AVAILABLE else "numpy"
        self.t = tables
        L = tables.layers
        self.L = L
        self.N = len(tables.problem.cluster.nodes)
        opts = tables.options
        self.C = len(opts)
        self.node = np.array([o.node for o in opts])
        self.tp = np.array([o.tp for o in opts], dtype=float)
        self.node_list, self.tp_list = [o.node for o in opts], [o.tp for o in opts]
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
        self._states: dict[tuple[tuple[int, ...], tuple[int, ...]], _States] = {}
        self._shapes: dict[tuple[tuple[int, int], ...], Shape] = {}  # :meth:`shape` by stage list
        self._full: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # (full, full_fresh) by states and room
        n_gpus = tables.problem.cluster.num_gpus
        self.u_floor = L * float(tau.min()) / max(1, min(L, n_gpus))
        # S of any first j layers (j ≥ 1): every stage takes ≥ τ_min per layer, the first its embedding too
        self.prefix_floor = np.array([0.0] + [j * float(tau.min()) + max(0.0, float(emb.min())) for j in range(1, L + 1)])
        self._extras: dict[tuple[int, Locality], StageExtras] = {}
        self._w_memo: dict[int, tuple[StageExtras, dict[tuple, tuple[float, float, float]]]] = {}  # stage_maxima
        self._sync: dict[tuple, tuple[StageExtras, StageExtras]] = {}  # sync_tables by (table, caps)
        z = np.zeros((1, 1, 1))  # placeholders the compiled DP never reads when it has no extras
        self._no_extras = StageExtras(mid=z, first=z, last=z, single=z, mid_full=z, first_full=z)

    def solve(self, caps: np.ndarray, weights: np.ndarray, pi: np.ndarray,
              wcaps: np.ndarray | None = None, extras: StageExtras | None = None,
              lows: np.ndarray | None = None, slopes: np.ndarray | None = None) -> tuple[np.ndarray, list]:
        """For each k: min over shapes with every u ≤ caps[k] (and every run of consecutive stages on
        one node within its GPUs; with ``extras``, every stage's w ≤ wcaps[k]) of S + weights[k]·π·g;
        the values (inf when no shape fits) and the argmin shapes (None when infeasible). ``slopes``:
        each stage's share π_n·t of π·g is weighted by max(weights[k], slopes[k]·u) instead, u being
        its own time (a box whose shapes have U > lo pays U·π·g ≥ Σ π_n·t·max(lo, u): docs §14). ``lows``:
        only shapes with U > lows[k] (a box's floor, so its argmin lies in it) — the compiled engine
        only; the numpy oracle ignores the floor, which relaxes the minimum (still a lower bound). States:
        (node of the next stage, GPUs its run uses, which of the nodes ``extras.visit`` requires of
        every shape the stages from there on use: only shapes using all of them, within their room,
        are admitted — :func:`.stage_floors.fits_visits`)."""
        st, full, full_fresh = self._prepared(extras)
        caps = np.asarray(caps, dtype=float)
        weights = np.asarray(weights, dtype=float)
        slopes = np.zeros(len(caps)) if slopes is None else np.asarray(slopes, dtype=float)
        if self.engine == "jit":
            return self._solve_jit(st, caps, weights, slopes, pi, wcaps, extras, full, full_fresh, lows)
        return self._solve_numpy(st, caps, weights, slopes, pi, wcaps, extras, full)

    def _prepared(self, extras: StageExtras | None) -> tuple[_States, np.ndarray, np.ndarray]:
        """The states of ``extras``' required nodes and the runs that leave no room for the other
        replicas (``full`` per option and state, ``full_fresh`` per option), both remembered."""
        visit = extras.visit if extras is not None else ()
        key = (visit, tuple(extras.visit_cap(n) for n in visit) if extras is not None else ())
        st = self._states.get(key)
        if st is None:
            if len(self._states) > 8:  # a few MB each at 56 GPUs: keep the recent required-node sets only
                self._states.clear()
            st = self._states[key] = _build_states(self, *key)
        room = (extras.replicas, extras.caps) if extras is not None else None
        hit = self._full.get((key, room))
        if hit is None:
            full = np.zeros((self.C, st.S), dtype=bool)
            full_fresh = np.zeros(self.C, dtype=bool)
            if extras is not None:  # runs that leave no room on their node for the other replicas
                caps_n = np.array(extras.caps)[self.node]
                full = (extras.replicas >= 2) & (st.run_after + extras.replicas - 1 > caps_n[:, None])  # (C, S)
                full_fresh = (extras.replicas >= 2) & (self.tp + extras.replicas - 1 > caps_n)  # the stage alone
            if len(self._full) > 64:
                self._full.clear()
            hit = self._full[(key, room)] = (full, full_fresh)
        return st, hit[0], hit[1]

    def solve_whole(self, caps: np.ndarray, lows: np.ndarray, wcaps: np.ndarray | None, scale: np.ndarray,
                    kp: float, ubs: np.ndarray, pi: np.ndarray, extras: StageExtras | None = None,
                    cap_labels: int = 32) -> tuple[np.ndarray, list, bool]:
        """For each box k: min over shapes with lows[k] < U ≤ caps[k] (every w ≤ wcaps[k]) of
        S + scale[k]·max(0, ⌊π·g + kp⌋) — exact, by Pareto labels of (S, π·g)
        (:mod:`.shape_labels_jit`), among the shapes whose value is below ubs[k] (inf: none is). Returns
        the values, the argmin shapes and whether a label front overflowed ``cap_labels`` (then the
        values are lower bounds, still valid). Compiled engine only."""
        if not shape_labels_jit.AVAILABLE:
            raise RuntimeError("exact whole-batch pricing needs numba")
        st, full, full_fresh = self._prepared(extras)
        K = len(caps)
        wk = np.full(K, math.inf) if wcaps is None or extras is None else np.asarray(wcaps, dtype=float)
        vals, rows, counts, relaxed = shape_labels_jit.solve_labels(
            np.asarray(caps, dtype=float), np.asarray(lows, dtype=float), wk, np.asarray(scale, dtype=float),
            float(kp), np.asarray(ubs, dtype=float), self.prefix_floor, np.asarray(pi, dtype=float)[self.node] * self.tp,
            int(cap_labels),
            *self._compiled_tables(st, full, full_fresh, extras))
        return vals, self._argmins(vals, rows, counts), bool(relaxed)

    def _solve_jit(self, st: _States, caps: np.ndarray, weights: np.ndarray, slopes: np.ndarray, pi: np.ndarray,
                   wcaps: np.ndarray | None, extras: StageExtras | None, full: np.ndarray,
                   full_fresh: np.ndarray, lows: np.ndarray | None = None) -> tuple[np.ndarray, list]:
        """:meth:`solve` by the compiled loops of :mod:`.shape_dp_jit`."""
        K = len(caps)
        has_low = lows is not None and bool(np.any(np.asarray(lows) > -math.inf))
        lk = np.asarray(lows, dtype=float) if has_low else None
        wk = np.full(K, math.inf) if wcaps is None or extras is None else np.asarray(wcaps, dtype=float)
        vals, rows, counts = shape_dp_jit.solve_batch(
            caps, lk, weights, slopes, wk, np.asarray(pi, dtype=float)[self.node] * self.tp,
            *self._compiled_tables(st, full, full_fresh, extras))
        return vals, self._argmins(vals, rows, counts)

    def _compiled_tables(self, st: _States, full: np.ndarray, full_fresh: np.ndarray,
                         extras: StageExtras | None) -> tuple:
        """The arguments both compiled DPs (:mod:`.shape_dp_jit`, :mod:`.shape_labels_jit`) end with:
        stage times, states, room flags, required-node mask and the floor tables."""
        ex = extras if extras is not None else self._no_extras
        return (self.u_mid, self.u_first, self.u_last, self.u_single, self.node,
                st.snode, st.smask, st.ns, st.fresh_to, st.last_state, st.single_ok, full, full_fresh,
                (1 << len(extras.visit if extras is not None else ())) - 1, extras is not None,
                ex.mid, ex.mid_full, ex.first, ex.first_full, ex.last, ex.single)

    def _argmins(self, vals: np.ndarray, rows: np.ndarray, counts: np.ndarray) -> list:
        """The compiled DPs' argmins as shapes: rows[k, :counts[k]] are (option, layers) pairs; None
        where no shape fits (value inf)."""
        return [self.shape(tuple(map(tuple, rows[k, : counts[k]].tolist()))) if math.isfinite(vals[k]) else None
                for k in range(len(vals))]

    def _solve_numpy(self, st: _States, caps: np.ndarray, weights: np.ndarray, slopes: np.ndarray, pi: np.ndarray,
                     wcaps: np.ndarray | None, extras: StageExtras | None, full: np.ndarray) -> tuple[np.ndarray, list]:
        """:meth:`solve` vectorised over the caps (the oracle of the compiled form)."""
        K, L, C, S, Mk = len(caps), self.L, self.C, st.S, st.masks
        inf = math.inf
        if extras is None:
            wk = None
        else:
            wk = np.full((K, 1), inf) if wcaps is None else np.asarray(wcaps, dtype=float)[:, None]  # (K, 1)

        def wrun(base: np.ndarray, fulls: np.ndarray, start: int, n_len: int) -> np.ndarray:
            """(K, C, ℓ, S): the stage's w (by the run it starts) fits the cap."""
            w = np.where(full[:, None, :], fulls[:, start, :n_len, None], base[:, start, :n_len, None])
            return w[None] <= wk[:, :, None, None]

        def wok(w: np.ndarray | None) -> np.ndarray | bool:
            """(K, C): a last or single stage's w (C,) fits the cap (its run is the stage itself)."""
            return True if wk is None or w is None else w[None, :] <= wk
        pen_base = pi[self.node] * self.tp                                                # (C,)

        def pen(u: np.ndarray) -> np.ndarray:
            """(K, C, ...): π_n·t·max(weights[k], slopes[k]·u) of stages of time u (C, ...)."""
            extra = (1,) * (u.ndim - 1)
            wk, sk = weights.reshape(-1, 1, *extra), slopes.reshape(-1, 1, *extra)
            with np.errstate(invalid="ignore"):  # u = inf (over the memory cap) is masked out by the caller
                return pen_base.reshape(1, -1, *extra) * np.maximum(wk, sk * u[None])
        G = np.full((L + 1, K, S), inf)
        back: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        capk = caps[:, None, None, None]
        for j in range(L - 1, 0, -1):
            span = L - j
            ul = self.u_last[:, span - 1]
            okl = (ul[None, :] <= caps[:, None]) & wok(extras.last[:, j, span - 1] if extras else None)
            lv = np.where(okl, ul[None, :] + pen(ul), inf)                               # (K, C)
            lm = np.where(st.last_into[None], lv[:, None, :], inf)                     # (K, S, C)
            lc = lm.argmin(axis=2)
            new = np.take_along_axis(lm, lc[:, :, None], 2)[:, :, 0]
            code = C * S + lc
            lsel = None
            if span > 1:
                um = st.u_mid_s[:, : span - 1, :]                                       # (C, ℓ, S)
                nxt = G[j + 1: L].transpose(1, 0, 2)                                     # (K, ℓ, S)
                okm = (um[None] <= capk) & wrun(extras.mid, extras.mid_full, j, span - 1) if extras else um[None] <= capk
                val = np.where(okm, um[None] + nxt[:, None] + pen(um), inf)              # (K, C, ℓ, S)
                lsel = val.argmin(axis=2)                                                # (K, C, S)
                mv = np.take_along_axis(val, lsel[:, :, None, :], 2)[:, :, 0, :]
                # a fresh run of c (after a stage on another node), by the mask it then has
                fresh_s = np.empty((K, C, Mk), dtype=np.int64)
                fresh = np.empty((K, C, Mk))
                for m in range(Mk):
                    fresh_m = np.where(st.fresh_sel[m][None], mv, inf)                   # (K, C, S)
                    fresh_s[:, :, m] = fresh_m.argmin(axis=2)
                    fresh[:, :, m] = np.take_along_axis(fresh_m, fresh_s[:, :, m, None], 2)[:, :, 0]
                ext = np.concatenate([mv.reshape(K, C * S), fresh.reshape(K, C * Mk), np.full((K, 1), inf)],
                                     axis=1)
                into = ext[:, st.gather]                                                 # (K, S, width)
                gi = into.argmin(axis=2)
                mvals = np.take_along_axis(into, gi[:, :, None], 2)[:, :, 0]
                mi = st.gather[np.arange(S)[None, :], gi]
                # a fresh run: recover the successor state of the chosen option
                is_fresh = mi >= C * S
                cf, mf = np.divmod(np.clip(mi - C * S, 0, C * Mk - 1), Mk)
                succ = fresh_s[np.arange(K)[:, None], cf, mf]
                mi = np.where(is_fresh, cf * S + succ, mi)
                better = mvals < new
                new = np.where(better, mvals, new)
                code = np.where(better, mi, code)
            G[j] = new
            back[j] = (code, lsel)
        us = self.u_single[:, L - 1]
        oks = (us[None, :] <= caps[:, None]) & wok(extras.single[:, 0, L - 1] if extras else None) & st.single_ok[None]
        best = np.where(oks, us[None, :] + pen(us), inf)                                # (K, C)
        choice = np.full((K, C), -1, dtype=np.int64)
        if L > 1:
            uf = st.u_first_s[:, : L - 1, :]
            nxt = G[1:L].transpose(1, 0, 2)
            okf = (uf[None] <= capk) & st.first_ok[None, :, None, :]
            if extras is not None:
                okf = okf & wrun(extras.first, extras.first_full, 0, L - 1)
            val = np.where(okf, uf[None] + nxt[:, None] + pen(uf), inf)
            flat = val.reshape(K, C, -1)
            idx = flat.argmin(axis=2)
            mv = np.take_along_axis(flat, idx[:, :, None], 2)[:, :, 0]
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

    def shape(self, stages: Sequence[tuple[int, int]]) -> Shape:
        """Exact S and U of an ordered stage list from the tabulated evaluator pieces (remembered:
        the pricing meets the same shapes again and again)."""
        key = tuple(stages)
        hit = self._shapes.get(key)
        if hit is None:
            if len(self._shapes) > 200_000:
                self._shapes.clear()
            hit = self._shapes[key] = self._new_shape(key)
        return hit

    def stage_times(self, stages: Sequence[tuple[int, int]]) -> list[float]:
        """u of each stage of an ordered stage list (its position's piece, the send to the next node)."""
        K = len(stages)
        u = []
        for k, (c, ell) in enumerate(stages):
            nxt = self.node[stages[k + 1][0]] if k + 1 < K else None
            if K == 1:
                u.append(float(self.u_single[c, ell - 1]))
            elif k == 0:
                u.append(float(self.u_first[c, ell - 1, nxt]))
            elif nxt is None:
                u.append(float(self.u_last[c, ell - 1]))
            else:
                u.append(float(self.u_mid[c, ell - 1, nxt]))
        return u

    def _new_shape(self, stages: tuple[tuple[int, int], ...]) -> Shape:
        u = self.stage_times(stages)
        g = [0] * self.N
        for c, _ in stages:
            g[self.node[c]] += int(self.tp[c])
        return Shape(stages=tuple(stages), gpus=tuple(g), total=float(sum(u)), bottleneck=float(max(u)))

    def extras(self, replicas: int, locality: Locality = NO_LOCALITY) -> StageExtras:
        """Per-stage floors on sync + optimizer seconds with ``replicas`` pipelines under ``locality``
        (:mod:`.stage_floors`; cached)."""
        key = (replicas, locality)
        hit = self._extras.get(key)
        if hit is None:
            if len(self._extras) > 64:
                self._extras.clear()
            hit = self._extras[key] = stage_extras(self.t, replicas, locality)
        return hit

    def sync_tables(self, extras: StageExtras, o_cap: float, w_cap: float = math.inf) -> StageExtras:
        """:func:`.stage_floors.sync_tables` of ``extras`` (remembered: a certificate's boxes share a
        few optimizer caps)."""
        key = (id(extras), o_cap, w_cap)
        hit = self._sync.get(key)
        if hit is None or hit[0] is not extras:
            if len(self._sync) > 64:
                self._sync.clear()
            hit = self._sync[key] = (extras, sync_tables(extras, o_cap, w_cap))
        return hit[1]

    def stage_maxima(self, stages: tuple[tuple[int, int], ...], extras: StageExtras) -> tuple[float, float, float]:
        """(max w, max σ, max o) of a shape's stages (:func:`.stage_floors.stage_maxima`), remembered
        per floor table (:meth:`stage_w` reads them)."""
        memo = self._memo_of(extras)
        got = memo.get(stages)
        if got is None:
            if len(memo) > 200_000:
                memo.clear()
            got = memo[stages] = stage_maxima(stages, extras, self.node_list, self.tp_list)
        return got

    def _memo_of(self, extras: StageExtras) -> dict[tuple, tuple[float, float, float]]:
        held = self._w_memo.get(id(extras))
        if held is None or held[0] is not extras:  # (the table itself is kept: its id is not reused)
            if len(self._w_memo) > 64:
                self._w_memo.clear()
            held = self._w_memo[id(extras)] = (extras, {})
        return held[1]

    def stage_w(self, stages: tuple[tuple[int, int], ...], extras: StageExtras, *, joint: bool = True) -> float:
        """W = max over the stages of w (:func:`.stage_floors.stage_w`), from the remembered
        :meth:`stage_maxima`: the certificates of one run (and of a resumed leaf) meet the same shapes
        again and again."""
        return w_of_maxima(self.stage_maxima(stages, extras), extras, joint=joint)


def shape_of_pipeline(tables: CostTables, plan: Plan, p: int) -> Shape:
    """The shape of pipeline ``p`` of ``plan`` (S and U from the same tabulated pieces)."""
    idx = {(o.node, o.tp): o.index for o in tables.options}
    return shape_from_stages(tables, [(idx[(st.node, st.tp)], st.num_layers) for st in plan.pipelines[p].stages])


def shape_from_stages(tables: CostTables, stages: list[tuple[int, int]]) -> Shape:
    """The shape of an ordered list of (option index, layers); S and U are inf when a stage breaks
    the lenient memory cap (one micro-batch in flight)."""
    return pricer_for(tables).shape(stages)


_PRICERS: dict[int, tuple[CostTables, ShapePricer]] = {}


def pricer_for(tables: CostTables) -> ShapePricer:
    """The (cached) pricer of ``tables``: one at a time, rebuilt when the tables change."""
    hit = _PRICERS.get(id(tables))
    if hit is None or hit[0] is not tables:
        _PRICERS.clear()
        hit = (tables, ShapePricer(tables))
        _PRICERS[id(tables)] = hit
    return hit[1]
