"""One result type for every planning method, exact or heuristic (conventions 6 and 11).

"No feasible plan" from a solver that ran is a status, not an exception; ``SolverError`` is for a
backend that failed to run at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hexhelix.ir.plan import Plan

from .evaluate import Evaluation

__all__ = ["SolveResult", "SolveStatus"]


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"        # proven optimal (within the solver's relative gap tolerance)
    FEASIBLE = "feasible"      # a plan, not proven optimal, solver finished (heuristics always)
    TIMEOUT = "timeout"        # time limit hit; ``plan`` is the incumbent if any
    INFEASIBLE = "infeasible"  # proven: no plan satisfies the constraints (reason says which)
    ERROR = "error"            # the method failed; reason says why


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveResult:
    """What a planning method returns. ``objective_s`` is the method's own objective value;
    ``evaluation`` is the shared evaluator's score of ``plan`` (they must agree for exact models);
    ``bound_s`` is a proven lower bound on the iteration time (None for heuristics)."""

    solver: str
    status: SolveStatus
    plan: Plan | None
    evaluation: Evaluation | None
    objective_s: float = math.inf
    bound_s: float | None = None
    solve_time_s: float = 0.0
    reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    log: str = ""

    @property
    def iteration_time_s(self) -> float:
        return self.evaluation.iteration_time_s if self.evaluation else math.inf

    @property
    def gap(self) -> float | None:
        """(iteration time − bound) / iteration time; None without a bound or a plan."""
        if self.bound_s is None or self.evaluation is None:
            return None
        it = self.evaluation.iteration_time_s
        return max(0.0, (it - self.bound_s) / it) if it > 0 else 0.0

    def to_dict(self, *, with_log: bool = False) -> dict[str, Any]:
        ev = self.evaluation
        d: dict[str, Any] = {
            "solver": self.solver,
            "status": self.status.value,
            "iteration_time_s": ev.iteration_time_s if ev else None,
            "throughput_tokens_per_s": ev.throughput_tokens_per_s if ev else None,
            "mfu": ev.mfu if ev else None,
            "objective_s": self.objective_s if math.isfinite(self.objective_s) else None,
            "bound_s": self.bound_s,
            "gap": self.gap,
            "solve_time_s": self.solve_time_s,
            "reason": self.reason,
            "params": self.params,
            "plan": self.plan.to_dict() if self.plan else None,
        }
        if with_log:
            d["log"] = self.log
        return d
