"""``hexhelix pair``: JSON shape, problem export/re-solve, and one-line errors with exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hexhelix.solver.pairing import solve_pairing_problem

from hexhelix.cli import main

CLUSTER = "mixed-a100-a40-t4"
BASE = ["pair", "--model", "llama2-13b", "--cluster", CLUSTER, "--seq-len", "2048"]


def test_json_has_results_and_lower_bound(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prob = tmp_path / "pair.json"
    rc = main([*BASE, "--tp", "4", "--node", "a40-0", "--solver", "all", "--time-limit", "1", "--json",
               "--plan", "dhelix-default", "--export-problem", str(prob)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["solver"] for r in out["results"]]
    assert names == ["sequential", "dp", "lattice", "lattice-highs", "cpsat", "plan:dhelix-default"]
    for r in out["results"]:
        assert {"solver", "status", "makespan_s", "solve_time_s", "blocks"} <= set(r)
        assert r["makespan_s"] >= out["lower_bound_s"] * (1 - 1e-9)
    by = {r["solver"]: r for r in out["results"]}
    assert by["cpsat"]["makespan_s"] <= by["dp"]["makespan_s"] <= by["sequential"]["makespan_s"]
    assert by["sequential"]["saving_g"] == 0.0 < by["dp"]["saving_g"] <= by["cpsat"]["saving_g"] < 1
    assert out["meta"]["gpu"] == "A40" and out["meta"]["tp"] == 4
    # the exported problem re-solves to the same DP answer (what `hexhelix solve` calls)
    again = solve_pairing_problem(json.loads(prob.read_text()), "dp")
    assert math.isclose(again["results"][0]["makespan_s"], by["dp"]["makespan_s"], rel_tol=1e-12)


def test_text_output_picks_first_node_large_enough(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--tp", "8", "--solver", "dp"]) == 0
    text = capsys.readouterr().out
    assert "A100-SXM4-80GB x8" in text and "dp" in text


@pytest.mark.parametrize(("extra", "needle"), [
    (["--tp", "3"], "--tp"),
    (["--tp", "8", "--node", "a40-0"], "--node"),
    (["--tp", "4", "--node", "nope"], "no node named"),
    (["--tp", "4", "--plan", "missing.json"], "missing.json"),
    (["--tp", "4", "--sp", "--no-sp"], "--sp"),
    (["--tp", "4", "--time-limit", "nan"], "--time-limit"),
    (["--tp", "4", "--time-limit", "0"], "--time-limit"),
    (["--tp", "4", "--workers", "0"], "--workers"),
    (["--tp", "4", "--block-overhead-us", "-1"], "--block-overhead-us"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    assert main([*BASE, "--solver", "sequential", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err and err.startswith("hexhelix pair: error:")
