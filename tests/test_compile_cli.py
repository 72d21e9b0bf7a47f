"""CLI: ``hexhelix compile`` / ``validate`` / ``show`` and the PyTorch CSV export (pinned to the
installed torch's own loader and ``_simulate_comms_compute``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from compile_cases import make_plan
from hexhelix.ir.program import Op, Program

from hexhelix.cli import main

EXAMPLE_PLAN = Path(__file__).resolve().parents[1] / "examples" / "plans" / "small-mixed-llama2-7b.json"


def _write_plan(tmp_path: Path, pipes, schedule="1f1b", name="plan.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(make_plan(pipes, schedule).to_dict()))
    return path


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "wshape"])
def test_compile_validate_show_example(tmp_path, capsys, schedule):
    out = tmp_path / "prog.json"
    assert main(["compile", str(EXAMPLE_PLAN), "--schedule", schedule, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "valid; dry run finished" in err and schedule in err
    prog = Program.load(str(out))
    assert prog.schedule == schedule and prog.world_size == 8
    assert main(["validate", str(out)]) == 0
    assert "valid (" in capsys.readouterr().out
    assert main(["show", str(out), "--rank", "0"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("rank   0: L0.0 F0.0") and line.rstrip().endswith("OPT")


def test_validate_reports_first_problem_in_one_paragraph(tmp_path, capsys):
    out = tmp_path / "prog.json"
    assert main(["compile", str(_write_plan(tmp_path, [(3, 3, (1,))])), "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    prog1 = d["programs"][1]
    i = next(k for k, ins in enumerate(prog1) if ins["op"] == "RECV" and ins.get("mb") == 1)
    del prog1[i]
    f = next(k for k, ins in enumerate(prog1) if ins["op"] == "F" and ins.get("mb") == 1)  # the consumer
    out.write_text(json.dumps(d))
    capsys.readouterr()
    assert main(["validate", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"{out}: [order] rank 1, position {f} (F1.1): runs before its activation RECV")
    assert main(["validate", "--all", str(out)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) >= 2


def test_validate_reports_deadlock(tmp_path, capsys):
    from hexhelix.solver.compile import compile_plan

    prog = compile_plan(make_plan([(2, 2, (1,))], "gpipe"))
    rg = next(x for x in prog.programs[0] if str(x) == "RG0.0<1#1")
    p0 = [x for x in prog.programs[0] if x is not rg]
    tok = [str(x) for x in p0]
    b, f = tok.index("B0.0"), tok.index("L0.1")
    p0 = [*p0[:f], rg, p0[b], *p0[f:b], *p0[b + 1:]]  # backward of mb 0 (with its RECV) before F0.1
    bad = replace(prog, programs=(tuple(p0), *prog.programs[1:]))
    path = tmp_path / "bad.json"
    path.write_text(bad.to_json())
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "deadlock: ranks 0 -> 1 -> 0" in err or "deadlock: ranks 1 -> 0 -> 1" in err
    assert "RA1.1<0#0" in err and "RG0.0<1#1" in err


def test_recv_ahead_flag(tmp_path, capsys):
    """--recv-ahead 0 keeps each RECV right before its consumer; the default posts it one compute
    op earlier; a negative value is one clear line and exit 2."""
    plan = _write_plan(tmp_path, [(3, 4, (1,))])
    progs = {}
    for n in (0, 1):
        out = tmp_path / f"p{n}.json"
        args = ["compile", str(plan), "-o", str(out)] + ([] if n == 1 else ["--recv-ahead", "0"])
        assert main(args) == 0
        progs[n] = Program.load(str(out))
    for late, early in zip(progs[0].programs, progs[1].programs):
        nxt = [late[k + 1].op for k, x in enumerate(late) if x.op is Op.RECV]
        assert set(nxt) <= {Op.F, Op.B, Op.LOAD}
        assert [str(x) for x in late if x.op is not Op.RECV] == [str(x) for x in early if x.op is not Op.RECV]
    assert progs[0].programs != progs[1].programs
    capsys.readouterr()
    assert main(["compile", str(plan), "--recv-ahead", "-1", "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recv_ahead" in err[0] and "non-negative" in err[0]


def test_torch_csv_accepted_by_torch(tmp_path, capsys):
    """torch 2.13: ``_PipelineScheduleRuntime._load_csv(format="compute_comms")`` parses our rows and
    ``_simulate_comms_compute`` replays them without deadlock."""
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining import schedules as S

    assert torch.__version__.startswith("2.13")
    P, m = 4, 6
    csv_path, out = tmp_path / "sched.csv", tmp_path / "prog.json"
    assert main(["compile", str(_write_plan(tmp_path, [(P, m, (1,))])), "-o", str(out),
                 "--torch-csv", str(csv_path)]) == 0
    rt = object.__new__(S._PipelineScheduleRuntime)  # the loader needs only these attributes
    rt.pp_group_size, rt._num_stages, rt._n_microbatches, rt._stages = P, P, m, []
    rt._load_csv(str(csv_path), format="compute_comms")
    order = rt.pipeline_order_with_comms
    prog = Program.load(str(out))
    assert [str(a) for a in order[1]][:3] == ["1RECV_F0", "1F0", "1SEND_F0"]
    assert sum(1 for a in order[0] if a.computation_type == S.F) == m
    assert rt.stage_index_to_group_rank == {s: s for s in range(P)}
    assert len(order[2]) == sum(1 for i in prog.programs[2] if i.op in (Op.F, Op.B, Op.SEND, Op.RECV))
    sim = S._simulate_comms_compute(order, lambda s: rt.stage_index_to_group_rank[s], P)
    assert {r: [a for a in acts if a is not None] for r, acts in sim.items()} == order


def test_torch_csv_refuses_what_torch_cannot_express(tmp_path, capsys):
    plan = _write_plan(tmp_path, [(2, 2, (1,)), (1, 1, (1,))])
    assert main(["compile", str(plan), "-o", str(tmp_path / "p.json"), "--torch-csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hexhelix compile: error: the torch CSV export needs one pipeline, the plan has 2"
    assert not (tmp_path / "x.csv").exists()


def test_compile_errors_are_one_line(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "missing.json")]) == 2
    assert "file not found" in capsys.readouterr().err
    plan = tmp_path / "thin.json"
    plan.write_text(json.dumps(make_plan([(16, 2, (1,))]).to_dict()))
    assert main(["compile", str(plan), "--schedule", "wshape", "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least 2 layers per stage" in err[0]
    assert main(["validate", str(plan)]) == 2  # a plan is not a program
    assert "expected schema 'hexhelix.program/1'" in capsys.readouterr().err


def test_compile_reads_a_yaml_plan_like_its_json(tmp_path, capsys):
    import yaml

    as_yaml = tmp_path / "plan.yaml"
    as_yaml.write_text(yaml.safe_dump(json.loads(EXAMPLE_PLAN.read_text())))
    outs = []
    for plan in (EXAMPLE_PLAN, as_yaml):
        out = tmp_path / f"{plan.suffix[1:]}.json"
        assert main(["compile", str(plan), "-o", str(out)]) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    capsys.readouterr()
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema: [hexhelix.plan/1\n")
    assert main(["compile", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.yaml" in err[0]


def test_compile_is_byte_identical_across_hash_seeds(tmp_path):
    import os
    import subprocess
    import sys

    plan = _write_plan(tmp_path, [(2, 3, (2, 1)), (1, 2, (1,))], "wshape")
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"p{seed}.json"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        cmd = "import sys; from hexhelix.cli import main; sys.exit(main(sys.argv[1:]))"
        subprocess.run([sys.executable, "-c", cmd, "compile", str(plan), "-o", str(out)],
                       check=True, env=env, capture_output=True, timeout=120)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_compile_pair_expands_layer_pairs(tmp_path, capsys):
    out = tmp_path / "p.json"
    plan = _write_plan(tmp_path, [(2, 4, (2,))], "wshape")
    assert main(["compile", str(plan), "--pair", "-o", str(out)]) == 0
    prog = Program.load(str(out))
    pairs = [i for p in prog.programs for i in p if i.op is Op.PAIR]
    assert pairs and all(i.pair[0].layer >= 0 for i in pairs)
    assert set(prog.meta["pairing"]) == {"A100-SXM4-80GB/tp2", "A40/tp2"}
    assert main(["compile", str(plan), "--pair", "--schedule", "1f1b", "-o", str(out)]) == 2
    assert "--pair applies to the wshape schedule only" in capsys.readouterr().err
