"""MILP backend (PuLP with CBC or HiGHS) of the exact heterogeneous planner.

The same backend-neutral :class:`~.plan_formulation.LinearModel` the CP-SAT backend solves is
written as a PuLP problem (time variables continuous: with integer coefficients their optimum is
integral anyway) and solved by CBC (``PULP_CBC_CMD``, a subprocess) or HiGHS (``pulp.HiGHS``
through highspy, in a forked child); neither checks its clock in every phase, so both are killed
just after the call's time limit. Each backend's status is mapped in one tested function, because
PuLP's own ``status`` says "Optimal" for a CBC incumbent stopped by the time limit (only
``sol_status`` tells) and its HiGHS class hides the time limit behind the same code; we read
HiGHS's own model status instead.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hexhelix.ir.errors import SolverError
from hexhelix.ir.plan import PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .forked import fork_available, fork_call
from .plan_formulation import BackendOutcome, LinearModel, search_seconds
from .result import SolveResult

__all__ = ["cbc_infeasible_is_proof", "map_cbc_status", "map_highs_status", "plan_milp", "quiet_stdout", "solve_milp_model", "to_pulp"]

BACKENDS = ("cbc", "highs")


def map_cbc_status(status: int, sol_status: int) -> str:
    """PuLP/CBC (``prob.status``, ``prob.sol_status``) → ours.

    (1, 1) proven optimal; (1, 2) an integer solution but not proven (CBC stopped on its time
    limit; PuLP still says status Optimal) → "timeout"; (0, 0) stopped without a solution →
    "timeout"; (-1, -1) infeasible; anything else → "error".

    >>> map_cbc_status(1, 2)
    'timeout'
    """
    if status == 1 and sol_status == 1:
        return "optimal"
    if status == 1 and sol_status == 2:
        return "timeout"
    if status == 0 and sol_status == 0:
        return "timeout"
    if status == -1:
        return "infeasible"
    return "error"


def map_highs_status(model_status: str, has_solution: bool) -> str:
    """HiGHS ``HighsModelStatus`` name (e.g. ``kOptimal``) → ours: kOptimal optimal; kInfeasible
    infeasible; kTimeLimit/kIterationLimit/kInterrupt/kSolutionLimit/kObjectiveBound → "timeout"
    (with or without an incumbent); everything else → "error".

    >>> map_highs_status("kTimeLimit", True)
    'timeout'
    """
    name = model_status.split(".")[-1]
    if name == "kOptimal":
        return "optimal"
    if name in ("kInfeasible", "kUnboundedOrInfeasible"):
        return "infeasible"
    if name in ("kTimeLimit", "kIterationLimit", "kInterrupt", "kSolutionLimit", "kObjectiveBound",
                "kObjectiveTarget"):
        return "timeout"
    return "error"


TIME_UNIT = 1e6  # MILP time variables are in units of 1e6 ticks (~1e3 at the total-work bound)


def to_pulp(lin: LinearModel, name: str = "hexhelix_plan") -> tuple[Any, list[Any]]:
    """The PuLP problem and its variables for ``lin`` (``export_model``: ``prob.writeLP(path)``).

    Time variables are rescaled, t = TIME_UNIT·t', and every row holding one is divided by
    TIME_UNIT: the same feasible set, but magnitudes near 1e3 instead of 1e9, which keeps CBC's and
    HiGHS's absolute tolerances meaningful (with raw ticks HiGHS mis-bounded a test instance).
    Values and objective are mapped back to ticks by :func:`solve_milp_model`."""
    import warnings

    import pulp

    prob = pulp.LpProblem(name, pulp.LpMinimize)
    with warnings.catch_warnings():  # PuLP 3.3 deprecates direct LpVariable construction (4.0 API)
        warnings.simplefilter("ignore", DeprecationWarning)
        v = [pulp.LpVariable(n.replace("[", "_").replace("]", "").replace(",", "_"),
                             lowBound=lb / TIME_UNIT if t else lb, upBound=ub / TIME_UNIT if t else ub,
                             cat="Integer" if integer else "Continuous")
             for n, lb, ub, integer, t in zip(lin.names, lin.lb, lin.ub, lin.integer, lin.time)]
    # expressions from (variable, coefficient) lists, not sums of products: the same LP file, 4.7x faster
    # (hexiscale-het2's two-pipeline model, 226,152 nonzeros: 0.16 s instead of 0.73 s)
    prob += pulp.LpAffineExpression([(v[i], c) for i, c in lin.objective.items()])  # time variables only
    time_var = lin.time
    senses = {"<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE, "==": pulp.LpConstraintEQ}
    for k, (coefs, sense, rhs, rname) in enumerate(lin.rows):
        if any(time_var[i] for i in coefs):
            expr = pulp.LpAffineExpression([(v[i], c if time_var[i] else c / TIME_UNIT) for i, c in coefs.items()])
            rhs = rhs / TIME_UNIT
        else:
            expr = pulp.LpAffineExpression([(v[i], c) for i, c in coefs.items()])
        cname = f"c{k}_" + re.sub(r"[^A-Za-z0-9_]", "_", rname)
        prob.addConstraint(pulp.LpConstraint(expr, senses[sense], rhs=rhs, name=cname))
    return prob, v


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1 (HiGHS prints its banner from C++ even with output off), so that
    ``--json`` output on stdout stays one clean JSON document."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


_CBC_BOUND = re.compile(r"(?:Lower bound|Best possible|best possible)[:\s]+(-?[0-9.eE+]+)")
_CBC_WALL = re.compile(r"Total time \(CPU seconds\):.*\(Wallclock seconds\):\s+([0-9.eE+]+)")


# CBC checks its -sec only between phases (root LP, MIP start: 32 s at -sec 1 on hexiscale-het1's 31k-row model),
# so it is killed KILL_GRACE_S after the call's budget (plan_formulation.SEARCH_RESERVE); below MIN_SEARCH_S
# of search a call does not start one. Before (floors of 1 s on the search and 2 s of grace past it), a 10 s
# `milp-cbc` solve of hexiscale-het2 ran 12.0 s: its P = 2 call had 2.6 s left, spent 2 s converting and
# writing, gave CBC -sec 0.6 and killed it 2.6 s later (2026-12-07). HiGHS's own clock starts after PuLP hands
# the model over (0.18 s after a 1.42 s conversion there): that is charged at HIGHS_HANDOVER of the conversion.
# HiGHS does not check its clock in root cut separation either (1.1-1.7 s past limits of 4-6 s on hexiscale-het2's
# P = 2 model; its interrupt callbacks are not reached there, 2026-12-07), so it runs in a forked child that is
# killed KILL_GRACE_S after the call's budget, as CBC is (in this process where fork is unavailable).
MIN_SEARCH_S, KILL_GRACE_S, HIGHS_HANDOVER = 0.05, 0.1, 0.2


CBC_PROOF_SHARE = 0.9


def cbc_infeasible_is_proof(wall_s: float | None, sec: float) -> bool:
    """Whether CBC's "infeasible" is a proof: only when its run (``wall_s``, from its log) ended well
    within its -sec ``sec``. CBC stopped by -sec inside its preprocessing reports "Pre-processing says
    infeasible": hexiscale-het2's two-pipeline model with a 7.7 s cutoff, once in six runs at -sec 2.23
    (wall 2.44 s), where neither CBC nor CP-SAT finds it infeasible in 60 s (2026-12-07). Taken as a
    proof, the planner would have settled that pipeline count at its incumbent.

    >>> cbc_infeasible_is_proof(2.44, 2.23), cbc_infeasible_is_proof(0.4, 2.23), cbc_infeasible_is_proof(None, 5)
    (False, True, False)
    """
    return wall_s is not None and wall_s < CBC_PROOF_SHARE * sec


def _run_cbc(prob: Any, *, hint: bool, end: float, seed: int, gap_rel: float) -> tuple[str, str, float]:
    """Solve ``prob`` with PuLP's bundled CBC binary, done by ``end`` (monotonic): CBC's own -sec is
    what writing its files leaves (:func:`.plan_formulation.search_seconds`), and a run still going
    :data:`KILL_GRACE_S` after ``end`` is killed. The problem's variables get CBC's values. Returns
    (failure, log, -sec given): failure is "" on a solution file, "time" when stopped without one (or
    no time was left to start CBC), "error" when CBC failed."""
    import subprocess
    import warnings

    import pulp

    with warnings.catch_warnings():  # PULP_CBC_CMD (the bundled binary) is deprecated in PuLP 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        cbc = pulp.PULP_CBC_CMD(msg=False)  # the binary's path and PuLP's MPS / solution-file helpers
    if not cbc.available():
        raise SolverError("CBC is not available (install coinor-cbc or the PuLP wheel's bundled cbc)")
    with tempfile.TemporaryDirectory(prefix="hexhelix_cbc_") as tmp:
        mps, mst, sol, log_path = (os.path.join(tmp, f) for f in ("model.mps", "start.mst", "model.sol", "cbc.log"))
        vs, var_names, row_names, _ = prob.writeMPS(mps, rename=1)
        args = [cbc.path, mps]
        if hint:
            cbc.writesol(mst, prob, vs, var_names, row_names)
            args += ["-mips", mst]
        left = search_seconds(end)
        if left < MIN_SEARCH_S:
            return "time", "(hexhelix: no time left for CBC after writing its files)\n", 0.0
        t_start = time.monotonic()
        args += ["-sec", f"{left:.3f}", "-randomSeed", str(seed + 1), "-integerT", "1e-9", "-ratio", repr(gap_rel),
                 "-threads", "1", "-timeMode", "elapsed", "-solve", "-printingOptions", "all", "-solution", sol]
        with open(log_path, "w") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()) + KILL_GRACE_S)
                killed = False
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed = True
        with open(log_path) as fh:
            text = fh.read()
        if killed:
            return "time", (text + f"\n(hexhelix: CBC killed {time.monotonic() - t_start:.1f} s after its start, "
                                   f"its -sec {left:.2f} s and the call's time limit passed)\n"), left
        if proc.returncode != 0 or not os.path.exists(sol):
            return ("time" if time.monotonic() - t_start >= 0.9 * left else "error"), text, left
        status, values, _dj, _pi, _slack, sol_status = cbc.readsol_MPS(sol, prob, vs, var_names, row_names)
    prob.assignVarsVals(values)
    prob.assignStatus(status, sol_status)
    return "", text, left


@dataclass(frozen=True, slots=True)
class _HighsRun:
    """What one HiGHS run reports back (from a forked child or this process)."""

    model_status: str = ""
    runtime: float = 0.0
    has_solution: bool = False
    objective: float | None = None
    dual_bound: float | None = None
    values: tuple[float | None, ...] = ()
    error: str = ""


def _highs_in_process(prob: Any, v: list[Any], solver: Any) -> _HighsRun:
    """Solve ``prob`` with ``solver`` (PuLP's HiGHS) here and read what the call needs off highspy."""
    with quiet_stdout():
        prob.solve(solver)
    h = prob.solverModel
    info = h.getInfo()
    has = info.primal_solution_status == 2
    return _HighsRun(model_status=str(h.getModelStatus()), runtime=h.getRunTime(), has_solution=has,
                     objective=info.objective_function_value if has else None, dual_bound=info.mip_dual_bound,
                     values=tuple(x.varValue for x in v) if has else ())


def _highs_in_child(prob: Any, v: list[Any], solver: Any) -> _HighsRun:
    """The forked child's work: one HiGHS run on a scheduler of its own."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)  # the parent's scheduler (its thread count, its workers) is not ours
    return _highs_in_process(prob, v, solver)


def _run_highs(prob: Any, v: list[Any], solver: Any, *, kill_at: float) -> _HighsRun | None:
    """Run HiGHS on ``prob`` in a forked child (:mod:`.forked`), killed at ``kill_at`` (monotonic) if it
    has not answered: None then. In this process (no kill) where fork is unavailable or this is a
    daemonic process."""
    if not fork_available():
        return _highs_in_process(prob, v, solver)
    call = fork_call(_highs_in_child, prob, v, solver, name="hexhelix-highs")
    got = call.wait(kill_at - time.monotonic())
    call.stop(grace=1.0 if got is not None else 0.0, kill=True)  # one that answered closes its log file first
    if got is None:
        return None
    return got.value if not got.error else _HighsRun(error=got.error)


def solve_milp_model(lin: LinearModel, *, backend: str = "highs", time_limit: float, seed: int = 0,
                     hint: dict[int, int] | None = None, log: bool = False, gap_rel: float = 1e-9) -> BackendOutcome:
    """Solve ``lin`` with CBC or HiGHS through PuLP, done by ``time_limit`` seconds after the call (the
    budget covers building the PuLP model and handing it over: see :func:`.plan_formulation.search_seconds`); the bound
    comes from the backend itself (HiGHS ``mip_dual_bound``; CBC's final "Lower bound"/"best possible" log
    line). ``overhead_s``: the call's seconds beyond the solver's own run within its limit (building the
    PuLP model and handing it over: 1.5 s on hexiscale-het3's six-pipeline model, 13 s before
    :func:`to_pulp` built rows from lists)."""
    import pulp

    if backend not in BACKENDS:
        raise SolverError(f"unknown MILP backend {backend!r}; use one of {', '.join(BACKENDS)}")
    t0 = time.monotonic()
    end = t0 + float(time_limit)
    prob, v = to_pulp(lin)
    converted = time.monotonic() - t0
    if search_seconds(end) < MIN_SEARCH_S:  # building the PuLP model took the whole budget
        return BackendOutcome(status="timeout", values=None, objective=None, bound=None,
                              log="(hexhelix: no time left to search after building the model)\n" if log else "",
                              overhead_s=converted)
    if hint:
        for i, val in hint.items():
            v[i].setInitialValue(val)
    text, overrun = "", 0.0
    if backend == "cbc":
        failed, text, tl = _run_cbc(prob, hint=bool(hint), end=end, seed=seed, gap_rel=gap_rel)
        wall = _CBC_WALL.findall(text)
        ran = float(wall[-1]) if wall else tl  # CBC's own run (killed: none reported)
        searched, overrun = min(tl, ran), max(0.0, ran - tl)
        if failed:  # no solution file: stopped (by its limit or by us at the deadline) before one, or broke
            status = "timeout" if failed == "time" else "error"
            return BackendOutcome(status=status, values=None, objective=None, bound=None, log=text if log else "",
                                  overhead_s=max(0.0, time.monotonic() - t0 - searched))
        status = map_cbc_status(prob.status, prob.sol_status)
        if status == "infeasible" and not cbc_infeasible_is_proof(float(wall[-1]) if wall else None, tl):
            status = "timeout"  # its preprocessing stopped by -sec says "infeasible": no proof
        has = prob.sol_status in (1, 2)
        obj = pulp.value(prob.objective) if has else None
        bound = obj if status == "optimal" else None
        if status == "timeout":
            found = _CBC_BOUND.findall(text)
            if found:
                bound = float(found[-1])
    else:
        tl = search_seconds(end) - HIGHS_HANDOVER * converted
        if tl < MIN_SEARCH_S:
            return BackendOutcome(status="timeout", values=None, objective=None, bound=None,
                                  log="(hexhelix: no time left for HiGHS after building the model)\n" if log else "",
                                  overhead_s=time.monotonic() - t0)
        # the log goes to a file (read into the result), never to the console beside --json's object
        fd, path = tempfile.mkstemp(suffix=".log", prefix="hexhelix_highs_")
        os.close(fd)
        try:
            solver = pulp.HiGHS(msg=log, timeLimit=tl, gapRel=gap_rel, threads=1, random_seed=seed,
                                mip_feasibility_tolerance=1e-9, log_to_console=False,
                                **({"log_file": path} if log else {}))
            if not solver.available():
                raise SolverError("HiGHS is not available (pip install highspy)")
            t_start = time.monotonic()
            run = _run_highs(prob, v, solver, kill_at=end + KILL_GRACE_S)
            with open(path) as fh:
                text = fh.read()
        finally:
            os.unlink(path)
        if run is None:  # killed at the deadline: no solution, no bound from this call
            ran = time.monotonic() - t_start
            return BackendOutcome(status="timeout", values=None, objective=None, bound=None,
                                  log=(text + f"\n(hexhelix: HiGHS killed {ran:.1f} s after its start, its limit "
                                              f"{tl:.2f} s and the call's time limit passed)\n") if log else "",
                                  overhead_s=max(0.0, time.monotonic() - t0 - tl), overrun_s=max(0.0, ran - tl))
        if run.error:  # HiGHS or PuLP raised, or the child died: this call gives nothing
            return BackendOutcome(status="error", values=None, objective=None, bound=None,
                                  log=text + f"\n(hexhelix: HiGHS failed: {run.error})\n" if log else "",
                                  overhead_s=max(0.0, time.monotonic() - t0 - tl))
        overrun = max(0.0, run.runtime - tl)
        searched = min(tl, run.runtime)
        has = run.has_solution
        status = map_highs_status(run.model_status, has)
        obj = run.objective if has else None
        bound = run.dual_bound if status in ("optimal", "timeout") else None
        if bound is not None and not math.isfinite(bound):
            bound = None
        if status == "optimal" and bound is None:
            bound = obj
        for x, val in zip(v, run.values):
            x.varValue = val
    values = ([float(x.varValue or 0.0) * (TIME_UNIT if t else 1.0) for x, t in zip(v, lin.time)]
              if has else None)
    obj = obj * TIME_UNIT if obj is not None else None
    bound = bound * TIME_UNIT if bound is not None else None
    return BackendOutcome(status=status, values=values, objective=obj, bound=bound, log=text if log else "",
                          overhead_s=max(0.0, time.monotonic() - t0 - searched), overrun_s=overrun)


# building a P-model and its first call through PuLP, beyond the solver's search, per node-pair term
# P*K*nodes^2 (exact_plan.BUILD_AND_CALL_S_PER_TERM for CP-SAT: 3.3e-4): HiGHS / CBC at a 0.5 s limit
# 1.04 / 1.15 ms on gen-64's P = 4, 1.12 / 1.09 ms on hexiscale-het3's P = 6, 1.14 / 1.54 ms on its P = 2,
# 1.92 ms (HiGHS) on hexiscale-het1's P = 4 (2026-12-06, this 2-core machine; CP-SAT 0.30-0.42 ms there).
# Since to_pulp builds rows from (variable, coefficient) lists and the models hold m_p − 1 once
# (2026-12-07): 0.13-0.56 ms on those four (measured with rows from lists alone), 0.06 ms where micro-batches
# dominate (hexiscale-het3's P = 2 at 4,096: 1.2 s through HiGHS, 17.8 s before). The rate is kept: it also
# decides whether a short solve gives the fluid search all its time, and at 4e-4 the P-models' share made
# hexiscale-het3's 10 s milp-highs solve end at 51 % instead of 37 % (scratch runs, 2026-12-07)
PULP_BUILD_AND_CALL_S_PER_TERM = 2.0e-3


def plan_milp(problem: PlanProblem, *, seed: int = 0, profile: Profile = DEFAULT_PROFILE,
              time_limit: float | None = None, backend: str = "highs", **options: Any) -> SolveResult:
    """The exact planner as a MILP with ``backend`` cbc or highs (options: see ``solve_exact``)."""
    from .exact_plan import solve_exact

    if backend not in BACKENDS:
        raise SolverError(f"unknown MILP backend {backend!r}; use one of {', '.join(BACKENDS)}")

    def run(lin: LinearModel, tl: float, hint: dict[int, int] | None,
            interrupt: Callable[[], bool] | None = None) -> BackendOutcome:
        # (CBC and HiGHS run to their time limit: PuLP offers no way to stop them from outside)
        return solve_milp_model(lin, backend=backend, time_limit=tl, seed=seed, hint=hint,
                                log=options.get("log", False))

    return solve_exact(problem, run, solver=f"milp-{backend}", seed=seed, profile=profile,
                       time_limit=time_limit, options={**options, "backend": backend},
                       build_s_per_term=PULP_BUILD_AND_CALL_S_PER_TERM)
