"""Segment pairing: DP == paper enumeration == lattice MILP (CBC, HiGHS); cpsat ≤ dp ≤ sequential;
everything ≥ the lower bound; legality; the overlap model against DHelix Eq. 1; IR round trips."""

from __future__ import annotations

import itertools
import json
import math
import random

import pulp
import pytest
from hexhelix.ir.catalog import CATALOG
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.pairing import PairBlock, PairingPlan, PairingProblem, PairOp, dhelix_default_plan
from hexhelix.solver.cost import Link
from hexhelix.solver.pairing import (
    lower_bound_s,
    pair_saving,
    score_pairing_plan,
    solve_pairing,
    solve_pairing_all,
    solve_pairing_problem,
)
from hexhelix.solver.pairing_costs import (
    CostTable,
    OverlapModel,
    build_cost_table,
    build_pairing_problem,
)
from hexhelix.solver.pairing_dp import pairing_dp, pairing_dp_enumerate
from hexhelix.solver.pairing_lattice import map_pulp_status, solve_lattice
from hexhelix.solver.result import SolveStatus

A40_LINK = Link(25e9, 5e-6)
REL = 1e-12  # "exactly": equal up to float summation of equal-cost paths


@pytest.fixture(scope="module")
def llama_a40() -> PairingProblem:
    return build_pairing_problem(PRESETS["llama2-13b"], TrainingConfig(seq_len=4096), 4, CATALOG["A40"], A40_LINK)


# ----------------------------------------------------------------------------- random instances
def random_table(rng: random.Random, nf: int, nb: int, illegal: float = 0.3) -> CostTable:
    """A random cost table over random base groups (segments inside groups), some pairs illegal."""

    def segs(n: int) -> list[tuple[int, int]]:
        cuts = sorted({0, n, *(k for k in range(1, n) if rng.random() < 0.4)})
        return [(a, b) for g0, g1 in itertools.pairwise(cuts) for a in range(g0, g1) for b in range(a + 1, g1 + 1)]

    fs, bs = segs(nf), segs(nb)
    alone_f = {s: rng.uniform(0.5, 2.0) * (s[1] - s[0]) for s in fs}
    alone_b = {s: rng.uniform(0.5, 2.0) * (s[1] - s[0]) for s in bs}
    pair = {(f, b): max(alone_f[f], alone_b[b]) * rng.uniform(0.9, 1.6)
            for f in fs for b in bs if rng.random() > illegal}
    return CostTable(nf=nf, nb=nb, fwd_segs=fs, bwd_segs=bs, alone_f=alone_f, alone_b=alone_b, pair=pair)


def random_problem(rng: random.Random, nf: int, nb: int) -> PairingProblem:
    """A random forward chain and backward DAG (a chain with wgrad-like sinks hanging off it),
    random resources (compute, intra, inter), durations, OEF table and base groups."""
    classes = {"compute": ["gemm", "attention", "norm"], "intra": ["all_gather", "reduce_scatter"],
               "inter": ["send_recv"]}

    def res() -> str:
        return rng.choices(["compute", "intra", "inter"], weights=[6, 3, 1])[0]

    fwd, bwd = [], []
    for i in range(nf):
        r = res()
        fwd.append(PairOp(name=f"f{i}", op_class=rng.choice(classes[r]), resource=r,
                          duration_s=rng.uniform(0.1, 3.0), deps=(f"f{i - 1}",) if i else ()))
    spine = None
    for i in range(nb):
        sink = spine is not None and rng.random() < 0.3
        r = "compute" if sink else res()
        bwd.append(PairOp(name=f"b{i}", op_class=rng.choice(classes[r]), resource=r,
                          duration_s=rng.uniform(0.1, 3.0), deps=(spine,) if spine else (), wgrad=sink))
        if not sink:
            spine = f"b{i}"
    names = [c for cs in classes.values() for c in cs]
    oef = {f"{a}|{b}": rng.uniform(-0.2, 1.0) for a in names for b in names}

    def groups(ops: list[PairOp]) -> tuple[tuple[str, ...], ...]:
        out: list[list[str]] = []
        for _i, o in enumerate(ops):
            if not out or rng.random() < 0.35:
                out.append([])
            out[-1].append(o.name)
        return tuple(tuple(g) for g in out)

    return PairingProblem(fwd=tuple(fwd), bwd=tuple(bwd), oef=oef, fwd_groups=groups(fwd), bwd_groups=groups(bwd),
                          block_overhead_s=rng.choice([0.0, 0.05]))


# ----------------------------------------------------------------------------- DP == lattice
@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_paper_enumeration_on_random_tables(seed: int) -> None:
    rng = random.Random(seed)
    t = random_table(rng, rng.randint(1, 6), rng.randint(1, 6))
    c1, p1 = pairing_dp(t)
    c2, _p2 = pairing_dp_enumerate(t)
    assert math.isclose(c1, c2, rel_tol=REL)
    assert sum(f[1] - f[0] for f, _ in p1 if f) == t.nf and sum(b[1] - b[0] for _, b in p1 if b) == t.nb


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("backend", ["cbc", "highs"])
def test_lattice_milp_equals_dp_on_random_tables(seed: int, backend: str) -> None:
    rng = random.Random(1000 + seed)
    t = random_table(rng, rng.randint(2, 7), rng.randint(2, 7))
    c_dp, _ = pairing_dp(t)
    r = solve_lattice(t, {"backend": backend})
    assert r["status"] is SolveStatus.OPTIMAL
    assert math.isclose(r["cost"], c_dp, rel_tol=REL)
    assert math.isclose(r["objective_us"] / 1e6, c_dp, rel_tol=1e-7)


def test_dp_equals_lattice_on_llama_layer_both_segment_sets(llama_a40: PairingProblem) -> None:
    for seg in ("groups", "all"):
        res = solve_pairing_all(llama_a40, {"segments": seg}, solvers=("dp", "lattice", "lattice-highs"))
        assert all(r.status is SolveStatus.OPTIMAL for r in res)
        assert math.isclose(res[0].makespan_s, res[1].makespan_s, rel_tol=REL)
        assert math.isclose(res[0].makespan_s, res[2].makespan_s, rel_tol=REL)
    enum = solve_pairing(llama_a40, "dp", {"enumerate": True})
    assert math.isclose(enum.makespan_s, solve_pairing(llama_a40, "dp").makespan_s, rel_tol=REL)


# ----------------------------------------------------------------------------- ordering of methods
@pytest.mark.parametrize("seed", range(10))
def test_random_dags_cpsat_le_dp_le_sequential_ge_bound(seed: int) -> None:
    rng = random.Random(seed)
    p = random_problem(rng, rng.randint(2, 6), rng.randint(2, 7))
    lb = lower_bound_s(p)
    opts = {"time_limit": 1.0, "workers": 1}
    for seg in ("groups", "all"):
        seq, dp, lat, cp = solve_pairing_all(p, {**opts, "segments": seg}, solvers=("sequential", "dp", "lattice", "cpsat"))
        assert math.isclose(dp.makespan_s, lat.makespan_s, rel_tol=REL)
        assert cp.makespan_s <= dp.makespan_s * (1 + 1e-12) <= seq.makespan_s * (1 + 1e-12)
        for r in (seq, dp, lat, cp):
            assert r.makespan_s >= lb * (1 - 1e-9), r.solver
        assert cp.bound_s is not None and lb * (1 - 1e-9) <= cp.bound_s <= cp.makespan_s * (1 + 1e-9)
        for r in (seq, dp, lat):
            r.plan.check(p)  # coverage, order, legality
            _assert_schedule_valid(p, r.schedule)
        _assert_schedule_valid(p, cp.schedule)


def _assert_schedule_valid(p: PairingProblem, schedule: dict[str, tuple[float, float]]) -> None:
    """Every op scheduled once, after its dependencies, and one op at a time per resource (so
    two collectives on the same link never run together: no illegal pair)."""
    assert set(schedule) == {o.name for o in p.ops}
    eps = 1e-12
    for o in p.ops:
        s, e = schedule[o.name]
        assert e >= s + o.duration_s - eps
        for d in o.deps:
            assert schedule[d][1] <= s + eps
    for r in ("compute", "intra", "inter"):
        iv = sorted(schedule[o.name] for o in p.ops if o.resource == r)
        for (_s0, e0), (s1, _) in itertools.pairwise(iv):
            assert e0 <= s1 + eps


def test_llama_all_methods_and_paper_default_plan(llama_a40: PairingProblem) -> None:
    res = {r.solver: r for r in solve_pairing_all(llama_a40, {"time_limit": 3.0})}
    lb = lower_bound_s(llama_a40)
    seq = res["sequential"].makespan_s
    assert math.isclose(seq, sum(o.duration_s for o in llama_a40.ops), rel_tol=1e-12)
    default = score_pairing_plan(llama_a40, dhelix_default_plan())
    assert len(default.plan.blocks) == 17
    # the paper's plan lies inside the paper's segment set, so the DP can only do better
    assert lb <= res["cpsat"].makespan_s <= res["dp"].makespan_s <= default.makespan_s < seq
    assert res["dp"].hidden_comm_fraction > default.hidden_comm_fraction > 0.5
    for r in res.values():
        if r.solver != "cpsat":
            r.plan.check(llama_a40)
    assert res["cpsat"].status in (SolveStatus.OPTIMAL, SolveStatus.TIMEOUT)


def test_illegal_pairs_never_in_cost_table(llama_a40: PairingProblem) -> None:
    m = OverlapModel(llama_a40)
    t = build_cost_table(llama_a40, "all", m)
    F = llama_a40.num_fwd
    for (sf, sb) in t.pair:
        fr = {llama_a40.ops[i].resource for i in range(sf[0], sf[1])} - {"compute"}
        br = {llama_a40.ops[F + i].resource for i in range(sb[0], sb[1])} - {"compute"}
        assert not fr & br
    n_legal = sum(1 for sf in t.fwd_segs for sb in t.bwd_segs
                  if m.legal(tuple(range(sf[0], sf[1])) + tuple(range(F + sb[0], F + sb[1]))))
    assert n_legal == len(t.pair) < len(t.fwd_segs) * len(t.bwd_segs)


def test_illegal_or_broken_plans_are_rejected(llama_a40: PairingProblem) -> None:
    blocks = list(dhelix_default_plan().blocks)
    # block 2 carries the forward all-gather; add the backward one too -> both strands on one link
    bad = list(blocks)
    bad[1] = PairBlock(fwd=(), bwd=("bda_mlp_bwd",), comm=("allgather_attn", "allgather_mlp_bwd"))
    bad[2] = PairBlock(fwd=("gemm_attn_c", "fl_attn"), bwd=(), comm=())
    with pytest.raises(InvalidInputError, match="illegal pair"):
        score_pairing_plan(llama_a40, PairingPlan(blocks=tuple(bad)))
    with pytest.raises(InvalidInputError, match="never run"):
        PairingPlan(blocks=tuple(blocks[:-1])).check(llama_a40)
    swapped = [blocks[1], blocks[0], *blocks[2:]]
    with pytest.raises(InvalidInputError, match="dependency"):
        PairingPlan(blocks=tuple(swapped)).check(llama_a40)


# ----------------------------------------------------------------------------- the overlap model
def _two_op_problem(dc: float, dm: float, oef: float) -> PairingProblem:
    return PairingProblem(fwd=(PairOp(name="g", op_class="gemm", resource="compute", duration_s=dc),),
                          bwd=(PairOp(name="ag", op_class="all_gather", resource="intra", duration_s=dm),),
                          oef={"gemm|all_gather": oef})


@pytest.mark.parametrize(("dc", "dm", "oef"), [(10.0, 5.0, 0.9), (2.0, 5.0, 0.5), (3.0, 3.0, 0.0), (4.0, 1.0, -0.1)])
def test_block_cost_reproduces_dhelix_eq1(dc: float, dm: float, oef: float) -> None:
    p = _two_op_problem(dc, dm, oef)
    t_ab = OverlapModel(p).block((0,), (1,)).cost
    assert math.isclose((dc + dm - t_ab) / min(dc, dm), oef, rel_tol=1e-12)
    dp = solve_pairing(p, "dp")
    assert math.isclose(dp.makespan_s, min(t_ab, dc + dm), rel_tol=1e-12)
    assert len(dp.plan.blocks) == (1 if t_ab < dc + dm else 2)  # ties go to not pairing


def test_oef_zero_gives_no_gain_and_ties_avoid_pairing() -> None:
    p = _two_op_problem(3.0, 3.0, 0.0)
    dp = solve_pairing(p, "dp")
    assert dp.makespan_s == 6.0 and len(dp.plan.blocks) == 2


def test_pair_saving_ranges() -> None:
    m, tr = PRESETS["llama2-13b"], TrainingConfig(seq_len=4096)
    g4 = pair_saving(m, tr, 4, CATALOG["A40"], A40_LINK)
    g1 = pair_saving(m, tr, 1, CATALOG["A40"], A40_LINK)
    assert 0.1 < g4 < 0.5
    assert g1 == 0.0


# ----------------------------------------------------------------------------- IR round trips
def test_problem_and_plan_json_round_trip(llama_a40: PairingProblem) -> None:
    d = json.loads(json.dumps(llama_a40.to_dict()))
    again = PairingProblem.from_dict(d)
    assert again == llama_a40
    out = solve_pairing_problem(d, "dp")
    assert out["kind"] == "pairing" and out["lower_bound_s"] == lower_bound_s(llama_a40)
    assert math.isclose(out["results"][0]["makespan_s"], solve_pairing(llama_a40, "dp").makespan_s, rel_tol=REL)
    plan = dhelix_default_plan()
    assert PairingPlan.from_dict(json.loads(plan.to_json())).blocks == plan.blocks
    authors = {"DCBlocks": [b.to_list() for b in plan.blocks]}  # the authors' file shape
    assert PairingPlan.from_dict(authors).blocks == plan.blocks


@pytest.mark.parametrize(("patch", "field"), [
    ({"schema": "hexhelix.problem/0"}, "schema"),
    ({"block_overhead_s": -1}, "block_overhead_s"),
])
def test_bad_problem_documents_name_the_field(llama_a40: PairingProblem, patch: dict, field: str) -> None:
    d = {**llama_a40.to_dict(), **patch}
    with pytest.raises(InvalidInputError, match=field):
        PairingProblem.from_dict(d, source="p.json")


def test_a_pairing_plan_whose_meta_is_not_an_object_is_named() -> None:
    with pytest.raises(InvalidInputError) as err:
        PairingPlan.from_dict({"DCBlocks": [[["x"], "None", "None"]], "meta": float("nan")}, source="plan.json")
    assert (err.value.source, err.value.field) == ("plan.json", "meta")


@pytest.mark.parametrize("entry", [[["ln_attn"], -0.5, "None"], [{"a": 1}, "None", "None"], [["ln_attn"], "None"]])
def test_a_malformed_pairing_plan_block_is_named(entry: list) -> None:
    with pytest.raises(InvalidInputError) as err:
        PairingPlan.from_dict({"DCBlocks": [[["x"], "None", "None"], entry]}, source="plan.json")
    assert (err.value.source, err.value.field) == ("plan.json", "DCBlocks[1]")


def test_bad_op_order_is_rejected() -> None:
    with pytest.raises(InvalidInputError, match="topological"):
        PairingProblem(fwd=(PairOp(name="a", op_class="gemm", resource="compute", duration_s=1.0, deps=("b",)),
                            PairOp(name="b", op_class="gemm", resource="compute", duration_s=1.0)), bwd=())


def test_pulp_status_mapping() -> None:
    ok = pulp.LpProblem("ok", pulp.LpMinimize)
    x = ok.add_variable("x", 0, 1, cat=pulp.LpBinary)
    ok += x
    ok += x >= 0
    ok.solve(pulp.HiGHS(msg=False))
    assert map_pulp_status(ok) is SolveStatus.OPTIMAL
    bad = pulp.LpProblem("bad", pulp.LpMinimize)
    y = bad.add_variable("y", 0, 1, cat=pulp.LpBinary)
    bad += y
    bad += y >= 2
    with pytest.warns(DeprecationWarning):
        bad.solve(pulp.PULP_CBC_CMD(msg=False))
    assert map_pulp_status(bad) is SolveStatus.INFEASIBLE


def test_stage_pairings_cover_each_gpu_and_tp_of_a_plan(examples_dir) -> None:
    from hexhelix.ir.plan import Plan
    from hexhelix.solver.pairing import stage_pairings

    plan = Plan.from_dict(json.loads((examples_dir / "plans" / "small-mixed-llama2-7b.json").read_text()))
    res = stage_pairings(plan)
    cl = plan.problem.cluster
    expect = {(cl.gpu_of_node(s.node).name, s.tp) for p in plan.pipelines for s in p.stages}
    assert set(res) == expect
    for (gpu, tp), r in res.items():
        assert r.status is SolveStatus.OPTIMAL and r.plan.meta["gpu"] == gpu and r.plan.meta["tp"] == tp


def test_unknown_solver_is_invalid_input(llama_a40: PairingProblem) -> None:
    with pytest.raises(InvalidInputError, match="unknown solver"):
        solve_pairing(llama_a40, "greedy")
    with pytest.raises(InvalidInputError, match="segments"):
        solve_pairing(llama_a40, "dp", {"segments": "some"})


@pytest.mark.parametrize("seed", [9, 17, 35])
def test_cpsat_strictly_beats_barriers_where_they_waste_time(seed: int) -> None:
    """Instances (found by scanning seeds 0-39) where every barrier plan, even over every
    contiguous segment, idles a resource at some barrier: the barrier-free optimum is lower."""
    rng = random.Random(seed)
    p = random_problem(rng, rng.randint(2, 6), rng.randint(2, 7))
    dp, cp = solve_pairing_all(p, {"time_limit": 5.0, "workers": 1, "segments": "all"}, solvers=("dp", "cpsat"))
    assert cp.status is SolveStatus.OPTIMAL
    assert cp.makespan_s < dp.makespan_s * (1 - 0.02)
    assert cp.bound_s <= cp.makespan_s


def test_highs_lattice_then_highs_planner_in_one_process() -> None:
    """HiGHS keeps one global thread scheduler per process: a pairing solve and a planner solve
    must ask for the same thread count, or the second run fails with kError (regression)."""
    import sys
    from pathlib import Path

    from hexhelix.solver.result import SolveStatus
    from hexhelix.solver.solve import solve

    sys.path.insert(0, str(Path(__file__).parent))
    from test_planner_exact import problem

    table = random_table(random.Random(5), 4, 4)
    assert solve_lattice(table, {"backend": "highs"})["status"] is SolveStatus.OPTIMAL
    res = solve(problem("memory-bound"), "milp", options={"backend": "highs", "time_limit": 60})
    assert res.status is SolveStatus.OPTIMAL
