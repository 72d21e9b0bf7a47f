"""Gradient sync across pipelines of different TP degrees (ir/slices.py, solver/gradsync.py): a unit is
cut at the union of its holders' shard boundaries, and each GPU syncs the pieces it holds, one ring
all-reduce per piece at the slowest link between that piece's holders."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import pytest
from hexhelix.ir.model import PRESETS, ModelConfig, TrainingConfig
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE
from hexhelix.ir.slices import cut_unit, slice_pieces
from hexhelix.solver import cost
from hexhelix.solver.gradsync import gpu_sync_times, unit_params


def test_a_unit_is_cut_at_the_union_of_its_holders_shard_boundaries() -> None:
    pieces = cut_unit("layer.0", [(0, 1), (2, 3, 4)])
    F = Fraction
    assert [(p.lo, p.hi) for p in pieces] == [(F(0), F(1, 3)), (F(1, 3), F(1, 2)), (F(1, 2), F(2, 3)), (F(2, 3), F(1))]
    assert [p.gpus for p in pieces] == [(0, 2), (0, 3), (1, 3), (1, 4)]
    # the same degrees with other GPUs give the same cuts, read from these GPUs
    assert [p.gpus for p in cut_unit("head", [(7, 9), (5, 6, 8)])] == [(7, 5), (7, 6), (9, 6), (9, 8)]


def stage(node: int, gpus: tuple[int, ...], lo: int, hi: int) -> StagePlan:
    return StagePlan(node=node, gpus=gpus, layers=(lo, hi))


def reference_sync(plan: Plan) -> dict[int, float]:
    """Piece by piece, with no memo: the slowest link over every pair of the piece's holders."""
    cl, tr = plan.problem.cluster, plan.problem.training
    devices = cl.devices()
    out: dict[int, float] = defaultdict(float)
    for piece in slice_pieces(plan):
        nodes = [devices[g].node for g in piece.gpus]
        links = [cost.cluster_link(cl, a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
        slow = min(links, key=lambda lk: lk.bandwidth / (1 + lk.bandwidth * lk.latency))
        payload = float(piece.hi - piece.lo) * unit_params(plan, piece.unit) * tr.dtype_bytes
        t = cost.collective_time(OpClass.ALL_REDUCE, len(piece.gpus), payload, slow, DEFAULT_PROFILE)
        for g in set(piece.gpus):
            out[g] += t
    return dict(out)


THIRDS = ModelConfig(name="m1536", layers=8, hidden=1536, heads=12, kv_heads=12, ffn=4608, vocab=1000)


@pytest.mark.parametrize("layout", ["tp-mixed", "shared-node", "uneven", "thirds"])
def test_every_gpu_syncs_the_pieces_it_holds_at_their_holders_slowest_link(small_cluster, layout: str) -> None:
    """small-mixed: node 0 = 4 A100 (GPUs 0-3), node 1 = 2 A40 (4-5), node 2 = 2 T4 (6-7)."""
    pipes = {
        "tp-mixed": [[stage(0, (0, 1), 0, 16), stage(0, (2, 3), 16, 32)],
                     [stage(1, (4, 5), 0, 32)],
                     [stage(2, (6,), 0, 20), stage(2, (7,), 20, 32)]],
        "shared-node": [[stage(0, (0,), 0, 10), stage(1, (4,), 10, 32)],
                        [stage(0, (1, 2), 0, 12), stage(2, (6, 7), 12, 32)],
                        [stage(0, (3,), 0, 8), stage(1, (5,), 8, 32)]],
        "uneven": [[stage(0, (0, 1, 2, 3), 0, 32)], [stage(1, (4,), 0, 5), stage(1, (5,), 5, 17),
                                                     stage(2, (6, 7), 17, 32)]],
        # TP 3 against TP 2: pieces of 1/3 and 1/6 of a unit (unequal payloads)
        "thirds": [[stage(0, (0, 1, 2), 0, 8)], [stage(1, (4, 5), 0, 3), stage(2, (6, 7), 3, 8)],
                   [stage(0, (3,), 0, 8)]],
    }[layout]
    problem = PlanProblem(cluster=small_cluster, model=THIRDS if layout == "thirds" else PRESETS["llama2-7b"],
                          training=TrainingConfig(global_batch=8, micro_batch=1, seq_len=1024))
    mbs = [8 // len(pipes)] * len(pipes)
    mbs[-1] += 8 - sum(mbs)
    plan = Plan(problem=problem, pipelines=tuple(PipelinePlan(stages=tuple(p), micro_batches=m) for p, m in zip(pipes, mbs)))
    got, want = gpu_sync_times(plan), reference_sync(plan)
    assert got.keys() == want.keys() and len(got) == plan.num_gpus_used
    for g in want:
        assert got[g] == pytest.approx(want[g], rel=1e-12), g


def test_pieces_sync_at_the_slowest_link_of_their_holders_under_per_pair_links() -> None:
    """Four nodes of two A100s with their own intra links and per-pair overrides (one pair faster,
    one slower than the default): every holder pattern of pipelines spread over them, several
    plans scored one after another (the link table and its patterns are reused across plans)."""
    from hexhelix.ir.cluster import Cluster

    cl = Cluster.from_dict({
        "name": "linked", "inter_GBps": 10, "latency_us": 20,
        "nodes": [{"name": f"n{i}", "gpu": "A100-SXM4-80GB", "count": 2, "intra_GBps": bw}
                  for i, bw in enumerate((300, 100, 300, 50))],
        "links": [{"between": ["n0", "n1"], "GBps": 40}, {"between": ["n2", "n3"], "GBps": 2, "latency_us": 5}],
    })
    problem = PlanProblem(cluster=cl, model=THIRDS, training=TrainingConfig(global_batch=8, micro_batch=1,
                                                                             seq_len=1024))
    layouts = [
        [[stage(0, (0,), 0, 4), stage(1, (2,), 4, 8)], [stage(0, (1,), 0, 2), stage(2, (4,), 2, 8)],
         [stage(3, (6, 7), 0, 8)]],
        [[stage(2, (4, 5), 0, 8)], [stage(3, (6,), 0, 3), stage(0, (0,), 3, 8)],
         [stage(1, (2,), 0, 5), stage(3, (7,), 5, 8)], [stage(0, (1,), 0, 8)]],
        [[stage(1, (2, 3), 0, 8)], [stage(3, (6, 7), 0, 8)]],
    ]
    for pipes in layouts:
        mbs = [2] * (len(pipes) - 1) + [8 - 2 * (len(pipes) - 1)]
        plan = Plan(problem=problem, pipelines=tuple(PipelinePlan(stages=tuple(p), micro_batches=m)
                                                     for p, m in zip(pipes, mbs)))
        got, want = gpu_sync_times(plan), reference_sync(plan)
        assert got.keys() == want.keys()
        for g in want:
            assert got[g] == pytest.approx(want[g], rel=1e-12), (pipes, g)
