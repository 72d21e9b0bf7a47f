"""HexiScale's hierarchical graph-partitioning planner, with the released code's defects fixed.

Algorithm (arXiv 2409.01143 §3; shared/reference/hexiscale.md §3), every plan scored by the one
evaluator (:func:`hexhelix.solver.evaluate.evaluate`):

1. **Phase 1** — split the GPUs into P pipelines (:mod:`~hexhelix.solver.partition`): METIS on the
   device graph with reciprocal-bandwidth weights (the paper: vertical slices, so gradient sync
   runs over fast intra-machine links) and with bandwidth weights (machine-aligned pipelines), plus
   exact vertical stripes over METIS groups of machines (G groups × P/G slices, for every G | P),
   which bound the machines per pipeline on large clusters.
2. **Phase 2** (:mod:`~hexhelix.solver.phase2`) — per pipeline: coarsen its GPUs into machine blocks (TP never crosses a machine);
   order the blocks with the top-τ greedy path search maximising bandwidth
   (:mod:`~hexhelix.solver.stage_order`), trying the best few paths (every order for ≤ 3 blocks)
   because 1F1B's early stages hold the most activations; split every block into TP stages over
   all compositions of its GPU count into TP degrees that divide the heads, or leave it idle
   (exhaustively when ≤ 256 combinations, else coordinate descent); assign layers.
3. **Layers and micro-batches** (:mod:`~hexhelix.solver.layer_assign`) — :func:`assign_layers` gives the exact minimum of
   (m−1)·max_k u_k + Σ_k u_k over contiguous layer counts with per-stage memory caps (stage times
   and memory are the evaluator's own, probed as affine functions of the layer count);
   :func:`allocate_micro_batches` gives the exact min-max split of the global batch's micro-batches
   over pipelines (greedy on increasing functions), alternated twice with the layer assignment.
   Phase 2 asks for ten thousand layouts at 40–56 GPUs: after the first ``phase2.COMPILED_AFTER`` the
   numba-compiled form (:mod:`~hexhelix.solver.layer_assign_jit`, the same counts) takes them over
   — hexiscale-het3 ~7 → ~3.5 s; small problems never pay numba's import.
4. **Outer search** — pipeline counts P = 1 … 8, then in steps of ~25 % and every power of two up
   to a memory/batch bound, deterministically (:mod:`~hexhelix.solver.count_search`): first a coarse pass over the
   powers of two while each improves, then the counts around its best, then the ascending sweep that
   stops after ``patience`` counts without improvement, over the counts not scored yet. The powers
   of two split power-of-two nodes evenly (the 25 % steps went 8, 10, 12, 15, 19, …); the first two
   passes reach a large cluster's best count early, where a time limit cuts the sweep, and see
   counts the patience rule alone skips. With phase 2 re-run for each pipeline's allocated
   micro-batch count (:func:`_finish`), on the generated A100/A40 clusters (Llama-2 7B, full
   recompute, 2026-12-06): gen-64 2.876 → 2.780 s, gen-128 2.949 → 2.802 s, gen-256 2.979 →
   2.819 s, gen-512 2.947 → 2.832 s (reached in 7.5 s; the sweep alone took 16 s before and ended
   at 3.061 s when cut there); every example cluster keeps its plan. A candidate whose
   gradient sync matters and whose pipelines alone beat the best so far gets sync-aware layer counts
   (:func:`relieve_sync`: cap the slowest-syncing stages, re-lay, keep the best; on hexiscale-het3,
   Llama-2 7B with full recompute, 8 vertical stripes go from 5.869 to 5.515 s and win — 5.492 s
   with the best block order reversed). The best evaluated plan is then
   polished by hill climbing on the evaluator (one layer across a boundary, one micro-batch
   out of the one slowest pipeline: from any other it cannot help), which also sees the gradient
   sync. The best uniform Megatron shape is a
   candidate as well (a portfolio: never slower than the homogeneous baseline), and so are plans of
   P identical pipelines (:mod:`~hexhelix.solver.symmetric`) for every P the sweep visited whose
   shapes are few enough to list: phase 2 picks a block's TP split by pipeline time alone, while
   these are scored with their gradient sync (hexiscale-het3: 5.492 → 5.449 s), and, faster than
   the best so far, those with one pair of different nodes taken in turn by the pipelines
   (hexiscale-het1: 8.768 → 8.741 s, a 3090 TP 4 stage in two pipelines, a 3080 Ti one in the
   other two). Last, the winner's
   grouping goes through a local search over GPU blocks moved between pipelines
   (:mod:`~hexhelix.solver.regroup`, at most ``REGROUP_MAX_EVALS`` groupings): phase 1 cannot
   split a node between pipelines by what phase 2 will make of it (Llama-2 7B on hexiscale-het1:
   11.579 → 10.947 s without activation recompute, 7.555 → 7.292 s with selective recompute;
   small-mixed with full recompute 17.489 → 17.381 s; the other goal clusters keep their plans).

Released defects fixed here (reference §2.10, §3.3–3.5): equal batch split across pipelines →
throughput-optimal micro-batch counts; memory-proportional layers → compute-speed layers under
memory caps (stages that would overflow get fewer layers); the stage-order argmin-across-starts
and inverse-permutation bugs → the maximum-bandwidth paths themselves; METIS zero edge weights
(segfault) → normalised positive integer weights; the fixed TP menu (no [1,1,1,1], TP not checked
against the head count) → every valid composition; the random walk over P with a stale
micro-batch size (Q6) → a deterministic sweep; every GPU forced into a stage → slow machines may
stay idle. Being a heuristic, it never claims optimality (status FEASIBLE, no bound).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence

import networkx as nx
from hexhelix.ir.checks import check_seconds
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from . import cost
from .count_search import pipeline_counts, search_counts
from .evaluate import Evaluation, evaluate
from .gradsync import gpu_sync_times
from .layer_assign import Stage, StageCostTable, allocate_micro_batches
from .megatron import plan_megatron
from .partition import EDGE_WEIGHTINGS, grouped_stripes, partition_pipelines
from .phase2 import PipelineSolver, min_stage_layers
from .regroup import Regrouped, regroup
from .result import SolveResult, SolveStatus
from .symmetric import best_symmetric, ranked_shapes

__all__ = ["pipeline_count_cap", "plan_hexiscale", "polish", "regroup_more", "symmetric_more"]

logger = logging.getLogger(__name__)

POLISH_S = 2.0     # default time budget of the final hill climbing (seconds)
MEGATRON_SEED_MAX_GPUS = 128  # the uniform-shape candidates are added up to this cluster size
SYMMETRIC_MAX_STEPS = 30_000  # listing steps per P for identical-pipeline candidates (≤ ~1.3 s per P at 32 GPUs)
SYMMETRIC_MIXED_MAX_STEPS = 10_000  # the same with a mixed unit (hexiscale-het1's P = 4 lists in 2,772)
REGROUP_MAX_EVALS = 200  # groupings the phase-1 local search scores (:mod:`.regroup`)


def _finish(problem: PlanProblem, ps: PipelineSolver, groups: list[list[int]], below: float = math.inf) -> Plan | None:
    """Stages per pipeline (a GPU group that cannot hold the model is left idle), then alternate
    layer assignment and micro-batch allocation twice; a pipeline whose micro-batch count changed
    gets its TP split re-chosen for the new count (:meth:`~hexhelix.solver.phase2.PipelineSolver.resplit`: phase 2 chose
    it at the throughput-proportional first guess; gen-64's A40 pipelines of 16 split TP 2 + 2 for
    three micro-batches, where the allocation gives them two and one TP-4 stage is faster) unless
    the pipelines already run ``below`` (the best plan so far) or slower. The full phase 2 at every
    new count found the same plans on every example cluster and gen-64/128/256 at up to 25 % more
    time (hexiscale-het3 4.3 → 5.2 s); one round of descent from the old split costs ≤ 3 %."""
    N = problem.training.num_micro_batches
    tflops = [sum(ps.graph.nodes[g]["tflops"] for g in grp) for grp in groups]
    m = [max(1, round(N * t / sum(tflops))) for t in tflops]
    solved = [(ps.solve(grp, mi), mi, grp) for grp, mi in zip(groups, m)]
    kept = [(st, mi, grp) for st, mi, grp in solved if st is not None]   # a group that cannot hold the model stays idle
    if not kept or len(kept) > N:
        return None
    stages, m, grps = (list(col) for col in zip(*kept))
    layouts = None
    for _ in range(2):
        layouts = [ps.layout(s, mi) for s, mi in zip(stages, m)]
        if any(lay is None for lay in layouts):
            return None
        probes = [ps.table.probes(s, mi) for s, mi in zip(stages, m)]
        U = [max(p.time0 + n * p.time1 for p, n in zip(pr, lay[0])) for pr, lay in zip(probes, layouts)]
        S = [sum(p.time0 + n * p.time1 for p, n in zip(pr, lay[0])) for pr, lay in zip(probes, layouts)]
        mx = [_max_mb(ps, s, lay[0]) for s, lay in zip(stages, layouts)]
        new_m = allocate_micro_batches(U, S, N, mx)
        if new_m is None:
            return None
        if new_m == m:
            break
        if max((mi - 1) * u + s for mi, u, s in zip(new_m, U, S)) < below:
            for i, (old_m, mi) in enumerate(zip(m, new_m)):
                if mi != old_m:
                    stages[i] = ps.resplit(grps[i], old_m, mi) or stages[i]
        m = new_m
    layouts = [ps.layout(s, mi) for s, mi in zip(stages, m)]
    if any(lay is None for lay in layouts):
        return None
    pipes = []
    for st, lay, mi in zip(stages, layouts, m):
        lo, out = 0, []
        for (node, g), n in zip(st, lay[0]):
            out.append(StagePlan(node=node, gpus=g, layers=(lo, lo + n)))
            lo += n
        pipes.append(PipelinePlan(stages=tuple(out), micro_batches=mi))
    return Plan(problem=problem, pipelines=tuple(pipes))


RELIEVE_MIN_SHARE = 0.02   # candidates whose gradient sync is at least this share of the iteration get relieve_sync


def _candidate(problem: PlanProblem, ps: PipelineSolver, groups: list[list[int]], profile: Profile, *,
               below: float, deadline: float | None) -> tuple[Plan, Evaluation] | None:
    """A phase-1 grouping turned into a feasible plan and its evaluation (phase 2, layers and
    micro-batches, the evaluator), or None. Where the gradient sync matters and the pipelines alone
    run under ``below`` (the best so far: capping layers only lengthens them), sync-aware layer
    counts (:func:`relieve_sync`) replace it when better."""
    plan = _finish(problem, ps, groups, below)
    if plan is None:
        return None
    ev = evaluate(plan, profile)
    if (ev.feasible and ev.grad_sync_s > RELIEVE_MIN_SHARE * ev.iteration_time_s
            and ev.iteration_time_s - ev.grad_sync_s < below):
        plan, ev = relieve_sync(plan, ev, ps, profile, deadline=deadline)
    return (plan, ev) if ev.feasible else None


def relieve_sync(plan: Plan, ev: Evaluation, ps: PipelineSolver, profile: Profile = DEFAULT_PROFILE, *,
                 deadline: float | None = None, patience: int = 3) -> tuple[Plan, Evaluation]:
    """Sync-aware layer counts: the per-pipeline layout cannot see the gradient sync (a layer's
    cost depends on where its other holders sit), so cap the layer count of every stage whose
    GPUs sync longest by one and re-lay its pipeline under the caps, repeatedly — a descent over
    the sync level Z of layout(caps(Z)) + Z that keeps the best evaluated plan. Capping whole
    classes of equally slow stages keeps vertical stripes aligned (the same layers on every
    pipeline's k-th stage), so their sync stays on the fast links. Stops after ``patience`` steps
    without improvement, when a cap reaches the minimum stage size, or at ``deadline``."""
    lo = min_stage_layers(plan.problem)
    caps = [[plan.problem.model.layers] * len(pipe.stages) for pipe in plan.pipelines]
    best, cur, stale = (plan, ev), plan, 0
    while stale < patience and (deadline is None or time.perf_counter() < deadline):
        per_gpu = gpu_sync_times(cur, profile)
        z = max(per_gpu.values(), default=0.0)
        if z <= 0.0:
            break
        hot = {g for g, t in per_gpu.items() if t >= z * (1 - 1e-6)}
        pipes = list(cur.pipelines)
        for p, pipe in enumerate(cur.pipelines):
            ks = [k for k, st in enumerate(pipe.stages) if hot.intersection(st.gpus)]
            if not ks:
                continue
            for k in ks:
                caps[p][k] = min(caps[p][k], pipe.stages[k].num_layers - 1)
            if min(caps[p]) < lo:
                return best
            lay = ps.layout([(st.node, st.gpus) for st in pipe.stages], pipe.micro_batches, caps[p])
            if lay is None:
                return best
            pipes[p] = _relayer(pipe, lay[0])
        cur = Plan(problem=plan.problem, pipelines=tuple(pipes), meta=plan.meta)
        ce = evaluate(cur, profile)
        if not ce.feasible:
            return best
        if ce.iteration_time_s < best[1].iteration_time_s * (1 - 1e-9):
            best, stale = (cur, ce), 0
        else:
            stale += 1
    return best


def _max_mb(ps: PipelineSolver, stages: list[Stage], counts: tuple[int, ...]) -> int:
    """Largest micro-batch count this layout holds in memory (only GPipe grows with m)."""
    N = ps.n_mb
    if ps.problem.schedule != "gpipe":
        return N

    def fits(m: int) -> bool:
        return all(p.mem0 + n * p.mem1 <= p.capacity for p, n in zip(ps.table.probes(stages, m), counts))

    lo, hi = 0, N
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _moves(plan: Plan, pipe_times: Sequence[float]) -> Iterator[list[PipelinePlan]]:
    """Neighbour plans: one layer across a stage boundary, or one micro-batch between pipelines.

    A micro-batch moves only out of the one slowest pipeline (``pipe_times``: the plan's, in order):
    it changes no stage, so sync and optimizer stay, and from any other pipeline the slowest time
    stays too (at 512 GPUs this skips ~4,000 evaluations of moves that cannot improve)."""
    pipes, lo = list(plan.pipelines), min_stage_layers(plan.problem)
    slowest = max(pipe_times)
    only = [p for p, t in enumerate(pipe_times) if t == slowest]
    for p, pipe in enumerate(pipes):
        counts = [s.num_layers for s in pipe.stages]
        for k in range(len(counts) - 1):
            for d in (1, -1):
                c = list(counts)
                c[k] -= d
                c[k + 1] += d
                if min(c[k], c[k + 1]) >= lo:
                    yield [*pipes[:p], _relayer(pipe, c), *pipes[p + 1:]]
    if len(only) != 1 or pipes[only[0]].micro_batches < 2:
        return
    p = only[0]
    for q in range(len(pipes)):
        if q != p:
            out = list(pipes)
            out[p] = PipelinePlan(stages=pipes[p].stages, micro_batches=pipes[p].micro_batches - 1)
            out[q] = PipelinePlan(stages=pipes[q].stages, micro_batches=pipes[q].micro_batches + 1)
            yield out


def _relayer(pipe: PipelinePlan, counts: Sequence[int]) -> PipelinePlan:
    lo, out = 0, []
    for st, n in zip(pipe.stages, counts):
        out.append(StagePlan(node=st.node, gpus=st.gpus, layers=(lo, lo + n)))
        lo += n
    return PipelinePlan(stages=tuple(out), micro_batches=pipe.micro_batches)


def polish(plan: Plan, profile: Profile = DEFAULT_PROFILE, *, deadline: float | None = None,
           max_rounds: int = 50) -> tuple[Plan, Evaluation]:
    """First-improvement hill climbing on the evaluator's iteration time (gradient sync included,
    which the per-pipeline layer assignment cannot see); moves keep the plan valid and within
    memory. Stops at a local optimum, after ``max_rounds`` accepted moves, or at ``deadline``
    (a ``time.perf_counter()`` value)."""
    ev = evaluate(plan, profile)
    for _ in range(max_rounds):
        improved = False
        for pipes in _moves(plan, ev.pipeline_times_s):
            if deadline is not None and time.perf_counter() > deadline:
                return plan, ev
            cand = Plan(problem=plan.problem, pipelines=tuple(pipes), meta=plan.meta)
            ce = evaluate(cand, profile)
            if ce.feasible and ce.iteration_time_s < ev.iteration_time_s * (1 - 1e-9):
                plan, ev, improved = cand, ce, True
                break
        if not improved:
            break
    return plan, ev


def pipeline_count_cap(problem: PlanProblem) -> int:
    """Largest pipeline count the sweep visits: micro-batches, GPUs, and total memory over model
    states (looser than :func:`.exact_plan.max_pipelines`, which counts the fewest GPUs whose memory
    holds the states; tightening it would change the counts visited, so possibly the plans)."""
    cl, tr, model = problem.cluster, problem.training, problem.model
    need = cost.model_state_bytes(model.total_params, 1, tr)
    total = sum(cl.gpu_of_node(i).memory_bytes * n.count for i, n in enumerate(cl.nodes))
    return max(1, min(tr.num_micro_batches, cl.num_gpus, int(total // need)))


def state_memory_account(problem: PlanProblem) -> str:
    """A one-line account of model-state memory needed vs what the cluster has, per GPU type (the
    reason hexiscale gives with no plan; :func:`.candidates.memory_shortfall` is the exact planner's proof)."""
    cl, tr, model = problem.cluster, problem.training, problem.model
    need = cost.model_state_bytes(model.total_params, 1, tr)
    per: dict[str, float] = {}
    for i, n in enumerate(cl.nodes):
        per[n.gpu] = per.get(n.gpu, 0.0) + cl.gpu_of_node(i).memory_bytes * n.count
    have = ", ".join(f"{k}: {v / 2**30:.0f} GiB" for k, v in per.items())
    return (f"model states alone need {need / 2**30:.1f} GiB ({tr.state_bytes_per_param:g} B/param x "
            f"{model.total_params / 1e9:.2f} B params) plus activations; the cluster has {have}")


def _phase1(graph: nx.Graph, P: int, seed: int) -> Iterator[tuple[str, list[list[int]]]]:
    """Phase-1 candidates for P pipelines: vertical stripes over machine groups (every G dividing
    P: G groups of machines × P/G slices), and METIS on the whole device graph with reciprocal
    (the paper) and plain bandwidth weights."""
    n_nodes = len({graph.nodes[v]["node_index"] for v in graph.nodes})
    for G in range(1, min(P, n_nodes) + 1):
        if P % G == 0:
            yield f"stripes G={G}", grouped_stripes(graph, G, P // G, seed=seed)
    if P <= graph.number_of_nodes():
        for weighting in EDGE_WEIGHTINGS:
            yield weighting, partition_pipelines(graph, P, seed=seed, weighting=weighting)


def _regroup(problem: PlanProblem, ps: PipelineSolver, plan: Plan, profile: Profile, *, max_evals: int,
             deadline: float | None) -> Regrouped:
    def finish(groups: list[list[int]], below: float) -> tuple[Plan, Evaluation] | None:
        return _candidate(problem, ps, groups, profile, below=below, deadline=deadline)

    return regroup(plan, evaluate(plan, profile), finish, max_evals=max_evals, deadline=deadline)


def regroup_more(plan: Plan, profile: Profile = DEFAULT_PROFILE, *, deadline: float, tau: int = 3,
                 max_evals: int = 100_000) -> Regrouped:
    """Go on with hexiscale's grouping search from ``plan`` (e.g. one whose search stopped at its
    time limit) until a local optimum, ``max_evals`` groupings or ``deadline`` (``time.perf_counter``).
    Phase 2 starts with an empty memo, so the first groupings cost more than in the run before."""
    problem = plan.problem
    ps = PipelineSolver(problem, StageCostTable(problem, profile), tau)
    return _regroup(problem, ps, plan, profile, max_evals=max_evals, deadline=deadline)


SYMMETRIC_MORE_STEPS = (100_000, 1_000_000, 10_000_000)  # listing budgets of :func:`symmetric_more`, in turn
# (mixed unit?, index into SYMMETRIC_MORE_STEPS) in the order :func:`symmetric_more` lists them: a mixed unit's after the
# plain ones' first two budgets (hexiscale-het1 / Llama-2 13B: its P = 2 plain listing finds 15.740 s at
# 1,000,000 steps, ~3 s in, and its mixed listing runs 3 s into 100,000 steps without an end)
SYMMETRIC_MORE_ORDER = ((False, 0), (False, 1), (True, 0), (True, 1), (False, 2), (True, 2))


def symmetric_more(plan: Plan, profile: Profile = DEFAULT_PROFILE, *, deadline: float,
                   tau: int = 3) -> tuple[Plan, Evaluation] | None:
    """Plans of P identical pipelines faster than ``plan``, listed beyond hexiscale's step budget:
    split combinations whose pipelines cannot beat it, and orders memory does not admit, are left
    out before any layout (:meth:`~hexhelix.solver.phase2.PipelineSolver.floor`, :meth:`~hexhelix.solver.phase2.PipelineSolver.fits`). Every P
    from 2 up gets a listing of 100,000 steps, then those unfinished 1,000,000, then 10,000,000, until
    ``deadline`` (``time.perf_counter``); the shapes with a mixed unit
    (:func:`~hexhelix.solver.symmetric.mixed_unit_sets`) are listed the same way, in turn with them
    (``SYMMETRIC_MORE_ORDER``). The best such plan, or None (hexiscale-het2 without recompute: P = 2
    lists in ~4 s, 6.413 → 6.311 s)."""
    problem = plan.problem
    ps = PipelineSolver(problem, StageCostTable(problem, profile), tau)
    best: tuple[Plan, Evaluation] | None = None
    below = evaluate(plan, profile).iteration_time_s
    todo = {mixed: list(range(2, pipeline_count_cap(problem) + 1)) for mixed in (False, True)}
    for mixed, level in SYMMETRIC_MORE_ORDER:
        left = []
        for P in todo[mixed]:
            if time.perf_counter() >= deadline:
                return best
            ranked = ranked_shapes(problem, P, ps.layout, max_steps=SYMMETRIC_MORE_STEPS[level], floor=ps.floor,
                                   fits=ps.fits, below=below, deadline=deadline, mixed=mixed)
            if ranked is None:
                left.append(P)
                continue
            got = best_symmetric(problem, P, ps.layout, profile, below=below, ranked=ranked, deadline=deadline)
            if got is not None:
                best, below = got, got[1].iteration_time_s
        todo[mixed] = left
    return best


Best = tuple[float, Plan, str]  # (iteration time, plan, which candidate)



def _sweep(problem: PlanProblem, ps: PipelineSolver, profile: Profile, counts: list[int], *, seed: int,
           patience: int, t0: float, time_limit: float | None, deadline: float | None,
           ) -> tuple[Best | None, int, bool, list[int]]:
    """The outer search (:func:`~hexhelix.solver.count_search.search_counts`): each pipeline count's phase-1 groupings finished by
    phase 2 and scored; ``time_limit`` cuts it (the first candidate is always tried). Returns the
    best candidate, how many groupings were tried, whether the time limit cut the search, and the
    counts visited (ascending)."""
    best: Best | None = None
    tried, truncated = 0, False
    seen: set[tuple[tuple[int, ...], ...]] = set()

    def score(P: int) -> float | None:
        nonlocal best, tried, truncated
        got_best = math.inf
        for label, groups in _phase1(ps.graph, P, seed):
            if time_limit is not None and tried and time.perf_counter() - t0 > time_limit:
                truncated = True
                return None
            key = tuple(tuple(g) for g in groups)
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            got = _candidate(problem, ps, groups, profile, below=math.inf if best is None else best[0],
                             deadline=deadline)
            if got is None:
                continue
            plan, ev = got
            logger.debug("hexiscale P=%d %s: %.4f s", P, label, ev.iteration_time_s)
            got_best = min(got_best, ev.iteration_time_s)
            if best is None or ev.iteration_time_s < best[0]:
                best = (ev.iteration_time_s, plan, f"P={P} {label}")
        return got_best

    visited = search_counts(counts, score, patience)
    return best, tried, truncated, sorted(visited)


def plan_hexiscale(problem: PlanProblem, *, seed: int = 0, profile: Profile = DEFAULT_PROFILE,
                   time_limit: float | None = None, tau: int = 3, patience: int = 4,
                   seed_megatron: bool = True, symmetric: bool = True,
                   regroup_evals: int = REGROUP_MAX_EVALS, improve_s: float | None = None) -> SolveResult:
    """Plan with the fixed HexiScale heuristic (see the module docstring).

    Status FEASIBLE with a plan; INFEASIBLE when no candidate fits in memory (the reason gives the
    model-state memory against the cluster's, per GPU type; a heuristic's "no plan" is not a
    proof); TIMEOUT when ``time_limit`` ran out before any plan was found.

    ``seed`` is the METIS seed; the sweep itself is deterministic. The sweep over P
    (:func:`~hexhelix.solver.count_search.search_counts`) ends its ascending pass after ``patience`` consecutive pipeline counts
    without improvement; ``time_limit`` stops it early (the
    best plan so far is returned, ``params['truncated']`` says so). With ``seed_megatron`` the best
    uniform Megatron shape (:func:`~hexhelix.solver.megatron.plan_megatron`) is a candidate too, so
    the result is never slower than that baseline (clusters up to 128 GPUs, where that enumeration
    is cheap); with ``symmetric`` so are the plans of P identical pipelines for each P the sweep
    visited (:func:`~hexhelix.solver.symmetric.best_symmetric`, skipped where listing their shapes
    takes over ``SYMMETRIC_MAX_STEPS`` steps), then those with a mixed unit that beat the best so
    far (a listing of its own, ``SYMMETRIC_MIXED_MAX_STEPS``); ``params['winner']`` names the winning
    candidate.
    The winner's grouping is then improved by moving GPU blocks between pipelines
    (:func:`~hexhelix.solver.regroup.regroup`, at most ``regroup_evals`` groupings; 0 turns it off;
    ``params['regroup_stopped']`` says why it ended: local optimum, budget, time, or off).
    ``improve_s`` (seconds from the start, default the time limit) ends that search and the final
    polish earlier than the sweep: the exact planner's warm start lets the sweep of a large cluster
    finish (512 GPUs: 19 s, its best plan found by 7.5 s) while keeping the improvement of a small one to its 10 s.
    """
    if isinstance(regroup_evals, bool) or not isinstance(regroup_evals, int) or regroup_evals < 0:
        raise InvalidInputError(f"must be a whole number of groupings >= 0 (0 turns the search off), "
                                f"got {regroup_evals!r}", field="regroup_evals")
    if improve_s is not None:
        check_seconds(improve_s, "improve_s")
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    improve_until = deadline if improve_s is None else t0 + improve_s if deadline is None else min(deadline, t0 + improve_s)
    table = StageCostTable(problem, profile)
    ps = PipelineSolver(problem, table, tau)
    pmax = pipeline_count_cap(problem)
    best, tried, truncated, visited = _sweep(problem, ps, profile, pipeline_counts(pmax), seed=seed,
                                             patience=patience, t0=t0, time_limit=time_limit, deadline=deadline)
    if seed_megatron and not truncated and problem.cluster.num_gpus <= MEGATRON_SEED_MAX_GPUS:
        meg = plan_megatron(problem, profile=profile)
        if meg.plan is not None and (best is None or meg.iteration_time_s < best[0]):
            best = (meg.iteration_time_s, meg.plan, "megatron shape")
    for P in visited if symmetric and not truncated else ():
        if P < 2:                 # one pipeline has no gradient sync, which phase 2 cannot see anyway
            continue
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            truncated = True
            break
        sym = best_symmetric(problem, P, ps.layout, profile, below=math.inf if best is None else best[0],
                             max_steps=SYMMETRIC_MAX_STEPS, deadline=deadline,
                             fits=ps.fits)
        if sym is not None:
            best = (sym[1].iteration_time_s, sym[0], f"symmetric P={P}")
        if best is not None:      # with a mixed unit: only what beats the best so far is listed (floor)
            sym = best_symmetric(problem, P, ps.layout, profile, below=best[0],
                                 max_steps=SYMMETRIC_MIXED_MAX_STEPS, deadline=deadline, floor=ps.floor,
                                 fits=ps.fits, mixed=True)
            if sym is not None:
                best = (sym[1].iteration_time_s, sym[0], f"symmetric P={P}, mixed unit")
    regrouped, regroup_stopped = 0, "off"
    if best is not None and regroup_evals > 0 and not truncated:
        plan, ev, regrouped, regroup_stopped = _regroup(problem, ps, best[1], profile, max_evals=regroup_evals,
                                                        deadline=improve_until)
        if ev.iteration_time_s < best[0]:
            best = (ev.iteration_time_s, plan, f"{best[2]}, regrouped")
    elapsed = time.perf_counter() - t0
    params = {"seed": seed, "tau": tau, "patience": patience, "time_limit": time_limit, "improve_s": improve_s,
              "max_pipelines": pmax,
              "candidates_tried": tried, "truncated": truncated, "symmetric": symmetric,
              "regroup_evals": regroup_evals, "regrouped": regrouped, "regroup_stopped": regroup_stopped}
    if best is None:
        status = SolveStatus.TIMEOUT if truncated else SolveStatus.INFEASIBLE
        why = (f"time limit {time_limit} s reached before hexiscale found a plan" if truncated else
               "hexiscale (a heuristic, not a proof) found no plan within memory: " + state_memory_account(problem))
        return SolveResult(solver="hexiscale", status=status, plan=None, evaluation=None,
                           solve_time_s=elapsed, params=params, reason=why)
    plan = Plan(problem=problem, pipelines=best[1].pipelines,
                meta={"solver": "hexiscale", "seed": seed, "tau": tau})
    before = best[0]
    # polish: bounded by the time limit (or improve_s), or by POLISH_S seconds without either
    plan, ev = polish(plan, profile, deadline=improve_until if improve_until is not None
                      else time.perf_counter() + POLISH_S)
    params.update({"before_polish_s": before, "winner": best[2]})
    elapsed = time.perf_counter() - t0
    return SolveResult(solver="hexiscale", status=SolveStatus.FEASIBLE, plan=plan, evaluation=ev,
                       objective_s=ev.iteration_time_s, bound_s=None, solve_time_s=elapsed, params=params)
