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
* *open*: no decision — no faster than the best link leaving n (local or not).

Within one class the pieces' summed α–β time is ≥ min over the class's links of (α + β⁻¹·payload)
(a convex-combination argument, latency once: docs §15); classes hold distinct pieces, so σ is
the sum over the classes present. The embedding and head are their own units and stay open.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hexhelix.ir.opgraph import OpClass

from . import cost
from .candidates import CostTables, _link_key

__all__ = ["NO_LOCALITY", "Locality", "StageExtras", "class_links", "stage_extras", "stage_w"]

OPEN, LOCAL, SPREAD = 0, 1, 2


@dataclass(frozen=True)
class Locality:
    """Fixed (layer, node) decisions of a branch-and-price node (module docstring)."""

    local: frozenset[tuple[int, int]] = frozenset()
    spread: frozenset[tuple[int, int]] = frozenset()

    def with_local(self, layer: int, node: int) -> Locality:
        return Locality(local=self.local | {(layer, node)}, spread=self.spread)

    def with_spread(self, layer: int, node: int) -> Locality:
        return Locality(local=self.local, spread=self.spread | {(layer, node)})

    def local_node(self, layer: int) -> int | None:
        """The node every pipeline holds ``layer`` on, if fixed."""
        return next((n for i, n in self.local if i == layer), None)


NO_LOCALITY = Locality()


@dataclass(frozen=True, slots=True)
class StageExtras:
    """w[c, j, ℓ − 1] by stage position: the floor for a stage of option c holding layers
    j … j+ℓ−1 (inf where the locality forbids it; entries beyond the last layer are inf)."""

    mid: np.ndarray
    first: np.ndarray
    last: np.ndarray
    single: np.ndarray


def class_links(tables: CostTables, node: int) -> dict[int, list[cost.Link]]:
    """Links a holder on ``node`` may meet, per class (OPEN, LOCAL, SPREAD): the slowest link of its
    piece's holders is one of these."""
    cl = tables.problem.cluster
    n = len(cl.nodes)
    every = [cost.cluster_link(cl, a, b) for a in range(n) for b in range(a, n)]
    out = {OPEN: tables.admissible_links(node), LOCAL: [cost.cluster_link(cl, node, node)]}
    if n > 1:
        top = max(_link_key(cost.cluster_link(cl, node, b)) for b in range(n) if b != node)
        out[SPREAD] = [lk for lk in every if _link_key(lk) <= top]
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
    out = {pos: np.full(shape, math.inf) for pos in ("mid", "first", "last", "single")}
    links = {n: class_links(tables, n) for n in range(nodes)}
    for o in tables.options:
        n = o.node
        cum_ban = np.concatenate([[0], np.cumsum(banned[n])])
        ok = inside & ((cum_ban[endc] - cum_ban[j]) == 0)
        counts = {}
        for k in (OPEN, LOCAL, SPREAD):
            cum = np.concatenate([[0], np.cumsum(cls[n] == k)])
            counts[k] = (cum[endc] - cum[j]).astype(float)                 # layers of class k
        if replicas >= 2 and any((counts[SPREAD] > 0)[ok]) and not links[n][SPREAD]:
            ok = ok & (counts[SPREAD] == 0)
        unit = model.params_per_layer / o.tp * dtype
        for pos, (first, last) in {"mid": (False, False), "first": (True, False), "last": (False, True),
                                   "single": (True, True)}.items():
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
    return StageExtras(**out)


def stage_w(stages: tuple[tuple[int, int], ...], extras: StageExtras) -> float:
    """W = max over the stages of w (by position: single, first, middle, last)."""
    K = len(stages)
    if K == 1:
        c, ell = stages[0]
        return float(extras.single[c, 0, ell - 1])
    vals, j = [], 0
    for k, (c, ell) in enumerate(stages):
        table = extras.first if k == 0 else extras.last if k == K - 1 else extras.mid
        vals.append(table[c, j, ell - 1])
        j += ell
    return float(max(vals))
