"""HexiScale's phase 2 for one pipeline: order its machine blocks, split each into TP stages, lay out
the layers (shared/reference/hexiscale.md §3.3-3.5; the fixes are listed in :mod:`.hexiscale`).

A :class:`PipelineSolver` serves every candidate grouping of one search: it memoises block orders,
TP splits by the pipeline's shape (interchangeable nodes share them) and layer layouts by their
inputs, because the outer search meets the same pipelines again and again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from hexhelix.ir.plan import PlanProblem

from .candidates import identical_node_groups
from .layer_assign import Stage, StageCostTable, assign_layers, tp_splits, valid_tp
from .layer_assign_jit import AVAILABLE as COMPILED_AVAILABLE
from .layer_assign_jit import assign_layers_compiled
from .partition import group_by_node
from .stage_order import top_tau_paths

__all__ = ["COMPILED_AFTER", "EXHAUSTIVE_SPLITS", "PipelineSolver", "min_stage_layers"]

EXHAUSTIVE_SPLITS = 256  # TP-split combinations per pipeline below which all are tried (else coordinate descent)
COMPILED_AFTER = 1000  # layouts in numpy before the compiled form takes over (numba's import costs ~0.5 s)


def min_stage_layers(problem: PlanProblem) -> int:
    """Fewest layers a stage may hold: 2 under W-shape folding (a down-leg and an up-leg), else 1."""
    return 2 if problem.schedule == "wshape" else 1


class PipelineSolver:
    """Phase 2 plus layer assignment for one pipeline (a list of GPUs), memoised by composition."""

    def __init__(self, problem: PlanProblem, table: StageCostTable, tau: int, n_orders: int = 4):
        self.problem, self.table, self.tau = problem, table, tau
        self.graph = problem.cluster.device_graph()
        self.n_mb = problem.training.num_micro_batches
        # (block order, TP split) by (shape, m) from solve, (shape, m, "resplit") from resplit, and
        # (shape, order, start split, m, "descent") for resplit's one round of descent
        self._memo: dict[tuple, tuple[tuple[int, ...], list[int]] | None] = {}
        self._orders: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self._layouts: dict[tuple, tuple[tuple[int, ...], float] | None] = {}  # assign_layers by its inputs
        self._by_stages: dict[tuple, tuple[tuple[int, ...], float] | None] = {}  # layout by stage classes
        self._class_of = {n: g[0] for g in identical_node_groups(problem) for n in g}
        self.n_orders = n_orders
        self.devs = problem.cluster.devices()

    def _mem_mb(self, m: int) -> int:
        """Micro-batch count used for memory caps: exact for GPipe, the conservative N otherwise."""
        return m if self.problem.schedule == "gpipe" else self.n_mb

    def layout(self, stages: list[Stage], m: int, caps: Sequence[int] | None = None) -> tuple[tuple[int, ...], float] | None:
        """Exact layer counts for these stages at m micro-batches under the memory caps (and
        ``caps``, extra per-stage maxima, when given)."""
        # the result depends on each stage's node only up to interchangeable nodes (and on whether
        # the next stage shares it): the search re-scores the same sequences (3 in 4 calls on het3)
        cls, n = self._class_of, len(stages)
        skey = (tuple((cls[node], len(g), k + 1 < n and stages[k + 1][0] == node) for k, (node, g) in enumerate(stages)),
                m, None if caps is None else tuple(caps))
        if skey in self._by_stages:
            return self._by_stages[skey]
        pt = self.table.probes(stages, m)
        pm = pt if self._mem_mb(m) == m else self.table.probes(stages, self._mem_mb(m))
        mem = [p.max_layers() for p in pm]
        key = (tuple(p.time1 for p in pt), tuple(p.time0 for p in pt),
               tuple(mem if caps is None else [min(a, b) for a, b in zip(mem, caps)]), m)
        self._by_stages[skey] = self._assign(key)
        return self._by_stages[skey]

    def _assign(self, key: tuple) -> tuple[tuple[int, ...], float] | None:
        """:func:`assign_layers` on (time1, time0, caps, m), remembered: the search meets the same
        stage costs again and again (~3 in 4 on het3)."""
        if key not in self._layouts:
            # both forms give the same counts; only searches that need many layouts pay numba's import
            assign = assign_layers_compiled if COMPILED_AVAILABLE and len(self._layouts) >= COMPILED_AFTER else assign_layers
            self._layouts[key] = assign(key[0], key[1], key[2], self.problem.model.layers, key[3],
                                        min_stage_layers(self.problem))
        return self._layouts[key]

    def floor(self, kinds: Sequence[tuple[int, int]], m: int) -> float:
        """A lower bound on :meth:`layout`'s pipeline time for these stages ((node, TP) each) in any
        order at m micro-batches (inf: memory admits no order): the exact layout of the stages
        relaxed to their cheapest position (:meth:`StageCostTable.order_free`)."""
        relaxed = self.table.order_free(kinds, m, self._mem_mb(m), min_stage_layers(self.problem))
        got = None if relaxed is None else self._assign((*relaxed, m))
        return math.inf if got is None else got[1]

    def fits(self, kinds: Sequence[tuple[int, int]], m: int) -> bool:
        """Whether memory admits these stages ((node, TP) each) in this order at m micro-batches (a
        :meth:`layout` would then find layer counts)."""
        return self.table.fits_in_order(kinds, m, self._mem_mb(m), min_stage_layers(self.problem))

    def _orders_of(self, nodes: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Candidate visiting orders of the machine blocks: the ``n_orders`` best top-τ paths by
        bandwidth (ties towards memory-rich blocks first, which hold the most 1F1B activations)
        plus the best one reversed (same bandwidth; a memory-rich block at the end can take the
        head and the most layers: hexiscale-het2 7.848 → 7.677 s); every order when there are at
        most 3 blocks."""
        if nodes not in self._orders:
            cl = self.problem.cluster
            w = [[cl.node_link(a, c)[0] if i != j else 0.0 for j, c in enumerate(nodes)]
                 for i, a in enumerate(nodes)]
            mem = [cl.gpu_of_node(n).memory_gib for n in nodes]
            paths = sorted(top_tau_paths(w, self.tau), key=lambda sp: (-round(sp[0] / 1e6), [-mem[i] for i in sp[1]],
                                                                       sp[1]))
            keep = len(paths) if len(nodes) <= 3 else self.n_orders      # ≤ 3 blocks: every order
            orders = [p for _, p in paths[:keep]]
            if orders and orders[0][::-1] not in orders:                   # and the best one backwards
                orders.append(orders[0][::-1])
            self._orders[nodes] = orders
        return self._orders[nodes]

    def _menus(self, blocks: list[list[int]]) -> list[list[tuple[int, ...]]]:
        """Per block: every TP split, then ``()`` = leave the block idle (slow GPUs may cost more in
        stage time or gradient sync than they bring)."""
        return [[*tp_splits(len(b), valid_tp(self.problem, len(b))), ()] for b in blocks]

    def _build(self, blocks: list[list[int]], menus: list[list[tuple[int, ...]]], ch: Sequence[int]) -> list[Stage]:
        out: list[Stage] = []
        for b, menu, c in zip(blocks, menus, ch):
            i = 0
            for t in menu[c]:
                out.append((self.devs[b[0]].node, tuple(b[i:i + t])))
                i += t
        return out

    def _descend(self, blocks: list[list[int]], m: int, start: Sequence[int] | None = None,
                 rounds: int = 3) -> tuple[float, list[int], list[Stage]]:
        """Best TP split per block (menu indices): every combination when there are at most 256,
        else coordinate descent from ``start``, or the better of two descents: from the largest TP
        everywhere (the most memory headroom) and from the richest block alone (the others idle)."""
        menus = self._menus(blocks)

        def build(ch: Sequence[int]) -> list[Stage]:
            return self._build(blocks, menus, ch)

        def score(ch: list[int]) -> float:
            r = self.layout(build(ch), m)
            return r[1] if r else math.inf

        if start is None and math.prod(len(mu) for mu in menus) <= EXHAUSTIVE_SPLITS:   # small: try every split
            cur, choice = min(((score(list(ch)), list(ch)) for ch in itertools.product(*(range(len(mu))
                                                                                         for mu in menus))),
                              key=lambda sc: sc[0])
            return cur, choice, build(choice)
        if start is not None:
            starts = [list(start)]
        elif len(blocks) > 8:                       # large pipelines: one start, fewer rounds
            starts, rounds = [[0] * len(blocks)], min(rounds, 2)
        else:   # all blocks at their largest TP; only the richest block (others idle), grown back by the descent
            rich = max(range(len(blocks)), key=lambda j: (len(blocks[j]) * self.graph.nodes[blocks[j][0]]["memory_gib"],
                                                          self.graph.nodes[blocks[j][0]]["tflops"], -j))
            starts = [[0] * len(blocks), [0 if j == rich else len(menus[j]) - 1 for j in range(len(blocks))]]
        best: tuple[float, list[int]] | None = None
        for choice in starts:
            cur = score(choice)
            for _ in range(rounds):
                improved = False
                for j, menu in enumerate(menus):
                    for c in range(len(menu)):
                        if c == choice[j]:
                            continue
                        trial = [*choice[:j], c, *choice[j + 1:]]
                        s = score(trial)
                        if s < cur * (1 - 1e-12):
                            cur, choice, improved = s, trial, True
                if not improved:
                    break
            if best is None or cur < best[0]:
                best = (cur, choice)
        return best[0], best[1], build(best[1])

    def _shape_key(self, blocks: list[list[int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Memo key of a pipeline's machine blocks: interchangeable nodes have the same links to every
        other node, so the same search and the same shape."""
        return tuple(self._class_of[self.devs[b[0]].node] for b in blocks), tuple(len(b) for b in blocks)

    def resplit(self, gpus: Sequence[int], m_was: int, m: int) -> list[Stage] | None:
        """The stage list :meth:`solve` chose for these GPUs at ``m_was`` micro-batches, its TP split
        improved for ``m`` by one round of coordinate descent from it (same block order); None when
        :meth:`solve` found none."""
        blocks = group_by_node(self.graph, gpus)
        key = self._shape_key(blocks)
        if (*key, m) in self._memo:                       # solved at m already: that search was wider
            return self.solve(gpus, m)
        hit = self._memo.get((*key, m_was), self._memo.get((*key, m_was, "resplit")))
        if hit is None:
            return None
        order, choice = hit
        ordered = [blocks[i] for i in order]
        step = (*key, order, tuple(choice), m, "descent")     # the descent depends on these alone
        if step not in self._memo:
            t, ch, _ = self._descend(ordered, m, start=choice, rounds=1)
            self._memo[step] = (order, ch) if math.isfinite(t) else None
        if self._memo[step] is None:
            return None
        ch = self._memo[step][1]
        self._memo[(*key, m, "resplit")] = (order, ch)
        return self._build(ordered, self._menus(ordered), ch)

    def solve(self, gpus: Sequence[int], m: int) -> list[Stage] | None:
        """Best stage list (block order × TP split per machine block) for these GPUs at m micro-batches."""
        blocks = group_by_node(self.graph, gpus)
        if len(blocks) * min_stage_layers(self.problem) > self.problem.model.layers:   # ≥ 1 stage per block
            return None
        nodes = tuple(self.devs[b[0]].node for b in blocks)
        key = (*self._shape_key(blocks), m)
        if key in self._memo:
            hit = self._memo[key]
            if hit is None:
                return None
            order, choice = hit                               # re-apply the cached shape to these GPUs
            ordered = [blocks[i] for i in order]
            return self._build(ordered, self._menus(ordered), choice)
        best: tuple[float, tuple[int, ...], list[int], list[Stage]] | None = None
        per_block: dict[int, int] | None = None          # menu choice per block, from the first order
        for order in self._orders_of(nodes):
            if per_block is None or len(blocks) <= 8:
                t, ch, stages = self._descend([blocks[i] for i in order], m)
                per_block = per_block or {i: c for i, c in zip(order, ch)}
            else:                                        # many blocks: one round from the first choice
                t, ch, stages = self._descend([blocks[i] for i in order], m, [per_block[i] for i in order], 1)
            if math.isfinite(t) and (best is None or t < best[0]):
                best = (t, order, ch, stages)
        self._memo[key] = None if best is None else (best[1], best[2])
        return None if best is None else best[3]
