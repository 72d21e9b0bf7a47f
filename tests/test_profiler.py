"""The profiler: α–β fitting, the OEF formula, kernels that match the op graph, calibration that
the cost model reproduces, and a --quick profile on 2 gloo ranks that round-trips."""

from __future__ import annotations

import json
import random

import pytest
from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.opgraph import OpClass, build_layer_graph
from hexhelix.ir.profile import Profile, load_profile
from hexhelix.runtime.profiler import Measurements, calibrate, local_cluster
from hexhelix.runtime.profiler_comm import fit_alpha_beta, oef
from hexhelix.runtime.profiler_kernels import layer_kernels, layer_saved_bytes, layer_saved_tensors
from hexhelix.solver import cost

STEPS = lambda c, n: float(cost.collective_steps(OpClass(c), n))  # noqa: E731
FACTOR = lambda c, n: cost.ring_factor(OpClass(c), n)  # noqa: E731


# ----------------------------------------------------------------------------- fitting
def test_fit_recovers_alpha_beta_exactly_without_noise():
    alpha, beta = 35e-6, 1.7e9
    rows = [(STEPS("all_reduce", n), FACTOR("all_reduce", n) * s,
             STEPS("all_reduce", n) * alpha + FACTOR("all_reduce", n) * s / beta)
            for n in (2, 3, 4) for s in (1e3, 1e4, 1e5, 1e6, 1e7)]
    fit = fit_alpha_beta(rows)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_Bps == pytest.approx(beta, rel=1e-9)
    assert fit.rel_rms < 1e-9


def test_fit_recovers_alpha_beta_with_seeded_noise():
    rng = random.Random(7)
    alpha, beta = 50e-6, 0.8e9
    rows = [(1.0, s, (alpha + s / beta) * (1 + rng.gauss(0, 0.03))) for s in (4**k for k in range(5, 13))
            for _ in range(5)]
    fit = fit_alpha_beta(rows)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.1)
    assert fit.beta_Bps == pytest.approx(beta, rel=0.05)
    assert 0.01 < fit.rel_rms < 0.06


def test_fit_clamps_negative_alpha_and_rejects_flat_data():
    fit = fit_alpha_beta([(1.0, s, s / 1e9 * 1.01 if s > 1e5 else s / 1e9 * 0.99) for s in (1e4, 1e5, 1e6, 1e7)])
    assert fit.alpha_s >= 0.0 and fit.beta_Bps == pytest.approx(1e9, rel=0.02)
    with pytest.raises(InvalidInputError, match="no bandwidth term"):
        fit_alpha_beta([(1.0, s, 1e-3) for s in (1e3, 1e6)] + [(1.0, 1e7, 0.9e-3)])
    with pytest.raises(InvalidInputError, match="at least 2"):
        fit_alpha_beta([(1.0, 1e3, 1e-3)])


def test_oef_formula_dhelix_eq1():
    assert oef(4.0, 2.0, 4.0) == 1.0          # shorter op fully hidden
    assert oef(4.0, 2.0, 6.0) == 0.0          # serial
    assert oef(4.0, 2.0, 5.0) == 0.5
    assert oef(4.0, 2.0, 7.0) == -0.5         # contention: slower than serial
    with pytest.raises(ValueError):
        oef(0.0, 1.0, 1.0)


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("model", ["tiny", "llama2-7b", "llama2-70b"])
@pytest.mark.parametrize("tp,sp", [(1, True), (2, True), (2, False), (4, True)])
def test_kernels_cover_every_compute_op_with_matching_flops(model, tp, sp):
    m = PRESETS[model]
    tr = TrainingConfig(seq_len=64, global_batch=4, sequence_parallel=sp)
    pairs = layer_kernels(m, tr, tp)
    g = build_layer_graph(m, tr, tp)
    compute = [o.name for o in g.ops if not o.op_class.is_comm]
    names = [op.name for op, _ in pairs]
    assert names[:len(compute)] == compute
    assert {"embedding", "lm_head", "loss", "lm_head_bwd"} <= set(names)


def test_layer_saved_bytes_scale_with_the_micro_batch_and_exclude_weights(tiny):
    one = layer_saved_bytes(tiny, TrainingConfig(seq_len=32, global_batch=4, micro_batch=1, dtype="fp32"), 1,
                            "cpu", "fp32")
    two = layer_saved_bytes(tiny, TrainingConfig(seq_len=32, global_batch=4, micro_batch=2, dtype="fp32"), 1,
                            "cpu", "fp32")
    assert two == 2 * one  # linear in b: no constant term, so no weight is counted
    assert one >= 3 * 32 * tiny.hidden * 4  # at least the layer input and the two norms' inputs


def test_saved_tensors_detect_attention_scores_only_when_kept(tiny):
    """The math SDPA backend keeps the (b, a, s, s) probabilities for its backward; the profiler must
    see them there, and the bytes must grow by about one such tensor."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tr = TrainingConfig(seq_len=32, global_batch=4, micro_batch=2, dtype="fp32")
    fused, fused_scores = layer_saved_tensors(tiny, tr, 1, "cpu", "fp32")
    with sdpa_kernel(SDPBackend.MATH):
        math_bytes, math_scores = layer_saved_tensors(tiny, tr, 1, "cpu", "fp32")
    assert math_scores is True
    if not fused_scores:  # a fused kernel on this build: the score tensor is the difference
        assert math_bytes - fused >= 0.5 * 2 * tiny.heads * 32 * 32 * 4


# ----------------------------------------------------------------------------- calibration
def _synthetic_measurements(tiny) -> Measurements:
    tr = TrainingConfig(seq_len=32, global_batch=4, dtype="fp32")
    rng = random.Random(3)
    m = Measurements(device="test CPU", gpu_type="cpu", backend="gloo", peak_flops=100e9, mem_Bps=20e9)
    for tp in (1, 2):
        for op, _ in layer_kernels(tiny, tr, tp):
            m.ops.append({"tp": tp, "name": op.name, "class": op.op_class.value, "flops": op.flops,
                          "mem_bytes": op.mem_bytes, "seconds": rng.uniform(1e-5, 1e-4)})
    alpha, beta = 40e-6, 1e9
    for c, bwf, af in (("all_reduce", 0.5, 2.0), ("all_gather", 0.8, 1.0), ("reduce_scatter", 0.7, 3.0)):
        for n in (2, 3, 4):
            for s in (1e3, 1e5, 1e7):
                t = STEPS(c, n) * alpha * af + FACTOR(c, n) * s / (beta * bwf)
                m.comm.setdefault("collectives", []).append({"op": c, "n": n, "bytes": s, "seconds": t})
    m.comm["send_recv"] = [{"op": "send_recv", "n": 2, "bytes": s, "seconds": alpha + s / beta}
                           for s in (1e3, 1e5, 1e7)]
    m.oef = {"gemm|all_reduce": {"oef": 0.42, "t_a": 1.0, "t_b": 1.0, "t_ab": 1.58}}
    m.reserve_bytes = 123 * 2**20
    return m


def test_calibrated_profile_reproduces_measurements_in_the_cost_model(tiny, tmp_path):
    meas = _synthetic_measurements(tiny)
    prof = calibrate(meas, steps=STEPS, factor=FACTOR)
    # Round trip through the schema'd JSON.
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof.to_dict()))
    back = load_profile(path)
    assert back == prof and back.meta["gpu_type"] == "cpu"
    # The cluster file names the measured type; with it, the cost model's time of every op class
    # summed over the measured ops equals the measured sum.
    cl_path = tmp_path / "c.yaml"
    import yaml

    cl_path.write_text(yaml.safe_dump(local_cluster(back, count=2, memory_gib=4.0)))
    cl = load_cluster(cl_path)
    gpu = cl.gpu_of_node(0)
    tr = TrainingConfig(seq_len=32, global_batch=4, dtype="fp32")
    for cls in ("gemm", "attention", "norm", "elementwise"):
        measured = sum(o["seconds"] for o in meas.ops if o["class"] == cls)
        predicted = sum(cost.op_time(op, gpu, None, back) for tp in (1, 2)
                        for op, _ in layer_kernels(tiny, tr, tp) if op.op_class.value == cls)
        assert predicted == pytest.approx(measured, rel=1e-9), cls
    # Links: the fitted per-class factors reproduce the synthetic collectives exactly.
    link = cost.cluster_link(cl, 0, 0)
    for s in meas.comm["collectives"]:
        t = cost.collective_time(OpClass(s["op"]), s["n"], s["bytes"], link, back)
        assert t == pytest.approx(s["seconds"], rel=1e-6)
    assert back.link_factors("all_reduce") == pytest.approx((0.5, 2.0))
    assert back.overlap("all_reduce", "gemm") == 0.42
    assert back.runtime_reserve_bytes == 123 * 2**20


def test_layer_overhead_is_folded_into_every_class(tiny):
    meas = _synthetic_measurements(tiny)
    plain = calibrate(meas, steps=STEPS, factor=FACTOR)
    meas.meta["layer_overhead"] = {1: 1.5, 2: 2.5}  # autograd layer took 1.5x / 2.5x its kernels
    folded = calibrate(meas, steps=STEPS, factor=FACTOR)
    unfolded = calibrate(meas, steps=STEPS, factor=FACTOR, fold_overhead=False)
    for cls, e in plain.per_gpu_efficiency["cpu"].items():
        assert folded.per_gpu_efficiency["cpu"][cls] == pytest.approx(e / 2.0)
        assert unfolded.per_gpu_efficiency["cpu"][cls] == pytest.approx(e)
        assert folded.meta["kernel_efficiency"][cls] == pytest.approx(e)
    assert folded.meta["overhead_folded"] == pytest.approx(2.0)


def test_optimizer_and_scores_measurements_calibrate_the_cost_model(tiny, tmp_path):
    meas = _synthetic_measurements(tiny)
    meas.meta["optimizer"] = {"params": 2_000_000, "seconds": 4e-3, "state_bytes_per_param": 16.0}
    meas.meta["attention_scores_saved"] = False
    meas.meta["layer_overhead"] = {1: 1.5}  # folded into the compute classes, never into the optimizer
    prof = calibrate(meas, steps=STEPS, factor=FACTOR)
    assert prof.attention_scores_saved is False
    assert prof.per_gpu_efficiency["cpu"]["optimizer"] == pytest.approx(2 * 2e6 * 16 / (20e9 * 4e-3))
    import yaml

    cl_path = tmp_path / "c.yaml"
    cl_path.write_text(yaml.safe_dump(local_cluster(prof, count=2, memory_gib=4.0)))
    gpu = load_cluster(cl_path).gpu_of_node(0)
    tr = TrainingConfig(seq_len=32, global_batch=4, dtype="fp32")
    # The cost model's AdamW time of the measured parameter count is the measured time.
    assert cost.optimizer_time(2e6, gpu, tr, prof) == pytest.approx(4e-3, rel=1e-6)
    # Without those measurements the profile keeps the base's behaviour.
    plain = calibrate(_synthetic_measurements(tiny), steps=STEPS, factor=FACTOR)
    assert plain.attention_scores_saved is True and "optimizer" not in plain.per_gpu_efficiency["cpu"]


def test_collectives_in_step_are_preferred_for_the_fit(tiny):
    """When the profiler measured collectives as a step issues them (after compute), α and β of
    those classes come from them; the back-to-back samples stay in meta only."""
    meas = _synthetic_measurements(tiny)
    alpha, beta = 40e-6, 1e9
    meas.comm["collectives_in_step"] = [
        {"op": "all_reduce", "n": 2, "bytes": s, "seconds": STEPS("all_reduce", 2) * alpha * 7.0
         + FACTOR("all_reduce", 2) * s / (beta * 0.25)} for s in (1e3, 1e5, 1e7)]
    prof = calibrate(meas, steps=STEPS, factor=FACTOR)
    assert prof.link_factors("all_reduce") == pytest.approx((0.25, 7.0))
    assert prof.link_factors("all_gather") == pytest.approx((0.8, 1.0))  # no in-step rows: back-to-back
    assert len(prof.meta["comm_samples_in_step"]) == 3


def test_profile_rejects_malformed_links():
    with pytest.raises(InvalidInputError, match=r"links\.bogus"):
        Profile(links={"bogus": {"bw_factor": 1.0}})
    with pytest.raises(InvalidInputError, match=r"links\.all_reduce\.bw_factor"):
        Profile(links={"all_reduce": {"bw_factor": 0}})
    assert Profile().link_factors("all_reduce") == (1.0, 1.0)


# ----------------------------------------------------------------------------- end to end
@pytest.mark.multirank
def test_quick_profile_on_two_gloo_ranks_round_trips(tmp_path, capsys):
    from hexhelix.cli import main

    out, cl = tmp_path / "profile.json", tmp_path / "local.yaml"
    rc = main(["profile", "--quick", "--nproc", "2", "--seq-len", "32", "--timeout", "90",
               "-o", str(out), "--cluster-out", str(cl)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "compute ops of tiny at TP 2" in err and "point-to-point link" in err
    prof = load_profile(out)
    assert "cluster_link" in prof.meta, prof.meta["link_fit"]
    assert Profile.from_dict(prof.to_dict()) == prof
    assert prof.meta["versions"]["torch"] and prof.meta["backend"] == "gloo"
    assert set(prof.per_gpu_efficiency["cpu"]) == {"gemm", "attention", "norm", "elementwise", "optimizer"}
    assert prof.meta["optimizer"]["params"] > 0 and isinstance(prof.attention_scores_saved, bool)
    assert set(prof.meta["stage_step_fit"]) == {"1", "2"}  # JSON keys; the runtime stage at each TP
    assert {r["op"] for r in prof.meta["comm_samples_in_step"]} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert prof.gpu_overrides["cpu"]["tflops"] > 0 and prof.link_efficiency == 1.0
    assert {"gemm|all_reduce", "gemm|send_recv", "gemm|gemm"} <= set(prof.meta["oef_measured"])
    assert prof.meta["oef_measured"]["gemm|gemm"]["method"].startswith("two threads per rank")
    assert -1.0 <= prof.overlap("gemm", "all_reduce") <= 1.0
    cluster = load_cluster(cl)
    assert cluster.gpu_of_node(0).name == "cpu" and cluster.num_gpus == 2
    assert cluster.gpu_of_node(0).tflops == pytest.approx(prof.gpu_overrides["cpu"]["tflops"], rel=1e-5)


def test_profile_cli_rejects_bad_flags(capsys):
    from hexhelix.cli import main

    assert main(["profile", "--tp", "3", "--quick"]) == 2
    assert "not divisible by TP degree 3" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert main(["profile", "--backend", "nccl", "--quick"]) == 2
        assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "field"), [
    (["--memory-gib", "nan"], "--memory-gib"), (["--memory-gib", "-1"], "--memory-gib"),
    (["--threads", "-1"], "--threads"), (["--timeout", "0"], "--timeout"), (["--gpu-type", " "], "--gpu-type"),
])
def test_profile_cli_rejects_bad_settings_before_measuring(capsys, flags, field):
    from hexhelix.cli import main

    assert main(["profile", "--quick", *flags]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"error: {field}:" in err[0], err


def test_fidelity_statistics_spearman_with_ties_and_summary():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fidelity.py"
    spec = importlib.util.spec_from_file_location("fidelity_bench", path)
    fid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fid)
    assert fid.ranks_of([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert fid.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert fid.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert fid.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    rows = [{"name": n, "pred": {"time_s": p, "mem_bytes": [100], "busy_s": [p]},
             "meas": {"time_s": m, "mem_bytes": [110], "cpu_s": [m]}}
            for n, p, m in (("a", 1.0, 1.2), ("b", 2.0, 1.8), ("c", 3.0, 3.3))]
    s = fid.summarize(rows)
    assert s["time_mape"] == pytest.approx((0.2 / 1.2 + 0.2 / 1.8 + 0.3 / 3.3) / 3)
    assert s["best_pred"] == s["best_meas"] == "a" and s["time_spearman"] == pytest.approx(1.0)
    assert s["mem_mape"] == pytest.approx(10 / 110)


def test_patched_environ_sets_unsets_and_restores(monkeypatch) -> None:
    import os

    from hexhelix.runtime.profiler_comm import patched_environ

    monkeypatch.setenv("HEXHELIX_T_KEEP", "a")
    monkeypatch.setenv("HEXHELIX_T_DROP", "b")
    monkeypatch.delenv("HEXHELIX_T_NEW", raising=False)
    with patched_environ({"HEXHELIX_T_KEEP": "x", "HEXHELIX_T_NEW": "y"}, remove=("HEXHELIX_T_DROP",)):
        assert os.environ["HEXHELIX_T_KEEP"] == "x" and os.environ["HEXHELIX_T_NEW"] == "y"
        assert "HEXHELIX_T_DROP" not in os.environ
    assert os.environ["HEXHELIX_T_KEEP"] == "a" and os.environ["HEXHELIX_T_DROP"] == "b"
    assert "HEXHELIX_T_NEW" not in os.environ
