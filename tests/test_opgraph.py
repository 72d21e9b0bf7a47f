"""Operator graph of one Llama layer (shared/reference/dhelix.md §1): op names and order under TP+SP,
the backward DAG's free weight-gradient sinks, the no-SP and TP-1 variants, and FLOPs that agree
with the cost model's closed form."""

from __future__ import annotations

import networkx as nx
import pytest
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.opgraph import (
    LayerGraph,
    OpClass,
    OpKind,
    Resource,
    build_head_ops,
    build_layer_graph,
)
from hexhelix.solver.cost import layer_forward_flops

# dhelix.md §1.1 F1..F14 and §1.2 B1..B18, in order
FWD_TP_SP = [
    "ln_attn", "allgather_attn", "gemm_attn_c", "fl_attn", "gemm_attn_l", "reduce_scatter_attn", "bda_attn",
    "ln_mlp", "allgather_mlp", "gemm_mlp_c", "swiglu_mlp", "gemm_mlp_l", "reduce_scatter_mlp", "bda_mlp",
]
BWD_TP_SP = [
    "bda_mlp_bwd", "allgather_mlp_bwd", "gemm_dgrad_mlp_l", "gemm_wgrad_mlp_l", "swiglu_bwd", "gemm_dgrad_mlp_c",
    "gemm_wgrad_mlp_c", "reduce_scatter_mlp_c_bwd", "ln_mlp_bwd", "bda_attn_bwd", "allgather_attn_bwd",
    "gemm_dgrad_attn_l", "gemm_wgrad_attn_l", "attn_bwd", "gemm_dgrad_attn_c", "gemm_wgrad_attn_c",
    "reduce_scatter_attn_c_bwd", "ln_attn_bwd",
]
# dhelix.md §1.2 "depends on" column
BWD_DEPS = {
    "allgather_mlp_bwd": "bda_mlp_bwd", "gemm_dgrad_mlp_l": "allgather_mlp_bwd",
    "gemm_wgrad_mlp_l": "allgather_mlp_bwd", "swiglu_bwd": "gemm_dgrad_mlp_l", "gemm_dgrad_mlp_c": "swiglu_bwd",
    "gemm_wgrad_mlp_c": "swiglu_bwd", "reduce_scatter_mlp_c_bwd": "gemm_dgrad_mlp_c",
    "ln_mlp_bwd": "reduce_scatter_mlp_c_bwd", "bda_attn_bwd": "ln_mlp_bwd", "allgather_attn_bwd": "bda_attn_bwd",
    "gemm_dgrad_attn_l": "allgather_attn_bwd", "gemm_wgrad_attn_l": "allgather_attn_bwd",
    "attn_bwd": "gemm_dgrad_attn_l", "gemm_dgrad_attn_c": "attn_bwd", "gemm_wgrad_attn_c": "attn_bwd",
    "reduce_scatter_attn_c_bwd": "gemm_dgrad_attn_c", "ln_attn_bwd": "reduce_scatter_attn_c_bwd",
}
WGRADS = {"gemm_wgrad_mlp_l", "gemm_wgrad_mlp_c", "gemm_wgrad_attn_l", "gemm_wgrad_attn_c"}
TRAIN = TrainingConfig(seq_len=4096, micro_batch=1)


def names(ops) -> list[str]:
    return [o.name for o in ops]


def dag(g: LayerGraph, ops) -> nx.DiGraph:
    d = nx.DiGraph()
    d.add_nodes_from(o.name for o in ops)
    d.add_edges_from((dep, o.name) for o in ops for dep in o.deps)
    return d


@pytest.fixture
def g8() -> LayerGraph:
    return build_layer_graph(PRESETS["llama2-7b"], TRAIN, 8, sequence_parallel=True)


def test_tp_sp_has_14_forward_and_18_backward_ops_named_as_dhelix(g8: LayerGraph) -> None:
    assert names(g8.forward) == FWD_TP_SP
    assert names(g8.backward) == BWD_TP_SP
    assert g8.sequence_parallel and g8.tp == 8


def test_forward_is_a_chain(g8: LayerGraph) -> None:
    assert g8.forward[0].deps == ()
    for prev, op in zip(g8.forward, g8.forward[1:]):
        assert op.deps == (prev.name,)
    d = dag(g8, g8.forward)
    assert nx.is_directed_acyclic_graph(d) and list(nx.all_topological_sorts(d)) == [FWD_TP_SP]


def test_backward_dag_matches_dhelix_and_wgrads_are_free_sinks(g8: LayerGraph) -> None:
    assert {o.name: o.deps for o in g8.backward} == {"bda_mlp_bwd": (), **{k: (v,) for k, v in BWD_DEPS.items()}}
    d = dag(g8, g8.backward)
    assert nx.is_directed_acyclic_graph(d)
    sinks = {n for n in d if d.out_degree(n) == 0}
    assert sinks == WGRADS | {"ln_attn_bwd"}
    assert {o.name for o in g8.backward if o.wgrad} == WGRADS
    # dhelix.md §1.2 counts 5,824 linear extensions of this DAG (the wgrads are the only freedom)
    assert sum(1 for _ in nx.all_topological_sorts(d)) == 5824


def test_op_kinds_resources_and_collectives(g8: LayerGraph) -> None:
    comm = [o for o in g8.ops if o.kind is OpKind.COMM]
    assert [o.op_class for o in comm if o.direction == "fwd"] == [
        OpClass.ALL_GATHER, OpClass.REDUCE_SCATTER, OpClass.ALL_GATHER, OpClass.REDUCE_SCATTER]
    assert [o.op_class for o in comm if o.direction == "bwd"] == [
        OpClass.ALL_GATHER, OpClass.REDUCE_SCATTER, OpClass.ALL_GATHER, OpClass.REDUCE_SCATTER]
    assert all(o.resource is Resource.INTRA and o.group_size == 8 and o.flops == 0 for o in comm)
    # payload: the full gathered boundary tensor b·s·h in bf16; the ring factor is the cost model's
    assert {o.payload_bytes for o in comm} == {1 * 4096 * 4096 * 2}
    compute = [o for o in g8.ops if o.kind is OpKind.COMPUTE]
    assert all(o.resource is Resource.COMPUTE and o.flops > 0 and o.mem_bytes > 0 for o in compute)


def test_without_sp_all_reduces_replace_ag_rs() -> None:
    g = build_layer_graph(PRESETS["llama2-7b"], TRAIN, 4, sequence_parallel=False)
    assert not g.sequence_parallel
    assert len(g.forward) == 12 and len(g.backward) == 16
    comm = [(o.name, o.op_class) for o in g.ops if o.op_class.is_comm]
    assert comm == [("allreduce_attn", OpClass.ALL_REDUCE), ("allreduce_mlp", OpClass.ALL_REDUCE),
                    ("allreduce_mlp_c_bwd", OpClass.ALL_REDUCE), ("allreduce_attn_c_bwd", OpClass.ALL_REDUCE)]
    assert names(g.forward) == [n.replace("reduce_scatter", "allreduce") for n in FWD_TP_SP
                                if not n.startswith("allgather")]
    # without SP the norms and residuals work on the whole sequence on every rank
    sp = build_layer_graph(PRESETS["llama2-7b"], TRAIN, 4, sequence_parallel=True)
    assert g.op("ln_attn").flops == 4 * sp.op("ln_attn").flops


def test_tp1_has_no_collectives() -> None:
    g = build_layer_graph(PRESETS["llama2-7b"], TRAIN, 1, sequence_parallel=True)
    assert not g.sequence_parallel
    assert not [o for o in g.ops if o.op_class.is_comm]
    assert len(g.forward) == 10 and len(g.backward) == 14
    assert nx.is_directed_acyclic_graph(dag(g, g.backward))


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b", "tiny"])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("sp", [True, False])
def test_gemm_and_attention_forward_flops_equal_the_cost_model(name: str, tp: int, sp: bool) -> None:
    model = PRESETS[name]
    train = TrainingConfig(seq_len=512, micro_batch=2)
    g = build_layer_graph(model, train, tp, sequence_parallel=sp)
    per_gpu = sum(o.flops for o in g.forward if o.op_class in (OpClass.GEMM, OpClass.ATTENTION))
    assert per_gpu * tp == pytest.approx(layer_forward_flops(model, 2, 512), rel=1e-12)


def test_llama2_7b_layer_forward_is_1_93_tflop(g8: LayerGraph) -> None:
    per_gpu = sum(o.flops for o in g8.forward if o.op_class in (OpClass.GEMM, OpClass.ATTENTION))
    assert per_gpu * 8 / 1e12 == pytest.approx(1.93, rel=0.01)
    # planners.md §4.4: 1.66 TFLOP linear + 0.27 attention
    linear = sum(o.flops for o in g8.forward if o.op_class is OpClass.GEMM) * 8
    assert linear / 1e12 == pytest.approx(1.66, rel=0.01)


def test_backward_gemm_flops_are_twice_forward(g8: LayerGraph) -> None:
    fwd = sum(o.flops for o in g8.forward if o.op_class is OpClass.GEMM)
    bwd = sum(o.flops for o in g8.backward if o.op_class is OpClass.GEMM)
    assert bwd == pytest.approx(2 * fwd, rel=1e-12)
    # each forward GEMM has a dgrad and a wgrad of equal size
    for fwd_name, grads in [("gemm_attn_c", "attn_c"), ("gemm_attn_l", "attn_l"),
                            ("gemm_mlp_c", "mlp_c"), ("gemm_mlp_l", "mlp_l")]:
        f = g8.op(fwd_name).flops
        assert g8.op(f"gemm_dgrad_{grads}").flops == g8.op(f"gemm_wgrad_{grads}").flops == pytest.approx(f)
    assert g8.op("attn_bwd").flops == 2 * g8.op("fl_attn").flops


def test_layer_graph_json_round_trip_and_validation(g8: LayerGraph) -> None:
    assert LayerGraph.from_dict(g8.to_dict()) == g8
    bad = g8.to_dict()
    bad["backward"][0]["deps"] = ["no_such_op"]
    with pytest.raises(ValueError, match="no_such_op"):
        LayerGraph.from_dict(bad)


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="not divisible by TP degree 3"):
        build_layer_graph(PRESETS["llama2-7b"], TRAIN, 3)


def test_head_ops_cover_embedding_and_vocab_parallel_head() -> None:
    m = PRESETS["llama2-7b"]
    ops = build_head_ops(m, TRAIN, 2)
    assert set(ops) == {"embed_fwd", "embed_bwd", "head_fwd", "head_bwd"}
    assert names(ops["head_fwd"]) == ["final_norm", "lm_head", "loss"]
    head = ops["head_fwd"][1]
    assert head.op_class is OpClass.GEMM and head.flops == 2 * 4096 * m.hidden * m.vocab / 2
    assert ops["head_bwd"][0].flops == 2 * head.flops
