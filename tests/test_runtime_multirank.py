"""Torch runtime, multi-rank tier: programs compiled from small plans of the ``tiny`` model run on
gloo (one process per rank, torchrun's environment contract, a free port, a timeout per launch)
and must equal the single-process reference; failures must end every rank with a message.

Each launch costs a few seconds of process start-up on a shared 2-core machine, so the default
tier covers each requirement once and ``--runslow`` adds the remaining layouts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_cases import build_program, free_port, launch

pytestmark = pytest.mark.multirank


def _write(tmp: Path, name: str, **kw: object) -> Path:
    path = tmp / f"{name}.json"
    path.write_text(build_program(name, **kw).to_json())  # type: ignore[arg-type]
    return path


def _assert_pass(results: list, nranks: int) -> str:
    assert [r[0] for r in results] == [0] * nranks, "\n".join(r[2][-2000:] for r in results)
    out = results[0][1]
    assert "reference check: PASS" in out, out
    return out


def _params(directory: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(directory / f"rank{rank}.pt", weights_only=True)["params"]


@pytest.mark.parametrize("case, nranks, sp", [
    ("1f1b-4", 4, False),      # 1F1B over 4 stages
    ("two-pipes", 4, True),    # pipelines of different shapes and micro-batch counts, SP in the TP-2 stage
    ("mixed-tp", 4, False),    # TP 1 → 2 → 1 inside one pipeline
])
def test_matches_reference(tmp_path: Path, case: str, nranks: int, sp: bool) -> None:
    prog = _write(tmp_path, case, sequence_parallel=sp)
    out = _assert_pass(launch(nranks, [str(prog), "--steps", "2", "--check-reference", "--timeout", "60"]), nranks)
    assert "gradients of step 0" in out and "step 1: loss" in out


def test_wshape_two_strands_reference_coexecution_and_resume(tmp_path: Path) -> None:
    """W-shape with TP-2 stages: co-executed strands (threads, strand-private TP groups) match the
    reference; 1 sequential step + resume + 1 co-executed step is bit-identical to 2 co-executed
    steps — which checks both --save/--resume and that co-execution equals sequential order."""
    prog = str(_write(tmp_path, "wshape-tp2", sequence_parallel=True))
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _assert_pass(launch(4, [prog, "--steps", "2", "--check-reference", "--save", str(a), "--timeout", "60"]), 4)
    assert [r[0] for r in launch(4, [prog, "--steps", "1", "--sequential", "--save", str(b)])] == [0] * 4
    res = launch(4, [prog, "--steps", "1", "--resume", str(b), "--save", str(c)])
    assert [r[0] for r in res] == [0] * 4 and "step 1: loss" in res[0][1]
    for r in range(4):
        pa, pc = _params(a, r), _params(c, r)
        assert all(torch.equal(pa[n], pc[n]) for n in pa), f"rank {r}"
        sa = torch.load(a / f"rank{r}.pt", weights_only=True)["optimizer"]["state"]
        sc = torch.load(c / f"rank{r}.pt", weights_only=True)["optimizer"]["state"]
        assert all(torch.equal(sa[k]["exp_avg_sq"], sc[k]["exp_avg_sq"]) for k in sa)


def test_wrong_batch_share_weights_fail_the_check(tmp_path: Path) -> None:
    """The oracle can fail: pipelines of 3 and 1 micro-batches synced with weights 1/2, 1/2."""
    d = build_program("dp-2").to_dict()
    for entries in d["grad_sync"].values():
        for e in entries:
            e["weights"] = [0.5] * len(e["weights"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    res = launch(2, [str(path), "--steps", "1", "--check-reference", "--timeout", "60"])
    assert [r[0] for r in res] == [1, 1]
    assert "reference check: FAIL" in res[0][1] and "MISMATCH grad" in res[0][1]


def test_dead_rank_stops_the_others_within_the_timeout(tmp_path: Path) -> None:
    prog = _write(tmp_path, "1f1b-2")
    t = time.monotonic()
    res = launch(2, [str(prog), "--steps", "2", "--timeout", "10", "--fault", "1:0:3"], timeout=60)
    assert res[1][0] == 13
    assert res[0][0] not in (0, None), "rank 0 must fail, not hang or succeed"
    assert "rank 0: step 0 pc" in res[0][2] and "rank   1" in res[0][2]
    assert time.monotonic() - t < 45


def test_hang_becomes_an_error_with_every_rank_position(tmp_path: Path) -> None:
    d = build_program("1f1b-2").to_dict()
    first_recv = next(i for i in d["programs"][1] if i["op"] == "RECV")
    first_recv["ch"] = 99  # nobody sends on channel 99: rank 1 waits forever, then rank 0 does
    path = tmp_path / "hang.json"
    path.write_text(json.dumps(d))
    res = launch(2, [str(path), "--steps", "1", "--timeout", "3"], timeout=60)
    # both ranks stop making progress within a moment of each other: whichever watchdog fires first
    # exits 3 and reports every rank's position (rank 1 stuck before F1.0 on the never-sent channel);
    # the other rank then either reaches its own watchdog (3) or sees the connection close (1) —
    # an error either way, never a hang or a success.
    assert all(code in (1, 3) for code, _, _ in res), res
    reporters = [r for r, (code, _, err) in enumerate(res) if code == 3 and f"rank {r}: hang" in err]
    assert reporters, res
    err = res[reporters[0]][2]
    assert "rank   0 pc   7" in err and "rank   1 pc   2" in err and "[F1.0]" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("case, nranks", [("1f1b-2", 2), ("wshape-2", 2), ("dp-2", 2), ("wshape-tp2", 4)])
def test_matches_reference_more_layouts(tmp_path: Path, case: str, nranks: int) -> None:
    prog = _write(tmp_path, case)
    _assert_pass(launch(nranks, [str(prog), "--steps", "3", "--check-reference", "--timeout", "60"]), nranks)


@pytest.mark.slow
def test_split_backward_bi_bw_matches_reference(tmp_path: Path) -> None:
    """BI/BW (not emitted by the compiler yet): every B rewritten as BI then BW in place."""
    d = build_program("1f1b-2").to_dict()
    for prog in d["programs"]:
        i = 0
        while i < len(prog):
            if prog[i]["op"] == "B":
                prog[i:i + 1] = [dict(prog[i], op="BI"), dict(prog[i], op="BW")]
            i += 1
    path = tmp_path / "split.json"
    path.write_text(json.dumps(d))
    _assert_pass(launch(2, [str(path), "--steps", "2", "--check-reference"]), 2)


@pytest.mark.slow
def test_torchrun_command_line(tmp_path: Path) -> None:
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun not on PATH")
    prog = _write(tmp_path, "1f1b-2")
    res = subprocess.run(["torchrun", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                          "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "hexhelix.runtime", str(prog),
                          "--steps", "2", "--check-reference"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "reference check: PASS" in res.stdout
