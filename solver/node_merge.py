"""A merged view of a cluster for the fluid bound: each group of interchangeable nodes as one node
(docs/formulation.md §17).

The fluid bound's pricing DP does every node's work in every call, so on a cluster of many identical
nodes (the generated A100/A40 clusters: 64 nodes of two kinds at 512 GPUs) a root takes minutes.
Merging each group of interchangeable nodes into one node of their summed GPUs is a *relaxation* of
the planning problem when every inter-node link is the cluster's one ``inter_GBps`` link and a
group's own link is no slower (more bandwidth, no more latency):

* every plan maps to a plan of the merged cluster (a stage's node → its group's node) that is no
  slower: a TP group keeps its node's own link; a hand-off or a gradient-sync piece between two nodes
  of one group moves to the group's own link, no slower than the inter-node link it used;
* the merged cluster has the same links (each group's own link and the one inter-node link), so the
  floors that read link sets (:func:`.stage_floors.class_links`, :meth:`.CostTables.sync_layer_lb`)
  are the same numbers;
* a TP group stays within one physical node and, for a layer to sync on a node's own link, all P
  replicas need a GPU of that physical node: :attr:`.CostTables.node_sizes` keeps the physical size
  behind each merged node for those two rules (the TP degrees offered, and a stage whose node cannot
  also hold the other P − 1 replicas).

So the fluid bound of the merged view bounds the original problem from below (every pipeline count
alike). Its rounded masters are plans of the merged cluster, not of the original: the planner keeps
only its bounds (:mod:`.exact_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan

from .candidates import identical_node_groups

__all__ = ["MERGE_ABOVE_NODES", "MergedView", "fluid_view", "merged_view"]

MERGE_ABOVE_NODES = 8  # the planner's fluid search runs on the merged view above this many nodes


@dataclass(frozen=True, slots=True)
class MergedView:
    """The merged problem, the physical GPUs behind each of its nodes, and where each original node
    and GPU went."""

    problem: PlanProblem
    node_sizes: tuple[int, ...]   # GPUs of one physical node behind each merged node
    node_of: tuple[int, ...]      # original node -> merged node
    gpu_of: tuple[int, ...]       # original GPU id -> merged GPU id

    def map_plan(self, plan: Plan) -> Plan:
        """``plan`` on the merged cluster (same stages, layers and micro-batches)."""
        pipes = tuple(PipelinePlan(micro_batches=p.micro_batches, stages=tuple(
            StagePlan(node=self.node_of[s.node], gpus=tuple(self.gpu_of[g] for g in s.gpus), layers=s.layers)
            for s in p.stages)) for p in plan.pipelines)
        return Plan(problem=self.problem, pipelines=pipes, meta=plan.meta)


def _dominates_inter(cl: Cluster, node: int) -> bool:
    n = cl.nodes[node]
    return n.intra_GBps >= cl.inter_GBps and n.intra_latency_us <= cl.latency_us


def merged_view(problem: PlanProblem) -> MergedView | None:
    """Each group of interchangeable nodes whose own link dominates the inter-node link merged into
    one node (module docstring); None when the cluster has per-pair link overrides (the merged link
    set would differ) or when no two nodes merge. At least two nodes are kept, so that the view still
    has the inter-node link (a one-node view could not hold a layer synced across nodes)."""
    cl = problem.cluster
    if cl.links:
        return None
    groups = [g for grp in identical_node_groups(problem)
              for g in ([grp] if len(grp) > 1 and _dominates_inter(cl, grp[0]) else [[n] for n in grp])]
    if len(groups) == 1 and len(groups[0]) > 1:  # one group: keep its last node apart
        groups = [groups[0][:-1], groups[0][-1:]]
    if len(groups) == len(cl.nodes):
        return None
    groups.sort(key=lambda g: g[0])
    data = cl.to_dict()
    nodes, node_of, sizes = [], [0] * len(cl.nodes), []
    for m, grp in enumerate(groups):
        first = dict(data["nodes"][grp[0]])
        first["name"] = first["name"] if len(grp) == 1 else f"{first['name']}+{len(grp) - 1}"
        first["count"] = sum(cl.nodes[n].count for n in grp)
        nodes.append(first)
        sizes.append(cl.nodes[grp[0]].count)
        for n in grp:
            node_of[n] = m
    data.update(name=f"{cl.name} (merged)", nodes=nodes)
    merged = Cluster.from_dict(data)
    gpu_of = [0] * cl.num_gpus
    for m, grp in enumerate(groups):  # the group's GPUs, node by node, onto its merged node's in order
        for g, to in zip((g for n in grp for g in cl.node_gpus(n)), merged.node_gpus(m)):
            gpu_of[g] = to
    return MergedView(problem=PlanProblem(cluster=merged, model=problem.model, training=problem.training,
                                          schedule=problem.schedule),
                      node_sizes=tuple(sizes), node_of=tuple(node_of), gpu_of=tuple(gpu_of))


def fluid_view(problem: PlanProblem) -> MergedView | None:
    """The merged view the planner's fluid search runs on: above ``MERGE_ABOVE_NODES`` nodes (on
    smaller clusters the per-node locality branching is worth more than the faster pricing; the
    goal's example clusters have at most eight nodes), when anything merges."""
    return merged_view(problem) if len(problem.cluster.nodes) > MERGE_ABOVE_NODES else None
