"""Cost of the data-parallel gradient sync across pipelines, following the slice plan."""

from __future__ import annotations

from collections import defaultdict

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.ir.slices import slice_pieces

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
    cl, tr = plan.problem.cluster, plan.problem.training
    devices = cl.devices()
    per_gpu: dict[int, float] = defaultdict(float)
    seen: dict[tuple, float] = {}  # (holders' nodes, payload) -> seconds: most layers repeat a few patterns
    for piece in slice_pieces(plan):
        payload = float(piece.hi - piece.lo) * unit_params(plan, piece.unit) * tr.dtype_bytes
        nodes = tuple(devices[g].node for g in piece.gpus)
        t = seen.get((nodes, payload))
        if t is None:
            t = seen[(nodes, payload)] = cost.collective_time(OpClass.ALL_REDUCE, len(piece.gpus), payload,
                                                              _slowest_link(cl, nodes), profile)
        for g in set(piece.gpus):
            per_gpu[g] += t
    return dict(per_gpu)


def _slowest_link(cl: Cluster, nodes: tuple[int, ...]) -> cost.Link:
    """The slowest link between any two holders (a node holding two of them: its own link); pairs
    in their first-met order, so ties resolve as over the full list."""
    pairs = dict.fromkeys((a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:])
    links = [cost.cluster_link(cl, a, b) for a, b in pairs]
    return min(links, key=cost.link_order)


def grad_sync_time(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> float:
    """Seconds until every GPU has synced its pieces (:func:`gpu_sync_times`; GPUs run in parallel)."""
    return max(gpu_sync_times(plan, profile).values(), default=0.0)
