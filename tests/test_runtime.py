"""Torch runtime, single-process tier: model layout, data, reference, watchdog, checkpoint and the
start-up failures (bad file, wrong world size) — no process group needed."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.params import param_layout
from hexhelix.runtime.__main__ import main
from hexhelix.runtime.checkpoint import load_checkpoint, save_checkpoint
from hexhelix.runtime.data import DataSource
from hexhelix.runtime.reference import run_reference
from hexhelix.runtime.torch_model import OptimConfig, StageModule, full_weight, shard_weight
from hexhelix.runtime.torch_tp import TPComm
from hexhelix.runtime.watchdog import EXIT_HANG, Watchdog, format_window

sys.path.insert(0, str(Path(__file__).parent))
from runtime_cases import build_program

TINY = PRESETS["tiny"]
ONE = TPComm(group=None)


def test_parameter_names_and_shapes_are_the_canonical_layout() -> None:
    net = StageModule(TINY, range(TINY.layers), embed=True, head=True)
    got = [(n, tuple(p.shape)) for n, p in net.named_parameters()]
    assert got == [(p.name, p.shape) for p in param_layout(TINY)]


def test_tp_shards_tile_the_full_weight() -> None:
    for spec in param_layout(TINY)[:10]:
        full = full_weight(spec, seed=3)
        parts = [shard_weight(full, spec, j, 2) for j in range(2)]
        joined = parts[0] if spec.shard_dim is None else torch.cat(parts, dim=spec.shard_dim)
        assert torch.equal(joined, full), spec.name
    assert not torch.equal(full_weight(param_layout(TINY)[1 + 1], 3), full_weight(param_layout(TINY)[1 + 1], 4))


def test_stages_chained_equal_the_whole_model() -> None:
    tok, tgt = DataSource(seed=1, micro_batch=2, seq_len=16, vocab=256).micro_batch_at(0, 0)
    whole = StageModule(TINY, range(8), embed=True, head=True, seed=5)
    a = StageModule(TINY, range(0, 3), embed=True, head=False, seed=5)
    b = StageModule(TINY, range(3, 8), embed=False, head=True, seed=5)
    assert torch.equal(whole(tok, ONE, tgt), b(a(tok, ONE), ONE, tgt))


def test_data_is_a_function_of_seed_step_and_micro_batch() -> None:
    d = DataSource(seed=7, micro_batch=2, seq_len=32, vocab=256)
    t1, y1 = d.micro_batch_at(3, 5)
    t2, _ = d.micro_batch_at(3, 5)
    assert torch.equal(t1, t2) and torch.equal(t1[:, 1:], y1[:, :-1])
    assert not torch.equal(t1, d.micro_batch_at(3, 6)[0])
    tokens, _ = d.global_batch(3, 6)
    assert torch.equal(tokens[10:12], t1)
    with pytest.raises(InvalidInputError, match="seq_len"):
        DataSource(seed=0, micro_batch=1, seq_len=10**6, vocab=256)


def test_reference_learns_the_bundled_text() -> None:
    tr = TrainingConfig(global_batch=4, micro_batch=1, seq_len=32, dtype="fp32")
    data = DataSource(seed=0, micro_batch=1, seq_len=32, vocab=256)
    ref = run_reference(TINY, tr, steps=8, seed=0, data=data, optim=OptimConfig(lr=3e-3))
    assert abs(ref.losses[0] - torch.log(torch.tensor(256.0)).item()) < 0.1  # uniform at init
    assert ref.losses[-1] < ref.losses[0] - 0.5
    assert set(ref.grads) == set(ref.params)


def test_watchdog_reports_position_and_grid() -> None:
    prog = build_program("1f1b-2")
    fired: list[int] = []
    done = threading.Event()
    wd = Watchdog(1, prog, 0.3, on_fire=lambda code: (fired.append(code), done.set()))
    wd.start()
    wd.enter(0, 2, str(prog.programs[1][2]))
    assert done.wait(5.0)
    wd.stop()
    assert fired == [EXIT_HANG]
    text = wd.report((0, 2, "F1.0", time.monotonic()))
    assert "rank 1" in text and "[F1.0]" in text and "rank   0 pc   ?" in text


def test_watchdog_is_quiet_while_progressing_or_idle() -> None:
    prog = build_program("1f1b-2")
    fired: list[int] = []
    wd = Watchdog(0, prog, 0.4, on_fire=fired.append).start()
    for pc in range(8):
        wd.enter(0, pc, "x")
        time.sleep(0.1)
    wd.idle()
    time.sleep(0.6)
    wd.stop()
    assert fired == []
    assert "[SA0.0>1#0]" in format_window(prog, {0: 2})


def test_checkpoint_round_trip_and_mismatch(tmp_path: Path) -> None:
    prog = build_program("single")
    net = StageModule(TINY, range(8), embed=True, head=True)
    params = dict(net.named_parameters())
    opt = OptimConfig().build(params.values())
    save_checkpoint(tmp_path, rank=0, program=prog, steps_done=4, seed=1, params=params, optimizer=opt)
    assert load_checkpoint(tmp_path, rank=0, program=prog, seed=1, params=params, optimizer=opt) == 4
    with pytest.raises(InvalidInputError, match="seed"):
        load_checkpoint(tmp_path, rank=0, program=prog, seed=2, params=params, optimizer=opt)
    with pytest.raises(InvalidInputError, match="fingerprint"):
        load_checkpoint(tmp_path, rank=0, program=build_program("dp-2"), seed=1, params=params, optimizer=opt)
    (tmp_path / "rank0.pt").write_bytes(b"garbage")
    with pytest.raises(InvalidInputError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path, rank=0, program=prog, seed=1, params=params, optimizer=opt)


@pytest.mark.parametrize("content, message", [
    (None, "file not found"),
    ("{not json", "invalid JSON"),
    ('{"schema": "hexhelix.program/0"}', "schema"),
])
def test_bad_program_file_fails_with_one_line(tmp_path: Path, capsys, content, message) -> None:
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    assert main([str(path)], env={"RANK": "0", "WORLD_SIZE": "1"}) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_world_size_mismatch_fails_before_any_process_group(tmp_path: Path, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(build_program("1f1b-4").to_json())
    t = time.monotonic()
    assert main([str(path)], env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": "1"}) == 2
    err = capsys.readouterr().err.strip()
    assert "compiled for 4 ranks but 2 were launched" in err and "--nproc-per-node 4" in err
    assert len(err.splitlines()) == 1 and time.monotonic() - t < 5


def test_single_rank_program_runs_in_process(tmp_path: Path, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(build_program("single").to_json())
    assert main([str(path), "--steps", "2", "--check-reference"], env={"RANK": "0", "WORLD_SIZE": "1"}) == 0
    out = capsys.readouterr().out
    assert "step 1: loss" in out and "reference check: PASS" in out


def test_incomplete_slice_plan_is_rejected(tmp_path: Path, capsys) -> None:
    d = build_program("single").to_dict()
    d["grad_sync"]["b0"] = d["grad_sync"]["b0"][1:]  # drop embed.weight's entry
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    assert main([str(path)], env={"RANK": "0", "WORLD_SIZE": "1"}) == 2
    assert "slice plan covers 0 of the 16384 local elements of embed.weight" in capsys.readouterr().err


def test_per_layer_pair_programs_are_rejected_at_start(tmp_path: Path, capsys) -> None:
    from hexhelix.solver.compile import compile_plan

    plain = build_program("wshape-2")
    # Recompile the same plan with a pairing: co-executed ticks become per-layer parts.
    d = plain.to_dict()
    assert all(i.layer < 0 for prog in plain.programs for i in prog)
    from runtime_cases import CASES, PRESETS, PipelinePlan, Plan, PlanProblem, StagePlan, cluster

    stages, mbs, schedule = CASES["wshape-2"]
    problem = PlanProblem(cluster=cluster(), model=PRESETS["tiny"], training=plain.training, schedule=schedule)
    pipes = tuple(PipelinePlan(stages=tuple(StagePlan(node=0, gpus=g, layers=lay) for g, lay in pipe),
                               micro_batches=m) for pipe, m in zip(stages, mbs))
    paired = compile_plan(Plan(problem=problem, pipelines=pipes), pairing={1: 0.2})
    assert any(i.layer >= 0 or any(h.layer >= 0 for h in i.pair or ()) for i in paired.programs[0])
    path = tmp_path / "p.json"
    path.write_text(paired.to_json())
    assert main([str(path)], env={"RANK": "0", "WORLD_SIZE": str(d["world_size"]), "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": "1"}) == 2
    err = capsys.readouterr().err.strip()
    assert "per-layer part" in err and len(err.splitlines()) == 1


def test_resume_from_missing_checkpoint_fails_at_start(tmp_path: Path, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(build_program("single").to_json())
    assert main([str(path), "--resume", str(tmp_path / "nothing")], env={"RANK": "0", "WORLD_SIZE": "1"}) == 2
    err = capsys.readouterr().err.strip()
    assert "rank0.pt: checkpoint file not found" in err and len(err.splitlines()) == 1
