"""The fluid bound search of the exact planner as a job: in this process, or in a forked child so
that it runs on a second core while CP-SAT or the MILP works on the first.

The search (:func:`.fluid_branch.fluid_bounds_by_pipelines`) is pure CPU work with its own deadline;
the planner needs from it the per-P bounds and the best plan its masters rounded to
(:mod:`.master_rounding`). In a child (:mod:`.forked`) both come back through a pipe; a child that
fails or does not answer in time is logged and treated as "no fluid bound" (the planner's other bounds
still hold).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from hexhelix.ir.plan import Plan

from .candidates import CostTables
from .fluid_branch import fluid_bounds_by_pipelines
from .forked import ForkedCall, can_fork, fork_call
from .master_rounding import Incumbent

__all__ = ["FluidJob", "FluidOutcome", "can_fork", "run_fluid", "start_fluid"]

logger = logging.getLogger(__name__)

GRACE_S = 10.0  # how long past its deadline the parent waits for a child before giving up on it


@dataclass(frozen=True, slots=True)
class FluidOutcome:
    """Per-P lower bounds (seconds) and the fastest plan the search's rounded masters gave, when it
    beat the plan the search started from (every master it solved was rounded: none is left)."""

    bounds: dict[int, float] = field(default_factory=dict)
    plan: Plan | None = None
    error: str = ""


def run_fluid(tables: CostTables, pmax: int, upper_s: float, plan: Plan, deadline: float,
              only: frozenset[int] | None = None, keep_plan: bool = True) -> FluidOutcome:
    """The search in this process, until ``deadline`` (time.monotonic seconds); over the pipeline
    counts ``only`` when given (the others keep their global floors). ``plan`` (of time ``upper_s``)
    seeds it and is its first incumbent. ``keep_plan`` False: bounds only, no master rounded — a
    merged view's plans are plans of the merged cluster (:mod:`.node_merge`), which may beat every
    plan of the cluster itself and must not prune its search."""
    incumbent = Incumbent(plan, upper_s) if keep_plan else None
    bounds, _ = fluid_bounds_by_pipelines(tables, pmax=pmax, upper_s=upper_s, seed_plans=(plan,),
                                          deadline=deadline, only=only, incumbent=incumbent)
    return FluidOutcome(bounds=dict(bounds), plan=incumbent.plan if incumbent is not None and incumbent.improved else None)


def _search(tables: CostTables, pmax: int, upper_s: float, plan: Plan, deadline: float,
            only: frozenset[int] | None, keep_plan: bool) -> FluidOutcome:
    """The child's work: :func:`run_fluid`, looked up when it runs (tests replace it)."""
    return run_fluid(tables, pmax, upper_s, plan, deadline, only, keep_plan)


@dataclass
class FluidJob:
    """A fluid search running in a forked child; :meth:`collect` waits for its outcome."""

    call: ForkedCall
    deadline: float

    def ready(self) -> bool:
        """The child has answered (or died): :meth:`collect` will not wait."""
        return self.call.ready()

    def collect(self) -> FluidOutcome:
        """The child's outcome; an empty one (with ``error`` set) if it failed or overran its
        deadline by more than GRACE_S (it is then terminated)."""
        wait = max(0.0, self.deadline - time.monotonic()) + GRACE_S if math.isfinite(self.deadline) else None
        got = self.call.wait(wait)
        if got is None:
            out = FluidOutcome(error=f"no answer {GRACE_S:g} s after its deadline")
        else:
            out = got.value if not got.error else FluidOutcome(error=got.error)
        self.call.stop(grace=1.0)
        if out.error:
            logger.warning("fluid bound search failed: %s; continuing without it", out.error)
        return out

    def cancel(self) -> None:
        """Stop the child without waiting for it (its bounds are no longer needed)."""
        self.call.stop()


def start_fluid(tables: CostTables, pmax: int, upper_s: float, plan: Plan, deadline: float,
                only: frozenset[int] | None = None, keep_plan: bool = True) -> FluidJob:
    """Fork a child that runs the search (over ``only``, when given) until ``deadline`` and sends
    back its outcome (:func:`run_fluid`)."""
    call = fork_call(_search, tables, pmax, upper_s, plan, deadline, only, keep_plan, name="hexhelix-fluid-bound")
    return FluidJob(call=call, deadline=deadline)
