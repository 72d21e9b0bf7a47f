"""CLI of the planners: hexhelix plan / compare / evaluate / solve (JSON keys, exit codes, round trips)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from hexhelix.cli import main

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"solver", "status", "iteration_time_s", "throughput_tokens_per_s", "bound_s", "gap", "solve_time_s", "plan"}


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    p = tmp_path / "two.yaml"
    p.write_text("name: two\nnodes:\n  - {name: a, gpu: A100-SXM4-80GB, count: 2, intra_GBps: 300}\n"
                 "  - {name: t, gpu: T4, count: 1}\ninter_GBps: 5\n")
    return p


def run_json(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)


def tiny_args(cluster: Path) -> list[str]:
    return ["--model", "tiny", "--cluster", str(cluster), "--seq-len", "128", "--global-batch", "4"]


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_plan_json_keys_and_optimal(capsys, cluster_file: Path, solver: str) -> None:
    code, d = run_json(capsys, ["plan", *tiny_args(cluster_file), "--solver", solver, "--time-limit", "30",
                                "--json"])
    assert code == 0
    assert KEYS <= set(d)
    assert d["status"] == "optimal" and d["gap"] <= 1e-6
    assert d["solver"] == ("cpsat" if solver == "cpsat" else "milp-highs")
    assert d["plan"]["schema"] == "hexhelix.plan/1"


def test_plan_output_evaluate_and_export_solve_round_trip(capsys, cluster_file: Path, tmp_path: Path) -> None:
    plan_path, prob_path = tmp_path / "plan.json", tmp_path / "problem.json"
    code, d = run_json(capsys, ["plan", *tiny_args(cluster_file), "--solver", "cpsat", "--json", "-o",
                                str(plan_path), "--export-problem", str(prob_path)])
    assert code == 0 and plan_path.exists()
    code, ev = run_json(capsys, ["evaluate", str(plan_path), "--json"])
    assert code == 0 and ev["iteration_time_s"] == pytest.approx(d["iteration_time_s"], rel=1e-12)
    prob = json.loads(prob_path.read_text())
    assert prob["schema"] == "hexhelix.problem/1" and prob["kind"] == "plan" and prob["solve"]["solver"] == "cpsat"
    code, again = run_json(capsys, ["solve", str(prob_path), "--json"])
    assert code == 0 and again["iteration_time_s"] == pytest.approx(d["iteration_time_s"], rel=1e-9)
    code, other = run_json(capsys, ["solve", str(prob_path), "--solver", "milp-cbc", "--json"])
    assert code == 0 and other["solver"] == "milp-cbc"
    assert other["iteration_time_s"] == pytest.approx(d["iteration_time_s"], rel=1e-6)


def test_plan_text_output_and_model_export(capsys, cluster_file: Path, tmp_path: Path) -> None:
    lp = tmp_path / "model.lp"
    assert main(["plan", *tiny_args(cluster_file), "--solver", "cpsat", "--export-model", str(lp)]) == 0
    out = capsys.readouterr().out
    assert "solver cpsat: optimal" in out and "pipeline 0" in out
    text = lp.read_text()
    assert "Minimize" in text and "T_pipe" in text


def test_plan_infeasible_memory_one_line(capsys) -> None:
    code = main(["plan", "--model", "llama2-70b", "--cluster", "small-mixed", "--solver", "cpsat", "--time-limit", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "memory:" in err[0] and "llama2-70b" in err[0] and "GiB" in err[0]


def test_plan_unknown_solver_is_one_line(capsys, cluster_file: Path) -> None:
    code = main(["plan", *tiny_args(cluster_file), "--solver", "gurobi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown solver" in err[0]


@pytest.mark.parametrize("command", ["plan", "compare"])
@pytest.mark.parametrize("limit", ["-3", "0", "nan", "inf"])
def test_a_time_limit_that_is_not_a_positive_number_of_seconds_is_one_line(capsys, cluster_file: Path,
                                                                           command: str, limit: str) -> None:
    argv = [command, *tiny_args(cluster_file), "--time-limit", limit] + (["--solver", "cpsat"] if command == "plan" else [])
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--time-limit" in err[0] and "positive" in err[0]


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_fewer_than_one_worker_is_one_line(capsys, cluster_file: Path, command: str) -> None:
    argv = [command, *tiny_args(cluster_file), "--workers", "0"] + (["--solver", "cpsat"] if command == "plan" else [])
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--workers" in err[0]


def test_compare_json(capsys, cluster_file: Path) -> None:
    pytest.importorskip("hexhelix.solver.megatron")
    code, d = run_json(capsys, ["compare", *tiny_args(cluster_file), "--solvers", "cpsat,megatron", "--json"])
    assert code == 0
    assert [r["solver"] for r in d["results"]] == ["cpsat", "megatron"]
    for r in d["results"]:
        assert KEYS <= set(r) and "throughput_vs_best_bound" in r
    cp = d["results"][0]
    assert cp["throughput_vs_best_bound"] == pytest.approx(1.0, abs=1e-6)
    assert d["best_bound_s"] == pytest.approx(cp["bound_s"])
    if d["results"][1]["iteration_time_s"] is not None:
        assert d["results"][1]["throughput_vs_best_bound"] <= 1.0 + 1e-9


@pytest.mark.parametrize("solvers", [",", " , ", ""])
def test_compare_with_no_solver_named_is_one_line(capsys, cluster_file: Path, solvers: str) -> None:
    assert main(["compare", *tiny_args(cluster_file), "--solvers", solvers]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--solvers: names no solver" in err[0], err


def test_compare_runs_a_solver_named_twice_once(capsys, cluster_file: Path) -> None:
    code, d = run_json(capsys, ["compare", *tiny_args(cluster_file), "--solvers", "megatron,megatron", "--json"])
    assert code == 0 and [r["solver"] for r in d["results"]] == ["megatron"]


def test_compare_table(capsys, cluster_file: Path) -> None:
    assert main(["compare", *tiny_args(cluster_file), "--solvers", "cpsat,milp"]) == 0
    out = capsys.readouterr().out
    assert "vs bound" in out and "cpsat" in out and "milp-highs" in out


def test_compare_table_keeps_its_columns_where_a_heuristic_has_no_bound(capsys, cluster_file: Path) -> None:
    """A missing bound or gap is a "-" as wide as its column: every row as long as the header."""
    assert main(["compare", *tiny_args(cluster_file), "--solvers", "cpsat,hexiscale,megatron"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("solver"))
    rows = [ln for ln in lines[head + 2:] if ln.split() and ln.split()[0] in ("cpsat", "hexiscale", "megatron")]
    assert len(rows) == 3 and {len(r) for r in rows} == {len(lines[head])}


def test_evaluate_hand_written_example(capsys) -> None:
    path = ROOT / "examples" / "plans" / "small-mixed-llama2-7b.json"
    assert main(["evaluate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "iteration" in out and "pipeline 1" in out
    code, d = run_json(capsys, ["evaluate", str(path), "--json"])
    assert code == 0 and d["feasible"] and d["iteration_time_s"] > 0


def test_solve_rejects_wrong_schema(capsys, tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "something/9", "kind": "plan"}))
    code = main(["solve", str(p)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "hexhelix.problem/1" in err[0]


def test_solve_pairing_without_module_is_a_clear_error(capsys, tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "pair.json"
    p.write_text(json.dumps({"schema": "hexhelix.problem/1", "kind": "pairing"}))
    monkeypatch.setitem(sys.modules, "hexhelix.solver.pairing", None)  # import now raises ImportError
    code = main(["solve", str(p)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pairing" in err[0]


def test_solve_with_a_bad_hexiscale_budget_is_one_line(capsys, cluster_file: Path, tmp_path: Path) -> None:
    prob_path = tmp_path / "problem.json"
    assert main(["plan", *tiny_args(cluster_file), "--solver", "hexiscale", "--export-problem", str(prob_path)]) == 0
    capsys.readouterr()
    prob = json.loads(prob_path.read_text())
    prob["solve"]["regroup_evals"] = -1
    prob_path.write_text(json.dumps(prob))
    code = main(["solve", str(prob_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "regroup_evals" in err[0] and "-1" in err[0]


@pytest.mark.parametrize(("settings", "field"), [
    ({"solver": [1, 2]}, "solve.solver"), ({"time_limit": "soon"}, "solve.time_limit"),
    ({"time_limit": float("nan")}, "solve.time_limit"), ({"seed": 1.5}, "solve.seed"), ("fast", "solve"),
])
def test_solve_with_a_malformed_settings_section_names_the_setting(capsys, cluster_file: Path, tmp_path: Path,
                                                                   settings, field: str) -> None:
    prob_path = tmp_path / "problem.json"
    assert main(["plan", *tiny_args(cluster_file), "--solver", "megatron", "--export-problem", str(prob_path)]) == 0
    capsys.readouterr()
    prob = json.loads(prob_path.read_text())
    prob["solve"] = {**prob["solve"], **settings} if isinstance(settings, dict) else settings
    prob_path.write_text(json.dumps(prob))
    code = main(["solve", str(prob_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{prob_path}: {field}:" in err[0], err


def test_the_log_shows_no_fluid_bound_for_a_pipeline_count_settled_before_the_fluid_search(capfd) -> None:
    """small-mixed with Llama-2 7B: the one-pipeline bound settles P = 1 before the fluid search, which
    then leaves P = 1 at a floor (0.019 s) that the log must not present as its fluid bound."""
    cluster = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "small-mixed.yaml"
    code = main(["plan", "--model", "llama2-7b", "--cluster", str(cluster), "--recompute", "full",
                 "--solver", "cpsat", "--time-limit", "20", "--json", "--log"])
    d = json.loads(capfd.readouterr().out)
    assert code == 0
    header, one = d["log"].splitlines()[1].split(), d["log"].splitlines()[2].split()
    assert header[:5] == ["pipelines", "bound_s", "fluid_s", "depth_s", "one_pipe_s"]
    assert one[0] == "1" and one[5] == "yes" and one[2] == "-"
    assert float(one[4]) >= d["iteration_time_s"] * (1 - 1e-6)
    # params' least fluid bound counts a settled P at the bound that settled it, not at the search's floor
    rows = []
    for line in d["log"].splitlines()[2:]:
        if len(line.split()) != 6 or line.split()[5] not in ("yes", "no"):
            break  # the table ends where the backends' logs begin
        rows.append(line.split())
    least = min(float(r[1]) if r[2] == "-" else float(r[2]) for r in rows)
    assert d["params"]["fluid_bound_s"] == pytest.approx(least, rel=1e-5)


@pytest.mark.parametrize("solver", [["cpsat"], ["milp", "--backend", "highs"], ["milp", "--backend", "cbc"]])
def test_plan_json_with_the_solver_log_keeps_stdout_one_json_object(capfd, cluster_file: Path,
                                                                     solver: list[str]) -> None:
    """--log puts the solver's own log in the JSON (key log), never beside it on stdout (fd 1 itself:
    the solvers' C++ logs bypass sys.stdout)."""
    code = main(["plan", *tiny_args(cluster_file), "--solver", *solver, "--time-limit", "30", "--json", "--log"])
    out = capfd.readouterr().out
    assert code == 0
    d = json.loads(out)
    assert d["log"].startswith("planner: incumbent") and re.search(r"--- P=\d+ iteration 1\n", d["log"])
    by_p = d["params"]["bound_by_pipelines"]  # per pipeline count; the reported bound is their least
    assert set(by_p) == {str(P) for P in range(1, d["params"]["pipelines_max"] + 1)}
    assert d["bound_s"] == pytest.approx(min(min(by_p.values()), d["iteration_time_s"]), rel=1e-12)
