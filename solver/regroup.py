"""Phase-1 local search: move blocks of GPUs between pipelines, then re-run phase 2 on them.

HexiScale's phase 1 (METIS, stripes) fixes which GPUs each pipeline gets before phase 2 has seen a
single stage cost, so a pipeline's best shape may need half a node that the partition gave to
another pipeline. Without activation recompute, where 1F1B's early stages need TP 4–8 for memory,
this is what the sweep misses: on hexiscale-het1 (Llama-2 7B) its best grouping gives one pipeline
the 3090, 3080 Ti and one 4090 node and the other two 4090 nodes (11.579 s), while splitting the
3090 node four and four between two pipelines of one 4090 node each, plus the 3080 Ti node and a
third 4090 node on either side, runs in 10.947 s (the plan CP-SAT's P = 2 model also finds).

GPUs inside a node are interchangeable for the cost model, so a grouping is a matrix of GPU counts
(pipeline × node). The search is first-improvement descent over three move kinds, scored by the
caller's ``finish`` (phase 2 + layer and micro-batch assignment + the one evaluator):

* *transfer*: d GPUs of node n from one pipeline to another, or to the idle pool (a pipeline left
  without GPUs is dropped: one pipeline fewer);
* *recruit*: d idle GPUs of node n join a pipeline;
* *exchange*: d GPUs of node a go from pipeline p to q while e GPUs of node b go from q to p.

Block sizes d, e are the node's TP degrees and the whole count held. Moves are visited in a fixed
order and the number of groupings scored is capped (``max_evals``), so a run is deterministic;
``deadline`` only guards the caller's time limit.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from hexhelix.ir.plan import Plan, PlanProblem

from .evaluate import Evaluation
from .layer_assign import valid_tp

__all__ = ["Grouping", "Regrouped", "groups_of", "neighbours", "node_counts", "regroup"]

logger = logging.getLogger(__name__)

Grouping = tuple[tuple[int, ...], ...]   # GPUs per (pipeline, node); pipelines sorted, none empty
Finish = Callable[[list[list[int]], float], "tuple[Plan, Evaluation] | None"]   # (groups, time to beat)


def node_counts(plan: Plan) -> Grouping:
    """The grouping of ``plan``: per pipeline, the GPUs it uses on each node."""
    nodes = len(plan.problem.cluster.nodes)
    rows = []
    for pipe in plan.pipelines:
        row = [0] * nodes
        for st in pipe.stages:
            row[st.node] += len(st.gpus)
        rows.append(tuple(row))
    return _canonical(rows)


def _canonical(rows: Sequence[Sequence[int]]) -> Grouping:
    """Pipelines are unordered: sorted rows, empty ones dropped."""
    return tuple(sorted(tuple(r) for r in rows if any(r)))


def groups_of(problem: PlanProblem, grouping: Grouping) -> list[list[int]]:
    """GPU ids per pipeline: each node's GPUs handed out in order, pipeline by pipeline."""
    cl = problem.cluster
    free = {n: list(cl.node_gpus(n)) for n in range(len(cl.nodes))}
    out = []
    for row in grouping:
        gpus: list[int] = []
        for n, k in enumerate(row):
            gpus += free[n][:k]
            free[n] = free[n][k:]
        out.append(gpus)
    return out


def _sizes(degrees: Sequence[int], held: int) -> list[int]:
    return sorted({d for d in degrees if d <= held} | {held}) if held > 0 else []


def neighbours(problem: PlanProblem, grouping: Grouping) -> Iterator[Grouping]:
    """Every grouping one move away (module docstring), in a fixed order, without repeats."""
    cl = problem.cluster
    caps = [node.count for node in cl.nodes]
    degrees = [valid_tp(problem, c) for c in caps]
    P, nodes = len(grouping), len(caps)
    used = [sum(row[n] for row in grouping) for n in range(nodes)]
    seen = {grouping}

    def shifted(*deltas: tuple[int | None, int, int]) -> Iterator[Grouping]:
        """The grouping with each (pipeline, node, GPUs) delta applied; pipeline None = the idle pool."""
        rows = [list(r) for r in grouping]
        for p, n, d in deltas:
            if p is not None:
                rows[p][n] += d
        g = _canonical(rows)
        if g and g not in seen:
            seen.add(g)
            yield g

    for p, n in itertools.product(range(P), range(nodes)):          # transfers and recruits
        for d in _sizes(degrees[n], grouping[p][n]):
            for q in [*range(P), None]:
                if q != p:
                    yield from shifted((p, n, -d), (q, n, d))
        for d in _sizes(degrees[n], caps[n] - used[n]):
            yield from shifted((p, n, d))
    for p, q in itertools.combinations(range(P), 2):                  # exchanges
        for a, b in itertools.permutations(range(nodes), 2):
            for d in _sizes(degrees[a], grouping[p][a]):
                for e in _sizes(degrees[b], grouping[q][b]):
                    yield from shifted((p, a, -d), (q, a, d), (q, b, -e), (p, b, e))


class Regrouped(NamedTuple):
    """What :func:`regroup` found: the best plan (the start when nothing beat it), its evaluation,
    the groupings scored, and why it stopped: "local optimum", "budget" (``max_evals``) or "time"."""

    plan: Plan
    evaluation: Evaluation
    scored: int
    stopped: str


def regroup(plan: Plan, ev: Evaluation, finish: Finish, *, max_evals: int,
            deadline: float | None = None) -> Regrouped:
    """First-improvement descent from ``plan``'s grouping (:class:`Regrouped`).

    ``finish(groups, below)`` turns GPU groups into a feasible plan and its evaluation, or None;
    ``below`` is the time to beat (the best so far), for work only worth doing under it.
    Stops at a local optimum, after ``max_evals`` groupings, or at ``deadline``
    (a ``time.perf_counter()`` value).
    """
    problem = plan.problem
    best: tuple[Plan, Evaluation] = (plan, ev)
    current, improved = node_counts(plan), True
    scored = {current}    # a grouping scored once stays no better than the best, which only improves
    while improved:
        improved = False
        for cand in neighbours(problem, current):
            if cand in scored:
                continue
            if len(scored) > max_evals or (deadline is not None and time.perf_counter() > deadline):
                return Regrouped(best[0], best[1], len(scored) - 1, "budget" if len(scored) > max_evals else "time")
            scored.add(cand)
            got = finish(groups_of(problem, cand), best[1].iteration_time_s)
            if got is not None and got[1].iteration_time_s < best[1].iteration_time_s * (1 - 1e-9):
                best, current, improved = got, cand, True
                logger.debug("regroup: %.4f s after %d groupings: %s", got[1].iteration_time_s,
                             len(scored) - 1, cand)
                break
    return Regrouped(best[0], best[1], len(scored) - 1, "local optimum")
