"""The fluid bound's certificate: T_cert(π, μ), a lower bound on the iteration time valid for any
multipliers, by branch and bound over boxes of the pricing DP (docs/formulation.md §14).

For multipliers π ≥ 0 (node rows) and μ (pipeline count) of the fluid master (:mod:`.fluid_bound`),
no plan finishes before min over shapes of S + W + U·max(0, π·g + κ) — or, counting whole
micro-batches, S + W + U·max(0, ⌊π·g + κ + 1⌋). The minimum over shapes is a shortest path whose
maxima (U, the largest sync σ and the largest optimizer step o behind W, and π·g for whole batches)
are handled by boxes: each box's DP relaxes them to its edges and gives a valid bound for its shapes,
and the box of least bound is cut along the dimension whose relaxation costs its own argmin most,
until that bound meets the best shape found (closed) or a limit stops it (still valid, unclosed).
:class:`ShapeFloors` gives each shape its W, shared with the master so both see the same shapes.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable

import numpy as np

from .candidates import CostTables
from .shape_pricing import Shape, ShapePricer, pricer_for
from .stage_floors import NO_LOCALITY, Locality, StageExtras, fits_visits

__all__ = ["DP_CALLS", "DP_RAISE", "LABEL_SPAN", "LAMBDAS", "ShapeFloors", "certificate"]

logger = logging.getLogger(__name__)

LAMBDAS = (0.0, 0.5, 1.0, 2.0, 4.0)  # Lagrange multipliers of the box bound, in units of the box's least U
DP_CALLS = 400  # a certificate's DP calls before it stops unclosed (then doubled, up to DP_RAISE×)
DP_RAISE = 8
LABEL_SPAN = 0.05  # whole-batch boxes with hi ≤ lo·(1 + this) (and their halves) are priced by labels

Box = tuple[float, ...]  # (lo, hi, a, b, g0, g1, oa, ob): U ∈ (lo, hi], max σ ∈ (a, b], π·g ∈ [g0, g1), max o ∈ (oa, ob]


class ShapeFloors:
    """W of each shape for one (replicas, R, locality): max(R, max_k w_k), cached by stage list
    (inf for a shape the locality forbids, e.g. one that skips a node every pipeline must use)."""

    def __init__(self, tables: CostTables, replicas: int, rest: float, locality: Locality = NO_LOCALITY,
                 w_cap: float = math.inf) -> None:
        self.pr = pricer_for(tables)
        self.extras: StageExtras = self.pr.extras(replicas, locality)
        self.rest = rest
        self.w_cap = w_cap  # the cell's plans have sync + optimizer ≤ w_cap (a W cell of .fluid_branch)
        self._w: dict[tuple, float] = {}

    def __call__(self, s: Shape) -> float:
        w = self._w.get(s.stages)
        if w is None:
            inside = fits_visits(s.stages, self.extras, self.pr.node_list, self.pr.tp_list)  # visited nodes' rules
            w = max(self.rest, self.pr.stage_w(s.stages, self.extras)) if inside else math.inf
            # a W cell leaves out the shapes the pricing DP's w caps exclude (some w_k above the cap);
            # one over the cap only by its largest sync plus largest optimizer step stays, at its W
            # (a relaxation: the certificate and the master must see the same shapes to close)
            if w > self.w_cap and self.pr.stage_w(s.stages, self.extras, joint=False) > self.w_cap:
                w = math.inf
            self._w[s.stages] = w
        return w


def certificate(tables: CostTables, pi: np.ndarray, mu: float, M: int, pmax: int, top: float,
                deadline: float | None, max_dp: int = DP_CALLS, rel: float = 1e-5, *, replicas: int = 1,
                rest_s: float = 0.0, locality: Locality = NO_LOCALITY,
                whole: bool = False, w_cap: float = math.inf,
                exact_whole: bool = False, pmin: int = 0) -> tuple[float, list[Shape], bool]:
    """T_cert(π, μ) = min over shapes of S + W + U·max(0, π·g + κ), κ = ρ − 1 + μ (or, with ``pmin``
    pipelines at least and π·G > M, κ = (M − π·G)/pmin − 1), by branch and bound
    over boxes of (U, max σ, max o); with ``whole``, of S + W + U·max(0, ⌊π·g + κ + 1⌋) over boxes
    that also cut π·g (:func:`_box_bound`; a box flat in all of them is a Lagrangian bound, so the
    search stops unclosed) — except, with ``exact_whole`` on the compiled engine, boxes narrow in U
    (hi ≤ lo·(1 + LABEL_SPAN)) or flat in U, σ and o, whose floor term is then exact (Pareto labels
    of S and π·g, :meth:`.ShapePricer.solve_whole`): slower, so :func:`.fluid_bound.fluid_lower_bound`
    asks for it only once the Lagrangian boxes stop unclosed (and the search for leaves it cannot branch).

    Box U ∈ (lo, hi], max σ ∈ (a, b], max o ∈ (oa, ob]: every shape in it has W ≥ w(box) :=
    max(R, a⁺ + oa⁺) (its largest sync and its largest optimizer step, :func:`.stage_floors.stage_maxima`)
    and value ≥ DP(hi, b, ob; lo) + w(box) + min(lo·κ, hi·κ), DP = min S + Σ_k π_n·t·max(lo, u_k) over
    shapes with every u ≤ hi, σ ≤ b and o ≤ ob (:func:`.stage_floors.sync_tables`; each stage's share
    of U·π·g at its own time where that exceeds lo: exact for a balanced shape, whose stages all run
    near U, so the boxes need cutting in U only for unbalanced ones). The two W dimensions let the
    search close on shapes whose sync and optimizer maxima sit on different stages, which one cap on
    w = σ + o per stage cannot see (hexiscale-het3: a 4090 stage's sync beside an A100 stage's AdamW
    step over 25 layers). Returns the proven minimum (the least box bound), the argmin shapes met on
    the way (new columns) and whether the search closed (least bound within ``rel`` of the best shape
    found) rather than hit a limit. The box of least bound is cut along the dimension whose
    relaxation costs its best shape most."""
    pr = pricer_for(tables)
    floors = ShapeFloors(tables, replicas, rest_s, locality, w_cap)
    caps = np.array([float(n.count) for n in tables.problem.cluster.nodes])
    pi, kappa = _kappa(pi, mu, M, pmax, pmin, caps)
    if top <= pr.u_floor:
        return top, [], True
    # W ∈ [w0, top]: W = max(R, max_k w_k) ≥ w0 = max(R, least w), and a larger W leaves no time
    w0 = max(rest_s, _entry_range(floors.extras)[0])
    w_top = min(top, w_cap)  # plans of a W cell have W ≤ w_cap
    if w0 > w_top:
        return top, [], True  # no shape of the cell fits: its plans (none) finish after any time
    search = _BoxSearch(pr, floors, pi, kappa, top, w_top, g_top=float(pi @ caps), whole=whole,
                        exact_whole=exact_whole)
    return search.run(max_dp, deadline, rel)


def _kappa(pi: np.ndarray, mu: float, M: int, pmax: int, pmin: int, caps: np.ndarray) -> tuple[np.ndarray, float]:
    """The multipliers the certificate uses and its per-pipeline constant κ (docs §14): κ + 1 =
    (M − π·G)/pmax + μ, the multipliers shrunk to A = π·G + μ·pmax just under M where they reach it
    (any π, μ ≥ 0 are valid); with ``pmin`` pipelines at least and π·G ≥ M, κ + 1 = (M − π·G)/pmin < 0."""
    pi_g = float(pi @ caps)
    A = pi_g + mu * pmax
    if pmin > 0 and pi_g >= M * (1 - 1e-9):
        # every plan has ≥ pmin pipelines: κ' = (M − π·G)/pmin < 0 is valid (Σ_p κ' ≤ κ'·pmin)
        return pi, (M - pi_g) / pmin - 1.0
    if A >= M * (1 - 1e-9):  # at the master's root A = V_R = M: shrink the multipliers
        shrink = M * (1 - 1e-9) / A
        pi, mu, A = pi * shrink, mu * shrink, M * (1 - 1e-9)
    # κ' = κ + 1 = (M − π·G)/pmax ≥ 0: μ cancels, so a counted master's free μ (< 0) is harmless here
    return pi, (M - A) / pmax - 1.0 + mu


class _BoxSearch:
    """One certificate's branch and bound: a heap of boxes by bound, each with its DP's argmin shape,
    and the least value of any shape met (the search closes when the least bound reaches it)."""

    def __init__(self, pr: ShapePricer, floors: ShapeFloors, pi: np.ndarray, kappa: float, top: float,
                 w_top: float, *, g_top: float, whole: bool, exact_whole: bool) -> None:
        self.pr, self.floors, self.extras = pr, floors, floors.extras
        self.pi, self.kappa, self.top, self.whole = pi, kappa, top, whole
        self.rest_s, self.w_top, self.lo0 = floors.rest, w_top, pr.u_floor
        self.base = pr.sync_tables(self.extras, math.inf, floors.w_cap)
        s_lo, s_hi = _entry_range(self.base)
        self.s0 = max(0.0, s_lo)  # no stage syncs in less (nor a shape's largest)
        self.s_top = min(w_top, s_hi)  # nor in more
        o_all = self.extras.opt if self.extras.opt is not None else np.zeros(1)
        self.o0, self.o_top = float(o_all.min()) * (1 - 1e-9), min(w_top, float(o_all.max()))
        self.heap: list[tuple[float, int, Box, Shape]] = []
        self.found: dict[tuple, Shape] = {}
        self.best_exact = math.inf
        self.tie = 0
        self.kp = kappa + 1.0 - 1e-9  # κ' a hair low: the whole-batch certificate needs f_s ≤ a_s − ε
        self.g_top = g_top  # π·g of a shape never exceeds π·G
        self._pgs: dict[tuple[int, ...], float] = {}
        # fractional, κ < 0: also S + U·κ ≥ (1 + κ)·S (U ≤ S), so value ≥ (1 + κ)·min[S + Σ π_n·t·max(lo, u)/(1 + κ)]
        # + W — a box far above its argmin's U (the DP admits every U ≤ hi) is then not charged hi·κ < 0
        self.steep = not whole and -1.0 + 1e-12 < kappa < 0.0
        # fractional, κ ≤ −1 (κ' < 0: Σ x ≥ P_lo): a shape's value is at least S + W (its U term
        # max(0, π·g + κ)·U ≥ 0), S at least the box's least S (the DP at λ = 0) and U > lo; the linear term
        # alone says little there. (Admitting only the box's own U > lo in that DP, as the whole-batch boxes
        # do, closed more tiny certificates but cost hexiscale-het2 0.016 s of bound in 120 s: three solves
        # each, 7.541 against 7.557 s mean, 2026-12-03 09:45-10:00 UTC.)
        self.flat = not whole and kappa <= -1.0 + 1e-12
        self.lams = (LAMBDAS if whole else (1.0, 1.0 / (1.0 + kappa)) if self.steep else (1.0, 0.0) if self.flat
                     else (1.0,))
        self.J, self.one = len(self.lams), self.lams.index(1.0)
        self.labels = whole and exact_whole and pr.engine == "jit"  # boxes flat in U and W: exact in π·g
        self.relaxed = False  # some label front was thinned (its bound is then a relaxation)

    # ---- a shape's terms
    def pg(self, s: Shape) -> float:
        """π·g (remembered by GPU use: shapes share it)."""
        v = self._pgs.get(s.gpus)
        if v is None:
            v = self._pgs[s.gpus] = float(self.pi @ np.array(s.gpus, dtype=float))
        return v

    def k_of(self, s: Shape) -> int:
        """Whole micro-batches: ⌊π·g + κ'⌋."""
        return max(0, math.floor(self.pg(s) + self.kp))

    def linear(self, s: Shape) -> float:
        """The fractional certificate's value: best columns for the fractional master."""
        return s.total + self.floors(s) + s.bottleneck * max(0.0, self.pg(s) + self.kappa)

    def value(self, s: Shape) -> float:
        return s.total + self.floors(s) + s.bottleneck * self.k_of(s) if self.whole else self.linear(s)

    def _meet(self, s: Shape) -> None:
        """A shape a DP returned: the least value met so far, and a candidate column."""
        self.best_exact = min(self.best_exact, self.value(s))
        self.found.setdefault(s.stages, s)

    # ---- a box's terms
    def w_of(self, box: Box) -> float:
        """The box's floor on W: least max σ plus least max o."""
        return max(self.rest_s, max(self.s0, box[2]) + max(self.o0, box[6]))

    def tables_of(self, box: Box) -> StageExtras:
        return self.base if box[7] >= self.o_top else self.pr.sync_tables(self.extras, box[7], self.floors.w_cap)

    def first_boxes(self) -> list[Box]:
        """The starting grid: U on 8 geometric steps from the least stage time to ``top``, max σ and
        max o each below their least stage value and in two geometric steps above it."""
        lo0, s0, s_top, o0, o_top = self.lo0, self.s0, self.s_top, self.o0, self.o_top
        u_edges = list(np.geomspace(lo0, self.top, 9))
        # (boxes above the largest stage σ or o would repeat the one below: the DP caps only from above)
        s_edges = [-math.inf, s0] + (list(np.geomspace(s0, s_top, 3)[1:]) if s_top > s0 > 0 else
                                     [s_top] if s_top > s0 else [])
        o_edges = [-math.inf, o0] + (list(np.geomspace(o0, o_top, 3)[1:]) if o_top > o0 > 0 else [])
        o_edges[-1] = math.inf  # (no stage's optimizer part is above o_top: the last box is the base tables)
        return [(u_edges[i], u_edges[i + 1], s_edges[j], s_edges[j + 1], 0.0, math.inf, o_edges[k], o_edges[k + 1])
                for i in range(len(u_edges) - 1) for j in range(len(s_edges) - 1) for k in range(len(o_edges) - 1)]

    # ---- pricing boxes
    def push_labels(self, boxes: list[Box], floor: float) -> None:
        """Whole batches by Pareto labels: each box's bound is its exact least S + lo·k + w(box)
        (at least ``floor``, the bound it had); the boxes come back marked exact (g0 = −1)."""
        for ex, group in _by_tables(boxes, self.tables_of):
            lows = np.array([b[0] if b[0] > self.lo0 else -math.inf for b in group])
            # shapes at or above the best one found (or top) need no label: the certificate is at most its value
            ubs = np.array([min(self.top, self.best_exact) - self.w_of(b) for b in group])
            vals, shapes, rx = self.pr.solve_whole(np.array([b[1] for b in group]), lows,
                                                   np.array([b[3] for b in group]), np.array([b[0] for b in group]),
                                                   self.kp, ubs, self.pi, ex)
            self.relaxed = self.relaxed or rx
            for i, box in enumerate(group):
                s = shapes[i]
                if s is None:
                    continue
                self.tie += 1
                heapq.heappush(self.heap, (max(floor, float(vals[i]) + self.w_of(box)), self.tie,
                                           (*box[:4], -1.0, math.inf, *box[6:]), s))
                self._meet(s)

    def push(self, boxes: list[Box]) -> None:
        """Boxes priced by the Lagrangian DPs (one batch per floor table): each box's bound joins the heap."""
        J, one, kappa = self.J, self.one, self.kappa
        for ex, group in _by_tables(boxes, self.tables_of):
            los = np.array([b[0] for b in group])
            lam = los[:, None] * np.array(self.lams)[None, :]                     # (boxes, J)
            # whole batches: the DP admits only the box's shapes, U > lo (else its argmin can sit below
            # the box, whose bound then never rises as U is cut; the bottom box holds every shape, U ≥ lo0)
            lows = np.repeat([b[0] if b[0] > self.lo0 else -math.inf for b in group], J) if self.whole else None
            his, bs = np.array([b[1] for b in group]), np.array([b[3] for b in group])
            # fractional: a box's shapes have U > lo, so U·π·g ≥ Σ π_n·t·max(lo, u) over their stages
            # (each stage's own time, not only the box's floor: exact for a balanced shape)
            slopes = None if self.whole else np.tile(np.array(self.lams), len(group))
            vals, shapes = self.pr.solve(his if J == 1 else np.repeat(his, J), lam.ravel(), self.pi,
                                         bs if J == 1 else np.repeat(bs, J), ex, lows, slopes)
            vals = vals.reshape(len(group), J)
            for i, box in enumerate(group):
                s = shapes[i * J + one]
                if s is None:
                    continue
                lo, hi, _, _, g0, g1 = box[:6]
                if self.whole:
                    bound = _box_bound(vals[i], lam[i], lo, self.kp, self.top, g0, g1) + self.w_of(box)
                else:
                    bound = vals[i, one] + self.w_of(box) + min(lo * kappa, hi * kappa)
                    if self.steep:
                        bound = max(bound, (1.0 + kappa) * vals[i, 1] + self.w_of(box))
                    elif self.flat:
                        bound = max(bound, max(vals[i, 1], lo) + self.w_of(box))  # (S ≥ U > lo)
                self.tie += 1
                heapq.heappush(self.heap, (bound, self.tie, box, s))
                for s2 in shapes[i * J: (i + 1) * J]:
                    if s2 is not None:
                        self._meet(s2)

    def split(self, children: list[Box], parent: float) -> None:
        """Price a cut box's two halves: by labels once the box is exact or narrow in U (few shapes
        fit, so the fronts stay short), else by the Lagrangian DPs."""
        lo, hi, g0 = children[0][0], children[-1][1], children[0][4]
        if self.labels and (g0 < 0 or hi <= lo * (1 + LABEL_SPAN)):
            self.push_labels(children, parent)
        else:
            self.push(children)

    # ---- the search
    def run(self, max_dp: int, deadline: float | None, rel: float) -> tuple[float, list[Shape], bool]:
        """Cut the least box until its bound meets the best shape met (closed), it is a point box, or
        ``max_dp`` DP calls or ``deadline`` stop it; returns (certificate, new columns, closed)."""
        self.push(self.first_boxes())
        calls, closed = 1, not self.heap
        while self.heap and calls < max_dp and (deadline is None or time.monotonic() < deadline):
            bound, _, box, s = self.heap[0]
            reached = bound >= self.best_exact - rel * abs(self.best_exact)
            flats = self._flat(box)
            # closed: the least bound reaches the best shape found, or it is a point box (exact; with
            # whole batches a point of π·g is still a Lagrangian bound, and so is a label front that
            # was thinned: the search stops unclosed there)
            if reached or (all(flats) and self._g_flat(box)):
                closed = reached or not self.whole or (box[4] < 0 and not self.relaxed)
                break
            heapq.heappop(self.heap)
            self._cut(bound, box, s, flats)
            calls += 1
        cert = self.heap[0][0] if self.heap else self.top
        if self.labels:  # the label boxes leave out shapes above the best one found, which bounds them all
            cert = min(cert, self.best_exact)
        logger.debug("certificate %.6g, best shape %.6g, %d DP calls, closed %s", cert, self.best_exact, calls, closed)
        good = {s.stages: s for key in (self.linear, self.value) for s in sorted(self.found.values(), key=key)[:8]}
        return min(cert, self.top), list(good.values()), closed

    def _flat(self, box: Box) -> tuple[bool, bool, bool]:
        """Whether the box is flat in U, in max σ and in max o."""
        lo, hi, a, b, _, _, oa, ob = box
        a_eff, b_eff = max(a, self.s0), min(b, self.w_top)
        oa_eff, ob_eff = max(oa, self.o0), min(ob, self.o_top)
        return (hi <= lo * (1 + 1e-9), b_eff - a_eff <= 1e-9 * max(1.0, abs(b_eff)),
                ob_eff - oa_eff <= 1e-9 * max(1.0, abs(ob_eff)))

    def _g_flat(self, box: Box) -> bool:
        """Flat in π·g: always in fractional boxes (they do not cut it) and label boxes (exact in it)."""
        g0, g1 = box[4], box[5]
        return not self.whole or g0 < 0 or min(g1, self.g_top) - g0 <= 1e-9 * max(1.0, g0)

    def _cut(self, bound: float, box: Box, s: Shape, flats: tuple[bool, bool, bool]) -> None:
        """Split the least box along the relaxation that costs its own argmin ``s`` most: U at lo, max σ
        at a or max o at oa (then π·g: whole batches), and price the halves; ``flats``: :meth:`_flat`."""
        lo, hi, a, b, g0, g1, oa, ob = box
        a_eff, b_eff = max(a, self.s0), min(b, self.w_top)
        oa_eff, ob_eff = max(oa, self.o0), min(ob, self.o_top)
        u_flat, s_flat, o_flat = flats
        w_flat = s_flat and o_flat
        if self.whole:
            slack_u = (s.bottleneck - lo) * self.k_of(s)
        else:  # the box charges each stage's π_n·t at max(lo, u) instead of at U
            pr = self.pr
            miss = sum(float(self.pi[pr.node[c]] * pr.tp[c]) * (s.bottleneck - max(lo, u))
                       for (c, _), u in zip(s.stages, pr.stage_times(s.stages)))
            slack_u = miss + s.bottleneck * self.kappa - min(lo * self.kappa, hi * self.kappa)
        _, sig, opt = self.pr.stage_maxima(s.stages, self.extras)
        slack_w = self.floors(s) - self.w_of(box)  # what the box's W floor misses of the shape's own W
        slack_s = 0.0 if s_flat or slack_w <= 0 else min(slack_w, max(0.0, sig - a_eff))
        slack_o = 0.0 if o_flat or slack_w <= 0 else min(slack_w, max(0.0, opt - oa_eff))
        if u_flat and w_flat and self.labels:  # only π·g is left: the labels price it exactly
            self.push_labels([box], bound)
        elif u_flat and w_flat:  # only π·g is left to split
            g_s = self.pg(s)
            gc = g_s if g0 < g_s < min(g1, self.g_top) else 0.5 * (g0 + min(g1, self.g_top))
            self.push([(lo, hi, a, b, g0, gc, oa, ob), (lo, hi, a, b, gc, g1, oa, ob)])
        elif not w_flat and (u_flat or max(slack_s, slack_o) >= slack_u):
            if not o_flat and (s_flat or slack_o > slack_s):
                mid = _cut_point(oa_eff, ob_eff)
                self.split([(lo, hi, a, b, g0, g1, oa, mid), (lo, hi, a, b, g0, g1, mid, ob)], bound)
            else:
                mid = _cut_point(a_eff, b_eff)
                self.split([(lo, hi, a, mid, g0, g1, oa, ob), (lo, hi, mid, b, g0, g1, oa, ob)], bound)
        else:
            mid = math.sqrt(lo * hi)
            self.split([(lo, mid, a, b, g0, g1, oa, ob), (mid, hi, a, b, g0, g1, oa, ob)], bound)


def _cut_point(lo: float, hi: float) -> float:
    """Where (lo, hi] is split: geometric where it can be."""
    return math.sqrt(lo * hi) if lo > 0 else 0.5 * (lo + hi)


def _entry_range(ex: StageExtras) -> tuple[float, float]:
    """Least and largest finite entry of a floor table's stage positions (0, 0 when none is finite)."""
    fin = [t[np.isfinite(t)] for t in (ex.mid, ex.first, ex.last, ex.single)]
    fin = [f for f in fin if f.size]
    if not fin:
        return 0.0, 0.0
    return min(float(f.min()) for f in fin), max(float(f.max()) for f in fin)


def _by_tables(boxes: list[Box], tables_of: Callable[[Box], StageExtras],
               ) -> list[tuple[StageExtras, list[Box]]]:
    """The boxes grouped by the floor tables their optimizer cap selects (one DP batch per table)."""
    groups: dict[int, tuple[StageExtras, list[Box]]] = {}
    for box in boxes:
        ex = tables_of(box)
        groups.setdefault(id(ex), (ex, []))[1].append(box)
    return list(groups.values())


def _box_bound(D: np.ndarray, lam: np.ndarray, lo: float, kp: float, top: float, g0: float, g1: float) -> float:
    """A lower bound on S + U·k_s, k_s = max(0, ⌊π·g + κ'⌋), over the shapes of a box (U > lo,
    g0 ≤ π·g < g1), given D_j = min S + λ_j·π·g over a superset: a shape with k_s = k has π·g in
    [max(g0, k − κ'), min(g1, k + 1 − κ')), so S ≥ D_j − λ_j·(that range's upper end if λ_j ≥ 0, else
    its lower end) and the value ≥ lo·k + max_j of those (docs/formulation.md §14). That is convex in
    k, so its least whole k is found by bisection; k beyond top/lo cannot beat top."""
    finite = np.isfinite(D)
    if not finite.any():
        return math.inf
    D, lam = D[finite], lam[finite]
    kmax = max(0, math.ceil(top / lo)) + 1 if lo > 0 else 0
    k_lo = max(0, math.floor(g0 + kp))
    k_hi = min(kmax, math.floor(g1 + kp)) if math.isfinite(g1) else kmax
    if k_hi < k_lo:
        return math.inf

    def f(k: int) -> float:
        up, down = min(g1, k + 1 - kp), max(g0, k - kp)
        return lo * k + float(np.max(D - np.where(lam >= 0, lam * up, lam * down)))

    a, b = k_lo, k_hi
    while a < b:  # least k of a convex f
        m = (a + b) // 2
        if f(m + 1) < f(m):
            a = m + 1
        else:
            b = m
    out = f(a)
    return min(out, lo * (kmax + 1)) if k_hi == kmax else out
