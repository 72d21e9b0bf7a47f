"""Simulator outputs: JSON summary, Chrome trace (tracks, flow arrows), Gantt PNG, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.program import Op
from hexhelix.runtime.gantt import write_gantt
from hexhelix.runtime.sim import SimOptions, simulate
from hexhelix.runtime.sim_synth import synthetic_program
from hexhelix.runtime.trace import chrome_trace, write_chrome_trace

from hexhelix.cli import main


@pytest.fixture
def wprog():
    return synthetic_program("wshape", 3, 5, f=1.0, b=2.0, g=0.2, comm=0.05, act_bytes=600, ranks_per_node=2)


def test_json_summary_has_the_promised_keys(wprog) -> None:
    res = simulate(wprog)
    d = json.loads(res.to_json())
    for key in ("makespan_s", "bubble_fraction", "peak_memory_bytes", "exposed_comm_s", "hidden_comm_s",
                "capacity_bytes", "over_capacity_ranks", "ranks"):
        assert key in d
    assert d["schema"] == "hexhelix.sim/1"
    assert len(d["peak_memory_bytes"]) == wprog.world_size
    assert d["ranks"][0]["busy_s"] + d["ranks"][0]["idle_s"] == pytest.approx(d["makespan_s"])


def test_chrome_trace_tracks_and_flows(wprog, tmp_path: Path) -> None:
    res = simulate(wprog)
    path = write_chrome_trace(res, tmp_path / "t.json")
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    starts = [e for e in events if e["ph"] == "s"]
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    # one flow per point-to-point transfer, from the SEND's rank to the RECV's rank
    n_send = sum(1 for prog in wprog.programs for i in prog if i.op is Op.SEND)
    assert len(starts) == len(ends) == n_send
    for s in starts:
        send_tok, recv_tok = s["name"].split(" -> ")
        assert send_tok.startswith("S") and recv_tok.startswith("R")
        assert ends[s["id"]]["pid"] == int(send_tok.split(">")[1].split("#")[0])
    # compute on track 0, intra-node transfers on track 1 and inter-node on track 2
    assert {e["tid"] for e in slices} == {0, 1, 2}
    assert all(e["tid"] == 0 for e in slices if e["cat"] in ("F", "B", "PAIR", "OPT"))
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute", "intra", "inter"}
    # the memory counter of each rank peaks at its simulated peak activation bytes
    for r, stats in enumerate(res.ranks):
        peak = max(e["args"]["GiB"] for e in events if e["ph"] == "C" and e["pid"] == r)
        assert peak * 2**30 == pytest.approx(stats.peak_activation_bytes)


def test_trace_needs_a_recorded_timeline(wprog) -> None:
    with pytest.raises(InvalidInputError, match="record"):
        chrome_trace(simulate(wprog, SimOptions(record=False)))


def test_gantt_png(wprog, tmp_path: Path) -> None:
    path = write_gantt(simulate(wprog), tmp_path / "g.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gantt_refuses_huge_programs(tmp_path: Path) -> None:
    res = simulate(synthetic_program("1f1b", 2, 2, pipes=40))
    with pytest.raises(InvalidInputError, match="too large"):
        write_gantt(res, tmp_path / "g.png")


def test_cli_simulate(wprog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prog_path = tmp_path / "p.json"
    prog_path.write_text(wprog.to_json())
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    assert main(["simulate", str(prog_path), "--json", "--trace", str(trace), "--gantt", str(gantt)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["makespan_s"] == pytest.approx(simulate(wprog).makespan_s)
    assert trace.exists() and gantt.exists()
    assert main(["simulate", str(prog_path)]) == 0
    assert "makespan" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tmp_path / "missing.json")]) == 2
    assert "file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "hexhelix.plan/1"}')
    assert main(["simulate", str(bad)]) == 2
    assert "schema" in capsys.readouterr().err
    assert main(["simulate", str(bad), "--comm-scale", "-1"]) == 2
    assert "--comm-scale" in capsys.readouterr().err


def test_cli_deadlock_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prog = synthetic_program("1f1b", 2, 1)
    # rank 0 runs its backward (and the gradient RECV feeding it) before its forward: the gradient
    # needs rank 1's backward, which needs rank 1's forward, which needs rank 0's forward
    r0, r1 = list(prog.programs[0]), list(prog.programs[1])
    bwd = [i for i in r0 if i.op is Op.B or (i.op is Op.RECV and i.kind.value == "grad")]
    r0 = bwd + [i for i in r0 if i not in bwd]
    from dataclasses import replace

    bad = replace(prog, programs=(tuple(r0), tuple(r1)))
    path = tmp_path / "dead.json"
    path.write_text(bad.to_json())
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "deadlock" in err and "rank 0" in err and "rank 1" in err


def test_plan_simulate_adds_the_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--model", "llama2-7b", "--cluster", "small-mixed", "--solver", "hexiscale",
               "--global-batch", "8", "--time-limit", "20", "--simulate", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    sim = out["simulation"]
    assert sim["makespan_s"] > 0 and len(sim["peak_memory_bytes"]) == len(sim["capacity_bytes"])
    assert sim["simulated_vs_predicted"] == pytest.approx(sim["makespan_s"] / sim["predicted_iteration_s"] - 1)


def test_table_lists_the_fullest_ranks_of_a_large_world() -> None:
    res = simulate(synthetic_program("1f1b", 4, 4, pipes=20, act_bytes=1 << 30), SimOptions(record=False))
    text = res.format_table(max_rows=8)
    assert "72 more ranks not shown" in text
    # stage 0 of every pipeline holds the most activations (4 micro-batches in flight)
    listed = [int(line.split()[0]) for line in text.splitlines()[2:-1]]
    assert len(listed) == 8 and all(r % 4 == 0 for r in listed)
