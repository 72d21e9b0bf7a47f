"""Segment pairing (DHelix): one entry point, one result type, for every pairing method.

Methods (``solver``):

* ``sequential`` — no co-execution: every op alone, forward strand then backward strand (the
  baseline; Σ of solo durations plus one block overhead per op).
* ``dp`` — the paper's dynamic program (Eq. 2) over the segment set ``options["segments"]``
  (``groups``: refinements of DHelix's base groups, the paper's set — default; ``all``: every
  contiguous segment), barrier after each block. Optimal *for that barrier model and segment set*;
  ``options["enumerate"]`` runs the paper's literal enumeration of segmentation pairs instead.
* ``lattice`` / ``lattice-highs`` — the same barrier model solved as a shortest-path MILP on the
  cut-point lattice with CBC / HiGHS; equals ``dp`` on the same segment set.
* ``cpsat`` — the barrier-free schedule (no blocks), a lower bound for every barrier plan under the
  same overlap model; warm-started with the DP plan, so never worse than it.
* ``all`` — all of the above on one problem.

Every result carries status, blocks (a :class:`~hexhelix.ir.pairing.PairingPlan`), the predicted
layer-pair time ``makespan_s``, ``bound_s`` (a proven lower bound *of that method's model*; for
``cpsat`` a bound on every plan), solve time and the hidden-communication fraction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hexhelix.ir.catalog import GpuType
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import ModelConfig, TrainingConfig
from hexhelix.ir.pairing import PairingPlan, PairingProblem
from hexhelix.ir.plan import Plan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from . import cost
from .pairing_costs import (
    OverlapModel,
    build_cost_table,
    build_pairing_problem,
    lower_bound_s,
    plan_from_blocks,
)
from .pairing_cpsat import barrier_free_windows, solve_cpsat
from .pairing_dp import Edge, pairing_dp, pairing_dp_enumerate
from .pairing_lattice import solve_lattice
from .result import SolveStatus

__all__ = [
    "SOLVERS",
    "PairingResult",
    "lower_bound_s",
    "pair_saving",
    "results_to_dict",
    "score_pairing_plan",
    "solve_pairing",
    "solve_pairing_all",
    "solve_pairing_problem",
    "stage_pairings",
]

SOLVERS = ("sequential", "dp", "lattice", "lattice-highs", "cpsat")
RESULT_SCHEMA = "hexhelix.pairing-result/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class PairingResult:
    """What a pairing method returns. ``makespan_s`` is the predicted time of one layer pair under
    the overlap model; ``bound_s`` a proven lower bound of the method's own model (None for
    heuristics and baselines); ``schedule`` maps op name → (start, end) seconds. For ``cpsat``
    the blocks are the windows between instants where nothing runs (where a barrier costs nothing);
    two collectives of one link may share such a window, one after the other, never at once."""

    solver: str
    status: SolveStatus
    plan: PairingPlan | None
    makespan_s: float = math.inf
    bound_s: float | None = None
    solve_time_s: float = 0.0
    hidden_comm_fraction: float = 0.0
    scope: str = ""
    schedule: dict[str, tuple[float, float]] = field(default_factory=dict)
    reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        if self.bound_s is None or not math.isfinite(self.makespan_s) or self.makespan_s <= 0:
            return None
        return max(0.0, (self.makespan_s - self.bound_s) / self.makespan_s)

    def to_dict(self) -> dict[str, Any]:
        return {"solver": self.solver, "status": self.status.value,
                "makespan_s": self.makespan_s if math.isfinite(self.makespan_s) else None,
                "bound_s": self.bound_s, "gap": self.gap, "solve_time_s": self.solve_time_s,
                "hidden_comm_fraction": self.hidden_comm_fraction, "scope": self.scope,
                "blocks": [b.to_list() for b in self.plan.blocks] if self.plan else None,
                "schedule": {k: list(v) for k, v in self.schedule.items()},
                "reason": self.reason, "params": self.params}


def hidden_comm_fraction(problem: PairingProblem, makespan: float) -> float:
    """Share of communication time that does not lengthen the pair: 1 − exposed/total comm,
    exposed = makespan − total compute (the compute stream is the one every op shares)."""
    comp = sum(o.duration_s for o in problem.ops if not o.is_comm)
    comm = sum(o.duration_s for o in problem.ops if o.is_comm)
    if comm <= 0 or not math.isfinite(makespan):
        return 0.0
    return min(1.0, max(0.0, 1.0 - (makespan - comp) / comm))


def _edges_to_blocks(problem: PairingProblem, path: list[Edge]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    F = problem.num_fwd
    return [(tuple(range(f[0], f[1])) if f else (), tuple(range(F + b[0], F + b[1])) if b else ()) for f, b in path]


def _layout(m: OverlapModel, blocks: list[tuple[tuple[int, ...], tuple[int, ...]]]):
    """Blocks end to end: global starts/ends, penalised pairs and Σ block costs."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    charged: set[tuple[int, int]] = set()
    t = 0.0
    for f, b in blocks:
        bs = m.block(f, b)
        for i in bs.starts:
            starts[i], ends[i] = t + bs.starts[i], t + bs.ends[i]
        charged |= bs.overlaps
        t += bs.cost
    return starts, ends, charged, t


def _barrier_result(solver: str, problem: PairingProblem, m: OverlapModel, blocks, status: SolveStatus,
                    t0: float, scope: str, bound: float | None = None, params: dict | None = None,
                    reason: str = "") -> PairingResult:
    starts, ends, _, total = _layout(m, blocks)
    names = [o.name for o in problem.ops]
    return PairingResult(solver=solver, status=status, plan=plan_from_blocks(problem, blocks, {"solver": solver}),
                         makespan_s=total, bound_s=bound, solve_time_s=time.perf_counter() - t0,
                         hidden_comm_fraction=hidden_comm_fraction(problem, total), scope=scope,
                         schedule={names[i]: (starts[i], ends[i]) for i in sorted(starts)},
                         reason=reason, params=dict(params or {}))


@contextlib.contextmanager
def _quiet_stdout(enabled: bool) -> Iterator[None]:
    """Silence C-level stdout (HiGHS prints a banner even with msg=False) so --json stays clean."""
    if not enabled:
        yield
        return
    fd = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            try:
                yield
            finally:
                os.dup2(fd, 1)
    finally:
        os.close(fd)


class _Session:
    """Shared state of one problem across methods (overlap model, cost tables, the DP plan)."""

    def __init__(self, problem: PairingProblem, options: dict[str, Any] | None):
        self.problem = problem
        self.options = dict(options or {})
        self.segments = self.options.get("segments", "groups")
        if self.segments not in ("groups", "all"):
            raise InvalidInputError(f"must be 'groups' or 'all', got {self.segments!r}", field="options.segments")
        if self.segments == "groups" and not (problem.fwd_groups or problem.bwd_groups):
            self.segments = "all"  # a problem without base groups: every contiguous segment
        self.model = OverlapModel(problem)
        self._table = None
        self._dp: PairingResult | None = None
        self._dp_blocks: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    @property
    def table(self):
        if self._table is None:
            self._table = build_cost_table(self.problem, self.segments, self.model)
        return self._table

    def scope(self) -> str:
        return f"barrier model, segment set '{self.segments}'"

    def run(self, solver: str) -> PairingResult:
        """Run one method; the dispatch table is the list of methods."""
        method = {"sequential": self._sequential, "dp": self._dp_method, "lattice": self._lattice,
                  "lattice-cbc": self._lattice, "lattice-highs": self._lattice, "cpsat": self._cpsat}.get(solver)
        if method is None:
            raise InvalidInputError(f"unknown solver {solver!r}; choose one of {', '.join((*SOLVERS, 'all'))}",
                                    field="solver")
        return method(solver, time.perf_counter())

    def _sequential(self, solver: str, t0: float) -> PairingResult:
        p = self.problem
        blocks = [((i,), ()) for i in range(p.num_fwd)] + [((), (i,)) for i in range(p.num_fwd, len(p.ops))]
        return _barrier_result(solver, p, self.model, blocks, SolveStatus.FEASIBLE, t0, "no co-execution")

    def _dp_method(self, solver: str, t0: float) -> PairingResult:
        if self._dp is not None:
            return self._dp
        p = self.problem
        c, path = (pairing_dp_enumerate if self.options.get("enumerate") else pairing_dp)(self.table)
        if not path:
            return PairingResult(solver=solver, status=SolveStatus.INFEASIBLE, plan=None,
                                 reason="the candidate segments cannot cover both strands")
        self._dp_blocks = _edges_to_blocks(p, path)
        self._dp = _barrier_result(solver, p, self.model, self._dp_blocks, SolveStatus.OPTIMAL, t0,
                                   self.scope(), bound=c, params={"segments": self.segments})
        return self._dp

    def _lattice(self, solver: str, t0: float) -> PairingResult:
        p = self.problem
        backend = "highs" if solver == "lattice-highs" else \
            ("cbc" if solver == "lattice-cbc" else self.options.get("backend", "cbc"))
        opts = {k: self.options[k] for k in ("time_limit", "export_model") if k in self.options}
        with _quiet_stdout(not self.options.get("log", False)):
            r = solve_lattice(self.table, {**opts, "backend": backend, "msg": bool(self.options.get("log"))})
        params = {"segments": self.segments, "backend": backend, "variables": r["variables"],
                  **({"time_limit": opts["time_limit"]} if "time_limit" in opts else {})}
        if not r["path"]:
            why = ("time limit reached before any path was found" if r["status"] is SolveStatus.TIMEOUT
                   else f"solver status {r['status'].value}, no path decoded")
            return PairingResult(solver=solver, status=r["status"], plan=None, solve_time_s=r["solve_time_s"],
                                 reason=why, params=params)
        return _barrier_result(solver, p, self.model, _edges_to_blocks(p, r["path"]), r["status"], t0,
                               self.scope(), bound=r["bound"], params=params)

    def _cpsat(self, solver: str, t0: float) -> PairingResult:
        p, m = self.problem, self.model
        if self.run("dp").plan is None:
            return PairingResult(solver=solver, status=SolveStatus.ERROR, plan=None, reason="no DP plan to start from")
        starts, ends, charged, _ = _layout(m, self._dp_blocks)
        opts = {k: self.options[k] for k in ("time_limit", "workers", "seed", "export_model", "log",
                                             "linearization_level") if k in self.options}
        r = solve_cpsat(m, (starts, ends, charged), opts)
        F = p.num_fwd
        windows = barrier_free_windows(r["starts"], r["ends"])
        plan = plan_from_blocks(p, [(tuple(i for i in w if i < F), tuple(i for i in w if i >= F)) for w in windows],
                                {"solver": solver, "barrier_free": True})
        lb = lower_bound_s(p)
        bound = min(max(r["bound"], lb) if r["bound"] is not None else lb, r["makespan"])
        names = [o.name for o in p.ops]
        return PairingResult(
            solver=solver, status=r["status"], plan=plan, makespan_s=r["makespan"], bound_s=bound,
            solve_time_s=time.perf_counter() - t0, hidden_comm_fraction=hidden_comm_fraction(p, r["makespan"]),
            scope="barrier-free (bounds every plan)",
            schedule={names[i]: (r["starts"][i], r["ends"][i]) for i in sorted(r["starts"])},
            reason=f"CP-SAT {r['cp_status']} on a {r['tick_s']:.3g} s grid"
                   + ("; the DP hint re-timed without barriers was kept" if r["hint_used"] else ""),
            params={**r["params"], "tick_s": r["tick_s"]})


def solve_pairing(problem: PairingProblem, solver: str = "dp", options: dict[str, Any] | None = None) -> PairingResult:
    """Solve ``problem`` with one method (see the module docstring); ``solver="all"`` is
    :func:`solve_pairing_all`.

    Examples
    --------
    >>> from hexhelix.ir.catalog import CATALOG
    >>> from hexhelix.ir.model import PRESETS, TrainingConfig
    >>> from hexhelix.solver.cost import Link
    >>> p = build_pairing_problem(PRESETS["llama2-13b"], TrainingConfig(), 4, CATALOG["A40"], Link(25e9, 5e-6))
    >>> seq, dp = solve_pairing(p, "sequential"), solve_pairing(p, "dp")
    >>> lower_bound_s(p) <= dp.makespan_s < seq.makespan_s
    True
    """
    if solver == "all":
        raise InvalidInputError("use solve_pairing_all for every method", field="solver")
    return _Session(problem, options).run(solver)


def solve_pairing_all(problem: PairingProblem, options: dict[str, Any] | None = None,
                      solvers: tuple[str, ...] = SOLVERS) -> list[PairingResult]:
    """Run several methods on one problem, sharing the overlap model, cost table and DP plan."""
    s = _Session(problem, options)
    return [s.run(name) for name in solvers]


def score_pairing_plan(problem: PairingProblem, plan: PairingPlan, name: str = "given") -> PairingResult:
    """Score a user-given barrier plan (e.g. the paper's 17-block default) with the block cost.
    Raises InvalidInputError naming the first block that breaks coverage, order or legality."""
    t0 = time.perf_counter()
    m = OverlapModel(problem)
    blocks = plan.strand_sets(problem)
    res = _barrier_result(name, problem, m, blocks, SolveStatus.FEASIBLE, t0, "barrier model, given plan")
    return dataclasses.replace(res, plan=plan)


def results_to_dict(problem: PairingProblem, results: list[PairingResult]) -> dict[str, Any]:
    """The JSON object ``hexhelix pair --json`` and ``hexhelix solve`` print."""
    seq = sum(o.duration_s for o in problem.ops)
    out = []
    for r in results:
        d = r.to_dict()
        d["saving_g"] = max(0.0, 1.0 - r.makespan_s / seq) if seq > 0 and math.isfinite(r.makespan_s) else None
        out.append(d)
    return {"schema": RESULT_SCHEMA, "kind": "pairing", "meta": problem.meta,
            "lower_bound_s": lower_bound_s(problem), "sequential_s": seq, "results": out}


def solve_pairing_problem(d: dict[str, Any], solver: str | None = None,
                          options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``hexhelix solve`` entry: a ``hexhelix.problem/1`` document of kind ``pairing`` in, the
    result object out (same shape as ``hexhelix pair --json``). An optional ``solve`` object in the
    document (``{"solver": "cpsat", "time_limit": 5, ...}``) supplies defaults that the arguments
    override; without one every method runs."""
    problem = PairingProblem.from_dict(d)
    settings = dict(d.get("solve") or {}) if isinstance(d.get("solve") or {}, dict) else {}
    solver = solver or settings.pop("solver", "all")
    settings.pop("solver", None)
    options = {**settings, **(options or {})}
    if solver == "all":
        results = solve_pairing_all(problem, options)
    else:
        results = [solve_pairing(problem, solver, options)]
    return results_to_dict(problem, results)


def pair_saving(model: ModelConfig, train: TrainingConfig, tp: int, gpu: GpuType, intra_link: cost.Link,
                profile: Profile = DEFAULT_PROFILE, solver: str = "dp", options: dict[str, Any] | None = None) -> float:
    """Per-layer-pair saving g of the W-shaped schedule (design.md §6): g = 1 − paired / sequential
    time of one layer pair (forward of one strand ∥ backward of the other), ≥ 0. TP 1 has no
    communication to hide and gives 0 under the default overlap table."""
    p = build_pairing_problem(model, train, tp, gpu, intra_link, profile)
    seq = sum(o.duration_s for o in p.ops)
    if seq <= 0:
        return 0.0
    res = solve_pairing(p, solver, options)
    if not math.isfinite(res.makespan_s):
        return 0.0
    g = 1.0 - res.makespan_s / seq
    return g if g > 1e-12 else 0.0  # below float-summation noise: no saving


def stage_pairings(plan: Plan, profile: Profile = DEFAULT_PROFILE, solver: str = "dp",
                   options: dict[str, Any] | None = None) -> dict[tuple[str, int], PairingResult]:
    """One pairing result per distinct (GPU type, TP degree) among ``plan``'s stages — what a
    compiler attaches to each stage to emit PAIR/SYNC blocks; ``1 − makespan/sequential`` of each
    is the stage's g for :func:`hexhelix.solver.evaluate.evaluate`'s ``pair_savings``."""
    pr = plan.problem
    out: dict[tuple[str, int], PairingResult] = {}
    for pipe in plan.pipelines:
        for st in pipe.stages:
            gpu = pr.cluster.gpu_of_node(st.node)
            key = (gpu.name, st.tp)
            if key not in out:
                link = cost.cluster_link(pr.cluster, st.node, st.node)
                out[key] = solve_pairing(build_pairing_problem(pr.model, pr.training, st.tp, gpu, link, profile),
                                         solver, options)
    return out
