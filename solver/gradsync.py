"""Cost of the data-parallel gradient sync across pipelines, following the slice plan."""

from __future__ import annotations

from collections import defaultdict

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.ir.slices import cut_unit, unit_holders

from . import cost

__all__ = ["gpu_sync_times", "grad_sync_time", "unit_params"]


def unit_params(plan: Plan, unit: str) -> int:
    """Parameters of a slice-plan unit (a layer, the embedding or the head)."""
    m = plan.problem.model
    if unit == "embedding":
        return m.embedding_params
    if unit == "head":
        return m.head_params
    return m.params_per_layer


def gpu_sync_times(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> dict[int, float]:
    """Seconds each GPU spends all-reducing the pieces it holds, pieces on one GPU serialised; each
    piece is a ring all-reduce over its holders at the speed of their slowest link. One pipeline:
    no sync (empty)."""
    if len(plan.pipelines) < 2:
        return {}
    tr = plan.problem.training
    links = _links_of(plan.problem.cluster)
    node_of = links.node_of
    per_gpu: dict[int, float] = defaultdict(float)
    seen: dict[tuple, float] = {}  # (holders' nodes, payload) -> seconds: most layers repeat a few patterns
    shares_of: dict[tuple, list[tuple[tuple[int, ...], float]]] = {}  # (holders, unit size) -> its pieces
    for unit, holders in unit_holders(plan).items():
        size = unit_params(plan, unit)
        key = (tuple(holders), size)
        shares = shares_of.get(key)
        if shares is None:  # consecutive layers of the same stages cut into the same pieces: cut once
            shares = shares_of[key] = []
            for piece in cut_unit(unit, holders):
                payload = float(piece.hi - piece.lo) * size * tr.dtype_bytes
                nodes = tuple(node_of[g] for g in piece.gpus)
                t = seen.get((nodes, payload))
                if t is None:
                    t = seen[(nodes, payload)] = cost.collective_time(OpClass.ALL_REDUCE, len(piece.gpus), payload,
                                                                      links.slowest(nodes), profile)
                shares.append((tuple(set(piece.gpus)), t))
        for gpus, t in shares:  # per GPU in piece order, as the pieces come (the same sums, bit for bit)
            for g in gpus:
                per_gpu[g] += t
    return dict(per_gpu)


class _Links:
    """A cluster's links between every two nodes, tabulated once, and the slowest link among each
    holder pattern met (planners score thousands of plans whose pieces repeat a few patterns)."""

    MAX_PATTERNS = 1 << 16

    def __init__(self, cl: Cluster) -> None:
        n = len(cl.nodes)
        self.node_of = [d.node for d in cl.devices()]
        self.link = [[cost.cluster_link(cl, a, b) for b in range(n)] for a in range(n)]
        self.order = [[cost.link_order(lk) for lk in row] for row in self.link]
        self._slowest: dict[tuple[int, ...], cost.Link] = {}

    def slowest(self, nodes: tuple[int, ...]) -> cost.Link:
        """The slowest link between any two holders (a node holding two of them: its own link); of
        equally slow links the first met in the order of pairs (i < j) of the holders."""
        lk = self._slowest.get(nodes)
        if lk is None:
            if len(self._slowest) >= self.MAX_PATTERNS:
                self._slowest.clear()
            lk = self._slowest[nodes] = self._first_slowest(nodes)
        return lk

    def _first_slowest(self, nodes: tuple[int, ...]) -> cost.Link:
        # pair (a, b) is first met at a's first position and b's first position after it, so walking
        # each distinct a from its first position visits the distinct pairs in first-met order
        best: tuple[int, int] | None = None
        best_order = 0.0
        lefts: set[int] = set()
        for i, a in enumerate(nodes):
            if a in lefts:
                continue
            lefts.add(a)
            row, rights = self.order[a], set()
            for b in nodes[i + 1:]:
                if b in rights:
                    continue
                rights.add(b)
                if best is None or row[b] < best_order:
                    best, best_order = (a, b), row[b]
        if best is None:
            raise ValueError("a piece needs at least two holders")
        return self.link[best[0]][best[1]]


_TABLES: dict[tuple, _Links] = {}


def _links_of(cl: Cluster) -> _Links:
    """The link table of ``cl`` (kept for a few clusters: its identity is its nodes and links)."""
    key = (cl.nodes, cl.inter_GBps, cl.latency_us, cl.links)
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= 8:
            _TABLES.clear()
        table = _TABLES[key] = _Links(cl)
    return table


def grad_sync_time(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> float:
    """Seconds until every GPU has synced its pieces (:func:`gpu_sync_times`; GPUs run in parallel)."""
    return max(gpu_sync_times(plan, profile).values(), default=0.0)
