"""Per-stage floors w on a plan's gradient-sync plus optimizer seconds (docs/formulation.md §14–15).

For a plan with P pipelines, a stage (option c = node n, TP t; layers j … j+ℓ−1) holds per GPU
(ℓ·params_layer + [first]·embedding + [last]·head)/t parameters. Each GPU all-reduces every piece it
holds over the P holders of that piece (one per pipeline) at the speed of their slowest link, pieces
one after the other (:func:`gradsync.grad_sync_time`); its AdamW step is the tabulated optimizer time
o. Sync and optimizer are maxima over GPUs, so sync + opt ≥ σ + o for every stage of every pipeline.

σ depends on where the *other* holders of the stage's layers sit, which a single pipeline cannot
know. Branch and price fixes it per (layer, node) (:class:`Locality`):

* *local* (layer i at node n): every pipeline holds layer i on node n — the holders' slowest link is
  node n's own link; stages on other nodes may not hold layer i;
* *spread* (layer i at node n): not every pipeline does — the holders span ≥ 2 nodes, so a holder on
  n meets a link no faster than n's best link to another node;
* a node *visited* (``Locality.visit``): some layer is local at it, so every pipeline uses one of its
  GPUs — and therefore none uses more than G_n − P + 1 of them (the pricing admits only shapes that
  use it, with no run of consecutive stages there above that, and a single run where it is 1:
  :func:`fits_visits`); *quiet*: no layer is (all its pairs spread);
* *open*: no decision — no faster than the best link leaving n (local or not); but a stage of TP t
  on n whose node cannot also hold the other P − 1 replicas (t + P − 1 > G_n: each needs ≥ 1 GPU of
  n) has none of its layers local, so its open layers are spread and a local one is impossible.

Within one class the pieces' summed α–β time is ≥ min over the class's links of (α + β⁻¹·payload)
(a convex-combination argument, latency once: docs §15); classes hold distinct pieces, so σ is
the sum over the classes present. The embedding and head are their own units and stay open.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from hexhelix.ir.opgraph import OpClass

from . import cost
from .candidates import CostTables, StageOption

__all__ = ["NO_LOCALITY", "Locality", "StageExtras", "class_links", "fits_visits", "stage_extras", "stage_maxima",
           "stage_w", "sync_tables", "w_of_maxima"]

OPEN, LOCAL, SPREAD = 0, 1, 2


@dataclass(frozen=True)
class Locality:
    """Fixed (layer, node) decisions of a branch-and-price node (module docstring)."""

    local: frozenset[tuple[int, int]] = frozenset()
    spread: frozenset[tuple[int, int]] = frozenset()
    visit: frozenset[int] = frozenset()  # nodes with some local layer: every pipeline uses one of their GPUs

    def with_local(self, layer: int, node: int) -> Locality:
        return Locality(local=self.local | {(layer, node)}, spread=self.spread, visit=self.visit)

    def with_spread(self, layer: int, node: int) -> Locality:
        return Locality(local=self.local, spread=self.spread | {(layer, node)}, visit=self.visit)

    def with_quiet(self, node: int, layers: int) -> Locality:
        """No layer is local at ``node``: every (layer, node) pair not yet fixed is spread."""
        fixed = {i for i, n in self.local if n == node}
        return Locality(local=self.local, visit=self.visit,
                        spread=self.spread | {(i, node) for i in range(layers) if i not in fixed})

    def with_visit(self, node: int) -> Locality:
        """Some layer is local at ``node``: then every pipeline holds it there, so uses a GPU of it."""
        return Locality(local=self.local, spread=self.spread, visit=self.visit | {node})

    def quiet(self, node: int, layers: int) -> bool:
        """Every layer's pair with ``node`` is fixed spread."""
        return all((i, node) in self.spread for i in range(layers))

    def local_node(self, layer: int) -> int | None:
        """The node every pipeline holds ``layer`` on, if fixed."""
        return next((n for i, n in self.local if i == layer), None)


NO_LOCALITY = Locality()


@dataclass(frozen=True, slots=True)
class StageExtras:
    """w[c, j, ℓ − 1] by stage position: the floor for a stage of option c holding layers
    j … j+ℓ−1 (inf where the locality forbids it; entries beyond the last layer are inf). A stage's
    run (it and the following stages on the same node) of r GPUs with r + P − 1 > G_n takes the
    ``*_full`` tables (a last or single stage's run is the stage itself: already in its table)."""

    mid: np.ndarray
    first: np.ndarray
    last: np.ndarray
    single: np.ndarray
    mid_full: np.ndarray     # as mid/first when the stage's run on its node leaves no room for the
    first_full: np.ndarray   # other replicas: every open layer spread, no local layer
    replicas: int = 1
    caps: tuple[int, ...] = ()
    visit: tuple[int, ...] = ()  # nodes every shape must use (sorted)
    opt: np.ndarray | None = None  # (4, C, L): the optimizer part o of w by position (mid, first, last, single), ℓ − 1

    def visit_cap(self, node: int) -> int:
        """GPUs of a visited node one pipeline may use: all P pipelines use one, so ≤ G_n − P + 1."""
        return self.caps[node] - max(1, self.replicas) + 1

    def full(self, run_gpus: int, node: int) -> bool:
        """A run of consecutive stages using ``run_gpus`` GPUs of ``node`` leaves no room there for
        one GPU of each of the other P − 1 pipelines: no layer of its stages can be local."""
        return self.replicas >= 2 and run_gpus + self.replicas - 1 > self.caps[node]


def class_links(tables: CostTables, node: int) -> dict[int, list[cost.Link]]:
    """Links a holder on ``node`` may meet, per class (OPEN, LOCAL, SPREAD): the slowest link of its
    piece's holders is one of these."""
    cl = tables.problem.cluster
    n = len(cl.nodes)
    every = cost.cluster_links(cl)
    out = {OPEN: tables.admissible_links(node), LOCAL: [cost.cluster_link(cl, node, node)]}
    if n > 1:
        top = max(cost.link_order(cost.cluster_link(cl, node, b)) for b in range(n) if b != node)
        out[SPREAD] = [lk for lk in every if cost.link_order(lk) <= top]
    else:
        out[SPREAD] = []  # one node: holders cannot span two nodes, a spread layer cannot be held
    return out


def _min_affine(links: list[cost.Link], replicas: int, payload: np.ndarray, tables: CostTables) -> np.ndarray:
    """min over ``links`` of the all-reduce time of ``payload`` bytes (0 where payload is 0)."""
    out = np.full(payload.shape, math.inf)
    for lk in links:
        a = cost.collective_time(OpClass.ALL_REDUCE, replicas, 0.0, lk, tables.profile)
        b = cost.collective_time(OpClass.ALL_REDUCE, replicas, 1.0, lk, tables.profile) - a
        out = np.minimum(out, a + b * payload)
    return np.where(payload > 0, out, 0.0)


def stage_extras(tables: CostTables, replicas: int, locality: Locality = NO_LOCALITY) -> StageExtras:
    """Vectorised w = σ + o for every option, start layer and length (module docstring)."""
    model, dtype = tables.problem.model, tables.problem.training.dtype_bytes
    L = tables.layers
    nodes = len(tables.problem.cluster.nodes)
    # per node: class of every layer, and forbidden layers (fixed local elsewhere)
    cls = np.full((nodes, L), OPEN)
    banned = np.zeros((nodes, L), dtype=bool)
    for i, n in locality.spread:
        cls[n, i] = SPREAD
    for i, n in locality.local:
        cls[n, i] = LOCAL
        banned[np.arange(nodes) != n, i] = True
    j = np.arange(L)[:, None]
    ell = np.arange(1, L + 1)[None, :]
    end = j + ell                                                           # (L, L) exclusive end
    inside = end <= L
    endc = np.minimum(end, L)
    shape = (len(tables.options), L, L)
    out = {pos: np.full(shape, math.inf) for pos in ("mid", "first", "last", "single", "mid_full", "first_full")}
    links = {n: class_links(tables, n) for n in range(nodes)}
    caps = tuple(node.count for node in tables.problem.cluster.nodes)
    sizes = tables.physical_sizes  # a merged view's caps count the group; a stage sits on one physical node

    def rows(o: StageOption, ocls: np.ndarray, oban: np.ndarray, positions: dict[str, tuple[bool, bool]]) -> None:
        n = o.node
        cum_ban = np.concatenate([[0], np.cumsum(oban)])
        ok = inside & ((cum_ban[endc] - cum_ban[j]) == 0)
        counts = {}
        for k in (OPEN, LOCAL, SPREAD):
            cum = np.concatenate([[0], np.cumsum(ocls == k)])
            counts[k] = (cum[endc] - cum[j]).astype(float)                 # layers of class k
        if replicas >= 2 and any((counts[SPREAD] > 0)[ok]) and not links[n][SPREAD]:
            ok = ok & (counts[SPREAD] == 0)
        unit = model.params_per_layer / o.tp * dtype
        for pos, (first, last) in positions.items():
            opt = (tables.opt_layer[o.index] * ell + first * tables.opt_first[o.index]
                   + last * tables.opt_last[o.index]) * np.ones((L, 1))
            sync = np.zeros((L, L))
            if replicas >= 2:
                extra = (first * model.embedding_params + last * model.head_params) / o.tp * dtype
                for k in (OPEN, LOCAL, SPREAD):
                    pay = counts[k] * unit + (extra if k == OPEN else 0.0)
                    if links[n][k]:
                        sync = sync + _min_affine(links[n][k], replicas, pay, tables)
            # (1 − 1e-9): the affine extraction may round up in the last bits; a floor must not
            w = (np.maximum(0.0, opt) + sync) * (1 - 1e-9)
            out[pos][o.index] = np.where(ok, w, math.inf)

    every = {"mid": (False, False), "first": (True, False), "last": (False, True), "single": (True, True)}
    opt_parts = np.zeros((4, len(tables.options), L))
    for o in tables.options:
        for i, (first, last) in enumerate(every.values()):
            opt_parts[i, o.index] = np.maximum(0.0, tables.opt_layer[o.index] * np.arange(1, L + 1)
                                               + first * tables.opt_first[o.index] + last * tables.opt_last[o.index])
    for o in tables.options:
        n = o.node
        full_cls = np.where(cls[n] == OPEN, SPREAD, cls[n])        # no room for the other replicas on n
        full_ban = banned[n] | (cls[n] == LOCAL)
        if replicas >= 2 and o.tp + replicas - 1 > sizes[n]:  # the stage alone fills its physical node: every run does
            rows(o, full_cls, full_ban, every)
            out["mid_full"][o.index], out["first_full"][o.index] = out["mid"][o.index], out["first"][o.index]
        else:
            rows(o, cls[n], banned[n], every)
            rows(o, full_cls, full_ban, {"mid_full": (False, False), "first_full": (True, False)})
    return StageExtras(**out, replicas=replicas, caps=caps, visit=tuple(sorted(locality.visit)), opt=opt_parts)


def stage_maxima(stages: tuple[tuple[int, int], ...], extras: StageExtras, nodes: Sequence[int],
                 tps: Sequence[int]) -> tuple[float, float, float]:
    """(max w_k, max σ_k, max o_k) over the stages: each stage's floor w by position (single, first,
    middle, last; ``*_full`` where the stage's run fills its node), its sync part σ = w − o and its
    optimizer part o, ``nodes``/``tps`` the node and TP degree of each option. The sync and optimizer
    maxima are what the plan pays at least (two maxima over all GPUs, which need not sit on one
    stage: mixed-a100-a40-t4's sync on an A40, AdamW on a T4)."""
    K = len(stages)
    starts = np.cumsum([0] + [ell for _, ell in stages])
    vals, opts, run = [], [], 0
    for k in range(K - 1, -1, -1):  # backwards: the run of each stage is it and what follows on its node
        c, ell = stages[k]
        node, tp = nodes[c], tps[c]
        run = tp + (run if k + 1 < K and nodes[stages[k + 1][0]] == node else 0)
        pos = 3 if K == 1 else 2 if k == K - 1 else 1 if k == 0 else 0
        if K == 1:
            table = extras.single
        elif k == K - 1:
            table = extras.last
        else:
            full = extras.full(run, node)
            table = (extras.first_full if full else extras.first) if k == 0 else \
                (extras.mid_full if full else extras.mid)
        vals.append(float(table[c, starts[k], ell - 1]))
        # w_k = (o_k + σ_k)(1 − 1e-9): the optimizer part scaled alike, so σ_k = w_k − o_k exactly
        opts.append(float(extras.opt[pos, c, ell - 1]) * (1 - 1e-9) if extras.opt is not None else 0.0)
    w = max(vals)
    if not math.isfinite(w):
        return w, w, w
    return w, max(max(0.0, v - o) for v, o in zip(vals, opts)), max(opts)


def stage_w(stages: tuple[tuple[int, int], ...], extras: StageExtras, nodes: Sequence[int],
            tps: Sequence[int], *, joint: bool = True) -> float:
    """W = max over the stages of w (:func:`stage_maxima`) — and, with ``joint``, at least
    max σ + max o over the stages: the plan pays its largest sync and its largest optimizer step,
    which need not be on one stage. Without ``joint``: the largest w_k alone."""
    return w_of_maxima(stage_maxima(stages, extras, nodes, tps), extras, joint=joint)


def w_of_maxima(maxima: tuple[float, float, float], extras: StageExtras, *, joint: bool = True) -> float:
    """:func:`stage_w` from the shape's :func:`stage_maxima` (max w, max σ, max o)."""
    w, sigma, o = maxima
    if not joint or extras.opt is None or not math.isfinite(w):
        return w
    return max(w, sigma + o)


def sync_tables(extras: StageExtras, o_cap: float, w_cap: float = math.inf) -> StageExtras:
    """``extras`` with the sync part σ = w − o in place of w, and inf where a stage's optimizer part
    exceeds ``o_cap`` or its w exceeds ``w_cap``: a pricing DP capping these tables at b admits the
    shapes with every σ_k ≤ b, o_k ≤ o_cap and w_k ≤ w_cap (the boxes of max σ × max o of
    :func:`.fluid_certificate.certificate`, whose W floor is then their least max σ plus least max o)."""
    opt = extras.opt if extras.opt is not None else np.zeros((4, *extras.last.shape))
    o = opt * (1 - 1e-9)

    def part(w: np.ndarray, pos: int) -> np.ndarray:
        oo = o[pos][:, None, :]  # (C, 1, ℓ): the optimizer part depends on the length only
        keep = (oo <= o_cap) & (w <= w_cap) & np.isfinite(w)
        return np.where(keep, np.maximum(0.0, w - oo), math.inf)

    return replace(extras, mid=part(extras.mid, 0), mid_full=part(extras.mid_full, 0),
                   first=part(extras.first, 1), first_full=part(extras.first_full, 1),
                   last=part(extras.last, 2), single=part(extras.single, 3))


def fits_visits(stages: tuple[tuple[int, int], ...], extras: StageExtras, nodes: Sequence[int],
                tps: Sequence[int]) -> bool:
    """The shape may belong to the cell's plans: it uses every visited node, no run of consecutive
    stages on one exceeds its :meth:`StageExtras.visit_cap`, and where that cap is 1 it visits the
    node once (two runs would use two GPUs) — exactly what the pricing DP admits."""
    if not extras.visit:
        return True
    runs: dict[int, list[int]] = {}
    prev = None
    for c, _ in stages:
        n = nodes[c]
        if n == prev:
            runs[n][-1] += tps[c]
        else:
            runs.setdefault(n, []).append(tps[c])
        prev = n
    for n in extras.visit:
        cap = extras.visit_cap(n)
        got = runs.get(n)
        if not got or max(got) > cap or (cap == 1 and len(got) > 1):
            return False
    return True
