"""W cells and pair choice of the fluid search (solver/fluid_branch.py, docs/formulation.md §15): a final leaf whose
master mixes pipelines of different sync + optimizer floors W is split at a cut of the plan's W.
Each cell's bound holds for exactly the plans in it, the search stays valid with them, and a resumed
run counts as stalled only when neither its certificate nor its master moved."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver import fluid_branch
from hexhelix.solver.bruteforce import enumerate_plans
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_bound import (
    FluidResult,
    fluid_lower_bound,
    optimizer_lower_bound,
    sync_lower_bound,
)
from hexhelix.solver.fluid_branch import (
    W_FIRST_SHARE,
    W_SPLIT_SHARE,
    _last_split,
    _Leaf,
    _open_holdings,
    _spread_penalty,
    _stalled,
    _violation,
    fluid_bounds_by_pipelines,
)
from hexhelix.solver.stage_floors import Locality
from test_planner_exact import make_problem


def two_node_instance(seed: int) -> PlanProblem:
    rng = random.Random(seed)
    return make_problem(gpus=(rng.randint(2, 3), rng.randint(2, 3)), mem=(4, 4), gb=rng.randint(3, 6), seq=1024,
                        layers=rng.randint(2, 3), inter=rng.choice([1.0, 2.0, 5.0]),
                        tflops=(100.0, rng.choice([40.0, 90.0])))


def plans_by_count(pb: PlanProblem) -> dict[int, list[tuple[float, float]]]:
    """Per pipeline count: (iteration time, sync + optimizer time) of every feasible enumerated plan."""
    out: dict[int, list[tuple[float, float]]] = {}
    for plan in enumerate_plans(pb):
        ev = evaluate(plan)
        if ev.feasible:
            out.setdefault(len(plan.pipelines), []).append((ev.iteration_time_s, ev.grad_sync_s + ev.optimizer_s))
    return out


def search_stays_below_best_plans(seeds: tuple[int, ...]) -> None:
    """The whole search (60 fluid runs at most) on two-node instances: every pipeline count's bound
    lies below its best enumerated plan."""
    for seed in seeds:
        pb = two_node_instance(seed)
        best = {P: min(t for t, _ in ps) for P, ps in plans_by_count(pb).items()}
        tables = build_tables(pb)
        bounds, _ = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(tables), upper_s=2 * max(best.values()),
                                              branch_nodes=60)
        for P, t in best.items():
            assert bounds[P] <= t * (1 + 1e-9), (seed, P, bounds[P], t)


@pytest.mark.parametrize("seed", range(4))
def test_a_w_cell_bounds_the_plans_whose_sync_plus_optimizer_lies_in_it(seed: int) -> None:
    """Cut at the median W of the P-pipeline plans: the capped cell's bound is below the best plan
    with W ≤ cut, the other cell's (every column charged at least the cut) below the best with
    W > cut and at least the cut itself; a cap below every shape's floor leaves no plan (bound = top)."""
    pb = two_node_instance(seed)
    plans = plans_by_count(pb)
    tables = build_tables(pb)
    top = 2 * max(t for ps in plans.values() for t, _ in ps)
    checked = 0
    for P, ps in plans.items():
        ws = sorted(w for _, w in ps)
        cut = ws[len(ws) // 2]
        low = [t for t, w in ps if w <= cut]
        high = [t for t, w in ps if w > cut]
        if P < 2 or not high:
            continue
        rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
        capped = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=top, w_cap=cut)
        raised = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=max(rest, cut), upper_s=top)
        assert capped.lb_s <= min(low) * (1 + 1e-9), (P, capped.lb_s, min(low))
        assert raised.lb_s <= min(high) * (1 + 1e-9), (P, raised.lb_s, min(high))
        assert raised.lb_s >= cut
        empty = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=top, w_cap=0.5 * rest)
        assert empty.lb_s == pytest.approx(top)
        checked += 1
    assert checked >= 1


def test_the_search_splits_final_leaves_by_w_and_every_bound_stays_below_its_best_plan(monkeypatch) -> None:
    """On instances whose final leaves mix W floors the search makes W cells (counted), and every
    pipeline count's bound still lies below its best enumerated plan."""
    real = fluid_branch._w_split
    cuts: list[float] = []

    def spy(leaf, upper_s, share=fluid_branch.W_SPLIT_SHARE):
        cut = real(leaf, upper_s, share)
        if cut is not None:
            cuts.append(cut)
        return cut

    monkeypatch.setattr(fluid_branch, "_w_split", spy)
    search_stays_below_best_plans(seeds=(9, 12))  # (seeds whose final leaves mix W floors)
    assert cuts, "no W cell was made: the instances no longer exercise the split"


def test_a_leaf_left_with_nothing_to_branch_gets_an_exact_whole_batch_phase_first(monkeypatch) -> None:
    """Before the search stops at a final single-P leaf, that leaf's whole-batch phase has priced
    exactly: its own run escalated (a Lagrangian certificate stopped unclosed) or it runs once more
    with the exact pricing — single pipeline counts only; every bound stays below its count's best plan."""
    real = fluid_branch.fluid_lower_bound
    calls: list[tuple[bool, bool, int, int, bool]] = []  # (asked exact, resumed whole, lo, hi, ran exact)

    def spy(tables, **kw):
        res = real(tables, **kw)
        calls.append((kw.get("exact_whole", False), kw.get("whole", False), kw["replicas"], kw["pmax"], res.exact))
        return res

    monkeypatch.setattr(fluid_branch, "fluid_lower_bound", spy)
    search_stays_below_best_plans(seeds=(2, 3))
    exact = [c for c in calls if c[0] or c[4]]
    assert exact, "no leaf reached the exact phase: the instances no longer exercise it"
    assert all(lo == hi for _, _, lo, hi, _ in exact)   # single pipeline counts only
    asked = [c for c in calls if c[0]]
    assert all(c[1] for c in asked)                     # asked for: a resumed whole phase
    assert len(exact) < len(calls)


def test_a_whole_batch_certificate_that_stops_below_the_bound_sends_the_run_to_exact_pricing(monkeypatch) -> None:
    """In the whole-batch phase, a Lagrangian certificate that stops unclosed below the bound already
    proven makes every later certificate of the run price exactly (Pareto labels); one that closes,
    or raises the bound, does not; the fractional phase never does."""
    from hexhelix.solver import fluid_bound, shape_dp_jit

    if not shape_dp_jit.AVAILABLE:
        pytest.skip("the exact whole-batch pricing needs numba")
    tables = build_tables(make_problem(mem=(4, 4), gb=8, seq=2048, inter=6.0, layers=3))
    P = max_pipelines(tables)
    real = fluid_bound.certificate

    def scripted(outcomes):
        asked: list[tuple[bool, bool]] = []  # (whole, exact) of each certificate

        def cert(*args, **kw):
            asked.append((kw["whole"], kw["exact_whole"]))
            value, cols, closed = real(*args, **kw)
            if kw["whole"] and outcomes:  # the whole phase's next certificate: as scripted
                lower, closed = outcomes.pop(0)
                value = 0.0 if lower else value  # 0: at or below any bound proven
            return value, cols, closed
        return asked, cert

    for outcomes, want_exact in (([(True, False)], True), ([(True, True)], False), ([(False, False)], False)):
        asked, cert = scripted(list(outcomes))
        monkeypatch.setattr(fluid_bound, "certificate", cert)
        fluid_lower_bound(tables, pmax=P, upper_s=100.0, whole=True, max_iterations=3)
        assert asked[0] == (True, False)  # the first whole certificate is the Lagrangian one
        assert (len(asked) > 1 and asked[1][1]) == want_exact, (outcomes, asked)
    asked, cert = scripted([])
    monkeypatch.setattr(fluid_bound, "certificate", cert)
    fluid_lower_bound(tables, pmax=P, upper_s=100.0, integral=False, max_iterations=5)
    assert not any(exact for _, exact in asked)


def test_a_wide_w_spread_is_cut_before_any_pair_and_a_narrow_one_only_when_no_pair_is_left(monkeypatch) -> None:
    """The order of the last splits: W first when the master's columns' W differ by ≥ W_FIRST_SHARE of
    the incumbent, else the open pair, else a W cut when they differ by ≥ W_SPLIT_SHARE, else final."""
    pb = two_node_instance(0)
    tables = build_tables(pb)
    P, upper = 2, 10.0
    rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
    fr = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=upper)
    col = fr.solution[0]

    def leaf(floors: tuple[float, float]) -> _Leaf:
        res = dataclasses.replace(fr, solution=(col, col), floors=floors)
        return _Leaf(0.0, 0, P, P, Locality(), res)

    wide = (1.0, 1.0 + 2 * W_FIRST_SHARE * upper)
    narrow = (1.0, 1.0 + 0.5 * (W_FIRST_SHARE + W_SPLIT_SHARE) * upper)
    flat = (1.0, 1.0)
    penalty = _spread_penalty(tables, P)
    for pair in ((0, 1), None):
        monkeypatch.setattr(fluid_branch, "_violation", lambda *_, pair=pair: pair)
        assert _last_split(tables, leaf(wide), upper, penalty) == ("W", pytest.approx(sum(wide) / 2))
        assert _last_split(tables, leaf(narrow), upper, penalty) == (
            ("pair", pair) if pair else ("W", pytest.approx(sum(narrow) / 2)))
        assert _last_split(tables, leaf(flat), upper, penalty) == (("pair", pair) if pair else None)
    # one pipeline: no pair to branch on (no sync between replicas), W cuts still apply
    one = dataclasses.replace(leaf(narrow), lo=1, hi=1)
    assert _last_split(tables, one, upper, None) == ("W", pytest.approx(sum(narrow) / 2))


def test_a_w_cut_lies_strictly_inside_the_cell_even_when_a_column_s_floor_is_above_it() -> None:
    """A column whose W exceeds the cell's w_hi (the DP caps each stage's w, not the joint floor, so
    it stays in the master) counts at w_hi: the cut is halfway to w_hi, never w_hi itself (whose
    low child would be the leaf again: hexiscale-het2 at P = 5 was cut so 30 times over), and a
    spread that is wide only above the cell gives no cut."""
    res = FluidResult(lb_s=7.48, upper_s=7.49, iterations=3, columns=5, converged=True,
                      solution=tuple((None, 1.0) for _ in range(5)),
                      floors=(0.48489, 0.48874, 0.48954, 0.51342, 0.56596))
    cell = _Leaf(7.48, 0, 5, 5, Locality(), res, w_lo=0.48489, w_hi=0.52542)
    cut = fluid_branch._w_split(cell, 7.677)
    assert cut == pytest.approx(0.5 * (0.48489 + 0.52542))
    assert cell.w_lo < cut < cell.w_hi
    above = dataclasses.replace(cell, result=dataclasses.replace(res, floors=(0.5250, 0.5251, 0.5252, 0.56, 0.6)))
    assert fluid_branch._w_split(above, 7.677) is None
    # without a cap above (the root cell), the columns' own W still set the cut
    root = dataclasses.replace(cell, w_lo=-math.inf, w_hi=math.inf)
    assert fluid_branch._w_split(root, 7.677) == pytest.approx(0.5 * (0.48489 + 0.56596))


def run(lb: float, est: float, iterations: int = 3, whole: bool = False) -> FluidResult:
    return FluidResult(lb_s=lb, upper_s=est, iterations=iterations, columns=10, converged=False, whole=whole)


def test_a_resumed_run_is_stalled_only_when_neither_its_bound_nor_its_master_moved() -> None:
    assert _stalled(run(4.0, 5.0), run(4.0, 5.0), 1e-4)
    assert not _stalled(run(4.0, 5.0), run(4.1, 5.0), 1e-4)      # its certificate rose
    assert not _stalled(run(4.0, 5.0), run(4.0, 4.8), 1e-4)      # its master still improves (Lagrangian flat)
    assert not _stalled(run(4.0, 5.0), run(4.0, 5.0, iterations=0), 1e-4)  # cut off before an iteration
    assert math.isinf(run(0.0, math.inf).upper_s) and _stalled(run(0.0, math.inf), run(0.0, math.inf), 1e-4)


def test_a_resumed_whole_batch_run_is_stalled_when_its_bound_did_not_rise_even_if_its_master_fell() -> None:
    whole = run(4.0, 5.0, whole=True)
    assert _stalled(whole, run(4.0, 4.8, whole=True), 1e-4)      # the master fell, the bound did not rise
    assert not _stalled(whole, run(4.1, 4.8, whole=True), 1e-4)  # the bound rose
    assert not _stalled(whole, run(4.0, 4.8, iterations=0, whole=True), 1e-4)


def test_pairs_are_branched_only_on_nodes_that_can_hold_a_layer_for_every_pipeline() -> None:
    """With P pipelines a layer can be local only on a node of at least P GPUs (room rule, which
    already charges every pair of a smaller node spread): the pair chosen for branching is never on
    a smaller node, although the masters do hold layers fractionally there."""
    P, small_mixed = 3, 0
    for seed in range(6):
        pb = make_problem(gpus=(2, 4), mem=(4, 4), gb=random.Random(seed).randint(4, 6), seq=1024, layers=3,
                          inter=random.Random(seed).choice([1.0, 2.0, 5.0]), tflops=(100.0, 40.0))
        tables = build_tables(pb)
        rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
        fr = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=10.0)
        leaf = _Leaf(fr.lb_s, 0, P, P, Locality(), fr)
        penalty = _spread_penalty(tables, P)
        pair = _violation(tables, leaf, penalty)
        assert pair is None or pb.cluster.nodes[pair[1]].count >= P, (seed, pair)
        h = _open_holdings(tables, leaf)[:, 0]  # node 0 has 2 < P GPUs
        small_mixed += bool(((h > 1e-6) & (h < P - 1e-6)).any() and penalty[0] > 0)
    assert small_mixed, "no master held a layer fractionally on the small node: the check says nothing"
