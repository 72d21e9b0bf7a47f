"""The cost model (solver/cost.py) pinned to values computed by hand: FLOPs, model states,
activations by recompute mode, ring factors, α–β collectives, pipeline makespans (1F1B and W-shape)
and micro-batches in flight per schedule."""

from __future__ import annotations

import pytest
from hexhelix.ir.catalog import CATALOG, GpuType
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.opgraph import Op, OpClass, Resource
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.solver import cost
from hexhelix.solver.cost import Link

L7 = PRESETS["llama2-7b"]          # h 4096, a 32, f 11008
EXACT = Profile(link_efficiency=1.0)


# ----------------------------------------------------------------------------- FLOPs
def test_llama2_7b_layer_forward_flops() -> None:
    # 2·s·(2h² + 2h·h + 3h·f) + 4·s²·h at s = 4096, b = 1
    s, h, f = 4096, 4096, 11008
    by_hand = 2 * s * (4 * h * h + 3 * h * f) + 4 * s * s * h
    assert cost.layer_forward_flops(L7, 1, 4096) == by_hand
    assert by_hand / 1e12 == pytest.approx(1.93, rel=0.01)
    assert cost.layer_forward_flops(L7, 3, 4096) == 3 * by_hand


def test_gqa_forward_flops_for_70b() -> None:
    # planners.md §4.4: Llama-2 70B forward per layer at s = 4096 is 7.56 TFLOP
    assert cost.layer_forward_flops(PRESETS["llama2-70b"], 1, 4096) / 1e12 == pytest.approx(7.56, rel=0.01)


def test_model_flops_per_token_is_three_forwards_plus_head() -> None:
    per_tok = cost.model_flops_per_token(L7, 4096)
    assert per_tok == pytest.approx(32 * 3 * cost.layer_forward_flops(L7, 1, 4096) / 4096 + 6 * 4096 * 32000)
    # planners.md §4.4: 189 TFLOP per 4096-token sequence without recompute
    assert per_tok * 4096 / 1e12 == pytest.approx(189, rel=0.01)


# ----------------------------------------------------------------------------- memory
def test_model_states_are_16_bytes_per_param_sharded_over_tp() -> None:
    train = TrainingConfig()
    assert cost.model_state_bytes(1e9, 1, train) == 16e9
    assert cost.model_state_bytes(1e9, 4, train) == 4e9
    assert cost.model_state_bytes(1e9, 1, TrainingConfig(state_bytes_per_param=18)) == 18e9
    # planners.md §4.4: 7B ≈ 100 GiB of model states
    assert cost.model_state_bytes(L7.total_params, 1, train) / 2**30 == pytest.approx(100, rel=0.01)


SBH = 4096 * 1 * 4096  # s·b·h for Llama-2 7B, s = 4096, b = 1; a·s/h = 32


@pytest.mark.parametrize(("recompute", "sp", "tp", "by_hand"), [
    ("none", True, 8, SBH * (34 + 5 * 32) / 8),            # s·b·h·(34 + 5as/h)/t
    ("none", False, 8, SBH * (10 + 24 / 8 + 5 * 32 / 8)),  # s·b·h·(10 + 24/t + 5as/(ht))
    ("none", True, 1, SBH * 194),                          # no parallelism: 3.03 GiB (planners.md)
    ("none", False, 1, SBH * 194),
    ("selective", True, 8, 34 * SBH / 8),                  # 34·s·b·h/t
    ("selective", False, 8, SBH * (10 + 24 / 8)),          # s·b·h·(10 + 24/t)
    ("selective", True, 1, 34 * SBH),                      # 0.53 GiB (planners.md)
    ("full", True, 8, 2 * SBH / 8),                        # 2·s·b·h/t with SP
    ("full", False, 8, 2 * SBH),                           # 2·s·b·h without
])
def test_activation_bytes_per_layer(recompute: str, sp: bool, tp: int, by_hand: float) -> None:
    train = TrainingConfig(seq_len=4096, micro_batch=1, recompute=recompute, sequence_parallel=sp)
    assert cost.activation_bytes_per_layer(L7, train, tp) == pytest.approx(by_hand, rel=1e-12)


def test_activation_examples_from_planners_md() -> None:
    none = cost.activation_bytes_per_layer(L7, TrainingConfig(recompute="none"), 1)
    sel = cost.activation_bytes_per_layer(L7, TrainingConfig(recompute="selective"), 1)
    assert none / 2**30 == pytest.approx(3.03, abs=0.005)
    assert sel / 2**30 == pytest.approx(0.53, abs=0.005)
    two = cost.activation_bytes_per_layer(L7, TrainingConfig(micro_batch=2, global_batch=64), 1)
    assert two == pytest.approx(2 * none)


def test_fp32_activations_take_twice_the_bytes() -> None:
    for recompute in ("none", "selective", "full"):
        bf16 = TrainingConfig(recompute=recompute)
        fp32 = TrainingConfig(recompute=recompute, dtype="fp32")
        assert cost.activation_bytes_per_layer(L7, fp32, 4) == 2 * cost.activation_bytes_per_layer(L7, bf16, 4)
    assert cost.head_activation_bytes(L7, TrainingConfig(dtype="fp32"), 1) == \
        2 * cost.head_activation_bytes(L7, TrainingConfig(), 1)


def test_head_activation_bytes() -> None:
    # 4·s·b·h·(1 + V/h)/t
    assert cost.head_activation_bytes(L7, TrainingConfig(), 2) == pytest.approx(4 * SBH * (1 + 32000 / 4096) / 2)


@pytest.mark.parametrize(("schedule", "stage", "stages", "m", "expect"), [
    ("gpipe", 0, 4, 16, 16), ("gpipe", 3, 4, 16, 16),
    ("1f1b", 0, 4, 16, 4), ("1f1b", 1, 4, 16, 3), ("1f1b", 3, 4, 16, 1), ("1f1b", 0, 4, 2, 2),
    ("wshape", 0, 4, 16, 4), ("wshape", 3, 4, 16, 4), ("wshape", 2, 4, 3, 3),
])
def test_inflight_microbatches(schedule: str, stage: int, stages: int, m: int, expect: int) -> None:
    assert cost.inflight_microbatches(schedule, stage, stages, m) == expect


def test_inflight_rejects_unknown_schedule() -> None:
    with pytest.raises(ValueError, match="zigzag"):
        cost.inflight_microbatches("zigzag", 0, 2, 4)


# ----------------------------------------------------------------------------- communication
@pytest.mark.parametrize(("n", "ar", "ag"), [(1, 0.0, 0.0), (2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875)])
def test_ring_factors(n: int, ar: float, ag: float) -> None:
    assert cost.ring_factor(OpClass.ALL_REDUCE, n) == ar          # 2(n−1)/n
    assert cost.ring_factor(OpClass.ALL_GATHER, n) == ag          # (n−1)/n
    assert cost.ring_factor(OpClass.REDUCE_SCATTER, n) == ag
    assert cost.ring_factor(OpClass.SEND_RECV, n) == 1.0


def test_collective_time_alpha_beta() -> None:
    link = Link(bandwidth=100e9, latency=10e-6)
    S = 1e9
    # all-reduce: 2(n−1) steps of α, 2(n−1)/n·S over β
    assert cost.collective_time(OpClass.ALL_REDUCE, 4, S, link, EXACT) == pytest.approx(6 * 10e-6 + 1.5 * S / 100e9)
    # all-gather / reduce-scatter: n−1 steps, (n−1)/n·S
    assert cost.collective_time(OpClass.ALL_GATHER, 4, S, link, EXACT) == pytest.approx(3 * 10e-6 + 0.75 * S / 100e9)
    assert cost.collective_time(OpClass.REDUCE_SCATTER, 4, S, link, EXACT) == pytest.approx(3e-5 + 7.5e-3)
    assert cost.collective_time(OpClass.ALL_REDUCE, 1, S, link, EXACT) == 0.0
    assert cost.p2p_time(S, link, EXACT) == pytest.approx(10e-6 + S / 100e9)
    # the default profile delivers 80 % of nominal bandwidth
    assert DEFAULT_PROFILE.link_efficiency == 0.8
    assert cost.p2p_time(S, link) == pytest.approx(10e-6 + S / 80e9)


def test_stage_edge_cost_moves_one_boundary_tensor() -> None:
    link = Link(bandwidth=25e9, latency=10e-6)
    assert cost.stage_edge_cost(L7, TrainingConfig(), link, EXACT) == pytest.approx(10e-6 + SBH * 2 / 25e9)


def test_cluster_link_reads_node_link(small_cluster) -> None:
    assert cost.cluster_link(small_cluster, 0, 0) == Link(300e9, pytest.approx(5e-6))
    assert cost.cluster_link(small_cluster, 0, 2) == Link(5e9, pytest.approx(10e-6))     # override
    assert cost.cluster_link(small_cluster, 0, 1) == Link(12.5e9, pytest.approx(10e-6))  # default


# ----------------------------------------------------------------------------- compute
def test_op_time_gemm_is_flop_bound_and_norm_memory_bound() -> None:
    gpu = GpuType(name="Card", tflops=100.0, memory_gib=24, mem_GBps=1000.0)
    gemm = Op(name="g", direction="fwd", op_class=OpClass.GEMM, resource=Resource.COMPUTE, flops=7e12, mem_bytes=1)
    norm = Op(name="n", direction="fwd", op_class=OpClass.NORM, resource=Resource.COMPUTE, flops=1, mem_bytes=7e9)
    assert cost.op_time(gemm, gpu) == pytest.approx(7e12 / (100e12 * 0.70))
    assert cost.op_time(norm, gpu) == pytest.approx(7e9 / (1000e9 * 0.70))
    prof = Profile(gpu_overrides={"Card": {"tflops": 50.0}}, per_gpu_efficiency={"Card": {"gemm": 0.5}})
    assert cost.gpu_peak_flops(gpu, prof) == 50e12
    assert cost.op_time(gemm, gpu, profile=prof) == pytest.approx(7e12 / (50e12 * 0.5))
    coll = Op(name="c", direction="fwd", op_class=OpClass.ALL_GATHER, resource=Resource.INTRA, payload_bytes=1e6,
              group_size=2)
    with pytest.raises(ValueError, match="needs a link"):
        cost.op_time(coll, gpu)


def test_layer_cost_tp_comm_and_recompute() -> None:
    a100, intra = CATALOG["A100-SXM4-80GB"], Link(300e9, 5e-6)
    base = cost.layer_cost(L7, TrainingConfig(), 8, a100, intra, EXACT)
    # 2 AG + 2 RS forward over 8 GPUs: 7 steps of α and 7/8 of the 32 MiB boundary tensor each
    one = 7 * 5e-6 + 0.875 * SBH * 2 / 300e9
    assert base.fwd_comm == pytest.approx(4 * one)
    assert base.bwd_comm == pytest.approx(4 * one)
    # compute: GEMMs at 70 % and attention at 50 % of peak, plus a few % of memory-bound ops
    attn_flops = 4 * 4096 * 4096 * 4096
    gemm_s = (cost.layer_forward_flops(L7, 1, 4096) - attn_flops) / 8 / (a100.peak_flops * 0.7)
    attn_s = attn_flops / 8 / (a100.peak_flops * 0.5)
    assert gemm_s + attn_s < base.fwd_compute < 1.1 * (gemm_s + attn_s)
    full = cost.layer_cost(L7, TrainingConfig(recompute="full"), 8, a100, intra, EXACT)
    assert full.bwd_compute == pytest.approx(base.bwd_compute + base.fwd_compute)
    assert full.bwd_comm == pytest.approx(base.bwd_comm + base.fwd_comm)
    assert full.fwd == pytest.approx(base.fwd)
    sel = cost.layer_cost(L7, TrainingConfig(recompute="selective"), 8, a100, intra, EXACT)
    assert base.bwd_compute < sel.bwd_compute < full.bwd_compute
    assert sel.bwd_comm == pytest.approx(base.bwd_comm)


# ----------------------------------------------------------------------------- pipelines
def test_pipeline_time_is_m_minus_1_max_plus_sum() -> None:
    assert cost.pipeline_time([1.0, 2.0, 3.0], 4) == 3 * 3.0 + 6.0
    assert cost.pipeline_time([2.0], 5) == 10.0
    assert cost.pipeline_time([1.0, 1.0], 1) == 2.0


@pytest.mark.parametrize(("P", "m", "g"), [(4, 10, 0.2), (2, 3, 0.4), (8, 64, 0.1), (1, 5, 0.3)])
def test_wshape_makespan_on_equal_stages(P: int, m: int, g: float) -> None:
    f, b = 1.0, 2.0
    # shared/reference/dhelix.md §3.4: (f+b)·(P + (m−1)(1−g))
    assert cost.wshape_pipeline_time([f + b] * P, [g] * P, m) == pytest.approx((f + b) * (P + (m - 1) * (1 - g)))


@pytest.mark.parametrize("stages", [[3.0] * 4, [1.0, 4.0, 2.0], [2.5]])
def test_wshape_equals_1f1b_without_saving(stages: list[float]) -> None:
    m = 12
    assert cost.wshape_pipeline_time(stages, [0.0] * len(stages), m) == pytest.approx(cost.pipeline_time(stages, m))
    assert cost.pipeline_time([3.0] * 4, m) == pytest.approx(3.0 * (m + 4 - 1))  # (f+b)(m+P−1)


def test_wshape_with_no_more_microbatches_than_stages_pairs_nothing() -> None:
    # m ≤ P: no tick co-executes (dhelix.md §3.4 edge case), so the saving does not apply; without
    # the (f, b) split the 1F1B time (an upper bound) is kept for old callers
    assert cost.wshape_pipeline_time([3.0] * 4, [0.5] * 4, 4) == cost.pipeline_time([3.0] * 4, 4)
    with_split = cost.wshape_pipeline_time([3.0] * 4, [0.5] * 4, 4, [(1.0, 2.0)] * 4)
    assert with_split == cost.wshape_pipeline_time([3.0] * 4, [0.0] * 4, 4, [(1.0, 2.0)] * 4)


@pytest.mark.parametrize(("P", "m", "f", "b", "want"), [
    (8, 8, 1.0, 2.0, 38.0),   # 8·3 + 7·2 (1F1B: 15·3 = 45)
    (8, 8, 2.0, 1.0, 38.0),   # forward-bound chain, same value by symmetry of max
    (4, 1, 1.0, 2.0, 12.0),   # one micro-batch: its W alone, P(f+b)
    (4, 3, 1.0, 3.0, 22.0),   # 4·4 + 2·3
    (3, 3, 2.0, 2.0, 16.0),   # 3·4 + 2·2
    (2, 2, 0.5, 1.5, 5.5),    # 2·2 + 1·1.5
])
def test_wshape_with_m_at_most_P_hand_computed(P: int, m: int, f: float, b: float, want: float) -> None:
    """m ≤ P on equal stages: P(f+b) + (m−1)·max(f, b) (derivation in the docstring of
    cost.wshape_pipeline_time: two chains through the turnaround stage), hand-computed."""
    assert cost.wshape_pipeline_time([f + b] * P, [0.3] * P, m, [(f, b)] * P) == pytest.approx(want)
    if m >= 2:
        assert want < cost.pipeline_time([f + b] * P, m)  # below 1F1B


@pytest.mark.parametrize(("P", "m"), [(2, 1), (2, 2), (3, 2), (4, 4), (5, 3), (8, 8)])
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (2.0, 1.0), (1.5, 1.5)])
def test_wshape_with_m_at_most_P_matches_the_simulator(P: int, m: int, f: float, b: float) -> None:
    """The cost model's m ≤ P form against the discrete-event replay of the compiled tick order."""
    from hexhelix.runtime.sim import simulate
    from hexhelix.runtime.sim_synth import synthetic_program

    sim = simulate(synthetic_program("wshape", P, m, f=f, b=b, g=0.3)).makespan_s
    assert cost.wshape_pipeline_time([f + b] * P, [0.3] * P, m, [(f, b)] * P) == pytest.approx(sim, rel=1e-12)


def test_wshape_compute_split_must_match_the_stages() -> None:
    with pytest.raises(ValueError, match="2 \\(f, b\\) pairs for 3 stages"):
        cost.wshape_pipeline_time([3.0] * 3, [0.0] * 3, 2, [(1.0, 2.0)] * 2)


def test_cluster_links_are_the_distinct_links_of_every_node_pair() -> None:
    """Minima over links take each (bandwidth, latency) once: 16 alternating A100/A40 nodes have 136
    node pairs but three links (two intra-node kinds and the inter-node one), and a per-pair link
    override adds one more."""
    from hexhelix.ir.cluster import Cluster
    from hexhelix.solver.cost import cluster_link, cluster_links

    nodes = [{"name": f"n{i}", "gpu": "A100-SXM4-80GB" if i % 2 == 0 else "A40", "count": 8,
              "intra_GBps": 300 if i % 2 == 0 else 25} for i in range(16)]
    cl = Cluster.from_dict({"name": "gen", "nodes": nodes, "inter_GBps": 25})
    every = {cluster_link(cl, a, b) for a in range(16) for b in range(a, 16)}
    assert sorted(cluster_links(cl), key=lambda lk: (lk.bandwidth, lk.latency)) == \
        sorted(every, key=lambda lk: (lk.bandwidth, lk.latency))
    assert len(cluster_links(cl)) == 3
    cl2 = Cluster.from_dict({"name": "gen", "nodes": nodes, "inter_GBps": 25,
                             "links": [{"between": ["n0", "n5"], "GBps": 5}]})
    assert len(cluster_links(cl2)) == 4
