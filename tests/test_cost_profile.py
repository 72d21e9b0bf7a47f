"""Profile fields that calibrate the cost model to the runtime (issue 8): the measured AdamW
efficiency (``optimizer``) and ``attention_scores_saved``. Each changes the cost model, the
evaluator and the compiler's estimates by exactly its formula, round-trips through the profile
JSON, and a profile without it behaves exactly as before."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from compile_cases import MODEL16, make_plan
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import TrainingConfig
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile, load_profile
from hexhelix.ir.program import Op
from hexhelix.solver import cost
from hexhelix.solver.compile import compile_plan
from hexhelix.solver.evaluate import stage_cost

BASE = Profile(per_gpu_efficiency={"A40": {"gemm": 0.6, "elementwise": 0.55}})


def _scores_term(train: TrainingConfig, heads: int, tp: int) -> float:
    """5·a·s²·b bytes of 16-bit attention scores, scaled by dtype/2 and split over TP (by hand)."""
    s, b = train.seq_len, train.micro_batch
    return 5.0 * heads * s * s * b * (train.dtype_bytes / 2) / tp


# ----------------------------------------------------------------------------- JSON
def test_new_fields_round_trip_and_old_profiles_read_as_before(tmp_path):
    prof = replace(BASE, attention_scores_saved=False,
                   per_gpu_efficiency={"A40": {"gemm": 0.6, "elementwise": 0.55, "optimizer": 0.21}})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof.to_dict()))
    back = load_profile(path)
    assert back == prof and back.attention_scores_saved is False
    assert back.eff("A40", "optimizer", fallback="elementwise") == 0.21
    # A profile/1 file written before these fields existed: both behave as the defaults.
    old = {k: v for k, v in BASE.to_dict().items() if k != "attention_scores_saved"}
    path.write_text(json.dumps(old))
    legacy = load_profile(path)
    assert legacy == BASE and legacy.attention_scores_saved is True
    assert legacy.eff("A40", "optimizer", fallback="elementwise") == 0.55
    assert legacy.eff("A40", "optimizer") == 0.5  # no fallback: the documented 0.5, as before


def test_attention_scores_saved_must_be_a_bool():
    with pytest.raises(InvalidInputError, match="attention_scores_saved"):
        Profile.from_dict({**Profile().to_dict(), "attention_scores_saved": "no"})


# ----------------------------------------------------------------------------- optimizer
def test_optimizer_efficiency_replaces_elementwise_by_exactly_the_formula(small_cluster):
    gpu = small_cluster.gpu_of_node(0)
    tr = TrainingConfig(global_batch=8, micro_batch=1, seq_len=128, dtype="fp32")
    params = 3.5e6
    base = Profile(per_gpu_efficiency={gpu.name: {"elementwise": 0.8}})
    measured = Profile(per_gpu_efficiency={gpu.name: {"elementwise": 0.8, "optimizer": 0.2}})
    bw = gpu.mem_GBps * 1e9
    assert cost.optimizer_time(params, gpu, tr, base) == 2.0 * params * 16.0 / (bw * 0.8)
    assert cost.optimizer_time(params, gpu, tr, measured) == 2.0 * params * 16.0 / (bw * 0.2)
    assert cost.optimizer_time(params, gpu, tr) == 2.0 * params * 16.0 / (bw * DEFAULT_PROFILE.eff(gpu.name,
                                                                                                "elementwise"))


def test_optimizer_efficiency_moves_the_compiled_opt_estimates_exactly():
    plan = make_plan([(2, 4, (1, 2))])
    gpus = {st.node: plan.problem.cluster.gpu_of_node(st.node).name for p in plan.pipelines for st in p.stages}
    eff = {g: {"elementwise": 0.5, "optimizer": 0.125} for g in gpus.values()}
    before = compile_plan(plan, profile=Profile(per_gpu_efficiency={g: {"elementwise": 0.5} for g in eff}))
    after = compile_plan(plan, profile=Profile(per_gpu_efficiency=eff))
    n = 0
    for r, (a, b) in enumerate(zip(before.programs, after.programs)):
        for x, y in zip(a, b):
            if x.op is Op.OPT:
                assert y.dur == pytest.approx(4.0 * x.dur, rel=1e-12), r  # 0.5 / 0.125
                n += 1
            else:
                assert (x.dur, x.bytes) == (y.dur, y.bytes)
    assert n == before.world_size


# ----------------------------------------------------------------------------- activations
@pytest.mark.parametrize("tp,sp", [(1, False), (2, True), (2, False), (4, True)])
@pytest.mark.parametrize("b,dtype", [(1, "bf16"), (2, "fp32")])
def test_scores_flag_removes_exactly_the_score_term(tp, sp, b, dtype):
    tr = TrainingConfig(global_batch=8, micro_batch=b, seq_len=64, dtype=dtype, sequence_parallel=sp)
    with_scores = cost.activation_bytes_per_layer(MODEL16, tr, tp)
    without = cost.activation_bytes_per_layer(MODEL16, tr, tp, replace(DEFAULT_PROFILE, attention_scores_saved=False))
    assert with_scores == cost.activation_bytes_per_layer(MODEL16, tr, tp, DEFAULT_PROFILE)
    assert with_scores - without == pytest.approx(_scores_term(tr, MODEL16.heads, tp), rel=1e-12)
    # Recompute modes never count the scores: the flag changes nothing there.
    for mode in ("selective", "full"):
        trm = replace(tr, recompute=mode)
        assert cost.activation_bytes_per_layer(MODEL16, trm, tp) == cost.activation_bytes_per_layer(
            MODEL16, trm, tp, replace(DEFAULT_PROFILE, attention_scores_saved=False))


def test_scores_flag_reaches_the_evaluator_and_the_compiler():
    plan = make_plan([(2, 4, (2, 1))], schedule="gpipe")
    pr = plan.problem
    fused = replace(DEFAULT_PROFILE, attention_scores_saved=False)
    for k, st in enumerate(plan.pipelines[0].stages):
        a = stage_cost(pr, st, k, 2, 4, None, DEFAULT_PROFILE)
        b = stage_cost(pr, st, k, 2, 4, None, fused)
        # GPipe holds all m = 4 micro-batches of every layer of the stage.
        assert a.memory_bytes - b.memory_bytes == pytest.approx(
            st.num_layers * 4 * _scores_term(pr.training, MODEL16.heads, st.tp), rel=1e-9)
        assert (a.fwd, a.bwd) == (b.fwd, b.bwd)
    before, after = compile_plan(plan), compile_plan(plan, profile=fused)
    for r in range(before.world_size):
        st = next(s for s in before.stages if r in s.ranks)
        term = (st.layers[1] - st.layers[0]) * _scores_term(pr.training, MODEL16.heads, len(st.ranks))
        for x, y in zip(before.programs[r], after.programs[r]):
            if x.op is Op.F:
                assert x.bytes - y.bytes == pytest.approx(term, abs=1.0)  # bytes are rounded to int
                assert x.dur == y.dur


def test_default_profile_keeps_korthikanti_by_hand():
    """Without a profile the formula is today's: s·b·h·(34 + 5·a·s/h)/t with TP+SP."""
    tr = TrainingConfig(global_batch=8, micro_batch=2, seq_len=64, sequence_parallel=True)
    s, b, h, a, t = 64, 2, MODEL16.hidden, MODEL16.heads, 2
    assert cost.activation_bytes_per_layer(MODEL16, tr, t) == pytest.approx(s * b * h * (34 + 5 * a * s / h) / t)
