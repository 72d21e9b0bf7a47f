"""The HexiScale planner **as released** (Relaxed-System-Lab/FlashFlex ``experimental/``), reproduced.

This module is a baseline: it reproduces the released algorithm *and its private cost model*
(shared/reference/hexiscale.md §2–3) so users can see what the fixes in
:mod:`hexhelix.solver.hexiscale` buy. The cost model below (class :class:`ReleasedCostModel`) is
**not hexhelix's**: it is used only to *choose* the released planner's plan, exactly as the released
code does. The chosen plan is then scored by hexhelix's one evaluator like every other plan.

Reproduced (reference section in brackets):

* per-layer compute α_c·b·s·h²·(1 + s/6h + V/16Lh)/(t·F) with F = TFLOPS·2^40, α_c = 96/72 and
  α_tp = 12/8 with/without recompute [§2.2–2.3]; pipeline P2P cost [§2.4]; the synchronous-tick
  GPipe model [§2.5]; DP sync with the padding rule, first t_max/t_min columns [§2.6];
  T_iter = 1.8·max T_pipe + 1.1·T_dp [§2.7]; the 8 B/param, one-micro-batch memory rule [§2.8];
  bandwidths as GB/s × 2^30 [§1];
* phase 1 METIS on reciprocal bandwidth; per pipeline K ~ 1 + Binomial(2, 0.2) parts by METIS on
  bandwidth, coarsened with Σ-bandwidth edges, ordered by the released ``get_stage_order`` (min
  across starts, inverse permutation), split by machine, TP split from the fixed menu chosen by
  ``tp_pp_tradeoff`` on a fake TP-proportional layer split [§3.3]; memory-proportional layers
  [§3.3 step 5]; equal batch split; the random walk over P (±1, clipped to [⌊N/L⌋+1, ⌊N/5⌋]) for
  ``niter`` = 40 iterations with a NumPy ``RandomState(40404 + seed)`` [§3.4].

Adaptations (each needed to express the result as a hexhelix plan, none changes a choice the
released code would make when it applies): METIS weights are strictly positive (the released
zero weights segfault, §3.5); sequence length, dtype, batch sizes come from the problem instead of
the hard-coded 4096/fp16; menu TP degrees that do not divide the head count are skipped (the
released runtime requires it); stages left with zero layers by the memory-proportional rule are
dropped (their GPUs idle); when P does not divide the micro-batch count the first pipelines get
one extra micro-batch; the micro-batch size is the problem's (the released per-pipeline size
GLB_MB/P and its stale value, Q6, have no counterpart in a hexhelix plan, whose pipelines share one
micro-batch size); the walk starts at P = 2 clipped to its bounds (the released ``--npipeline``
is a user flag).

Status: FEASIBLE when hexhelix's evaluator finds the plan within memory; otherwise the plan and its
evaluation are still returned with status INFEASIBLE and the reason
"released planner's plan exceeds memory under the hexhelix cost model: …".
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence

import numpy as np
from hexhelix.ir.errors import InvalidInputError, UnsupportedError
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .evaluate import evaluate
from .partition import coarsen, group_by_node, partition_pipelines, split_pipeline
from .result import SolveResult, SolveStatus
from .stage_order import released_stage_order

__all__ = ["RELEASED_MENU", "ReleasedCostModel", "gpipe_tick_time", "plan_hexiscale_released"]

logger = logging.getLogger(__name__)

#: The released TP menu: candidate stage splits (TP degree per stage) of an n-GPU machine subset.
RELEASED_MENU: dict[int, list[list[int]]] = {
    1: [[1]], 2: [[2], [1, 1]], 3: [[2, 1], [1, 1, 1]], 4: [[4], [2, 2], [2, 1, 1]],
    5: [[4, 1], [2, 2, 1]], 6: [[4, 2], [2, 2, 2]], 7: [[4, 2, 1], [2, 2, 2, 1]],
    8: [[8], [4, 4], [4, 2, 2]],
}
PIPE_FACTOR, DP_FACTOR = 1.8, 1.1      # the released calibration constants (§2.7)
RELEASED_SEED, NITER = 40404, 40


def gpipe_tick_time(u: Sequence[float], n_mb: int) -> float:
    """The released synchronous-tick GPipe model (§2.5): Σ over ticks of the slowest active stage.

    Stage s is active in ticks s … s + n_mb − 1.

    >>> gpipe_tick_time([3, 1, 1, 3], 4)
    21
    >>> gpipe_tick_time([1, 2, 3], 4)   # unimodal: equals (m − 1)·max + Σ
    15
    """
    S = len(u)
    return sum(max(u[s] for s in range(S) if s <= c <= s + n_mb - 1) for c in range(n_mb + S - 1))


class ReleasedCostModel:
    """The released ``TimeCost``/``MemoryCost`` (§2), a reproduction — not hexhelix's cost model."""

    def __init__(self, problem: PlanProblem, micro_batches: int):
        cl, m, tr = problem.cluster, problem.model, problem.training
        self.cl, self.devs = cl, cl.devices()
        self.b, self.s, self.h, self.L, self.V = tr.micro_batch, tr.seq_len, m.hidden, m.layers, m.vocab
        self.beta = tr.dtype_bytes
        rec = tr.recompute != "none"
        self.alpha_c, self.alpha_tp = (96, 12) if rec else (72, 8)
        self.n_mb = micro_batches
        self.M = self.b * self.s * self.h * self.beta
        k = len(cl.nodes)
        self._node_bw = [[cl.node_link(a, c)[0] / 1e9 * 2**30 for c in range(k)] for a in range(k)]

    def bw(self, i: int, j: int) -> float:
        """B_ij in bytes/s as the released code computes it: GB/s × 2^30."""
        return self._node_bw[self.devs[i].node][self.devs[j].node]

    def flops(self, d: int) -> float:
        return self.devs[d].gpu.tflops * 2**40

    def layer_time(self, g: Sequence[int]) -> float:
        """T_comp(G) + T_tp(G) per layer per micro-batch (§2.2–2.3)."""
        t, b, s, h = len(g), self.b, self.s, self.h
        comp = self.alpha_c * b * s * h * h * (1 + s / (6 * h) + self.V / (16 * self.L * h)) / (t * self.flops(g[0]))
        tp = 0.0 if t == 1 else self.alpha_tp * max(sum(self.M / (t * self.bw(i, j)) for j in g if j != i) for i in g)
        return comp + tp

    def p2p(self, g: Sequence[int], nxt: Sequence[int]) -> float:
        """C_s (§2.4): best single cross link plus the scatter inside the receiving group, ×2."""
        t = len(nxt)
        return 2 * min(self.M / self.bw(p, q) + sum(self.M / (t * self.bw(q, r)) for r in nxt if r != q)
                       for p in g for q in nxt)

    def pipeline_time(self, stages: Sequence[Sequence[int]], layers: Sequence[int]) -> float:
        u = [n * self.layer_time(g) + (self.p2p(g, stages[k + 1]) if k + 1 < len(stages) else 0.0)
             for k, (g, n) in enumerate(zip(stages, layers))]
        return gpipe_tick_time(u, self.n_mb)

    def dp_time(self, pipes: Sequence[tuple[Sequence[Sequence[int]], Sequence[int]]]) -> float:
        """T_dp (§2.6): per layer, padded column groups, only the first t_max/t_min columns."""
        if len(pipes) < 2:
            return 0.0
        total = 0.0
        for layer in range(self.L):
            groups = []
            for stages, counts in pipes:
                bounds = list(itertools.accumulate(counts))
                groups.append(stages[next(k for k, e in enumerate(bounds) if layer < e)])
            tmax, tmin = max(len(g) for g in groups), min(len(g) for g in groups)
            padded = [[r for r in g for _ in range(tmax // len(g))] for g in groups]
            for k in range(tmax // tmin):
                col = [p[k] for p in padded]
                size = 12 * self.h * self.h * self.beta / (tmin * len(col))
                total += 2 * max(sum(size / self.bw(i, j) for j in col if j != i) for i in col)
        return total

    def memory_gb(self, g: Sequence[int], n: int, first: bool, last: bool) -> tuple[float, float]:
        """(M_param, M_act) of §2.8 in GB (2^30): 8 B/param weights+grads, embedding/head not TP-split,
        one micro-batch of layer checkpoints plus the stage input and output."""
        h, t, V, s = self.h, len(g), self.V, self.s
        param = 4 * self.beta * (n * 12 * h * h / t + h * last + V * h * last + h * (V + s) * first) / 2**30
        act = self.beta * (n * self.b * s * h / t + 2 * self.b * s * h) / 2**30
        return param, act

    def oom(self, g: Sequence[int], n: int, first: bool, last: bool) -> bool:
        """The §2.8 rule: OOM when M_param + M_act exceeds the stage's average GPU memory."""
        return sum(self.memory_gb(g, n, first, last)) > sum(self.devs[d].gpu.memory_gib for d in g) / len(g)


def _memory_layers(stages: Sequence[Sequence[int]], mem: Sequence[float], L: int) -> list[int]:
    """``create_layer_partition``: layers proportional to stage memory, round-robin (§3.3 step 5)."""
    total, counts, given = sum(mem), [0] * len(stages), 0
    progress = True
    while given < L and progress:
        progress = False
        for k in range(len(stages)):
            if given < L and (counts[k] + 1) / L <= mem[k] / total:
                counts[k] += 1
                given += 1
                progress = True
    order = sorted(range(len(stages)), key=lambda k: -mem[k])
    for k in itertools.islice(itertools.cycle(order), L - given):
        counts[k] += 1
    return counts


def _pipeline(problem: PlanProblem, cm: ReleasedCostModel, graph, gpus: list[int], rng: np.random.RandomState,
              seed: int) -> tuple[list[tuple[int, ...]], list[int]] | None:
    """``partition_pipeline`` (§3.3) for one pipeline: stages and layer counts, or None on OOM."""
    K = 1 + int(rng.binomial(2, 0.2))
    parts = split_pipeline(graph, gpus, K, seed=seed)
    pg = coarsen(graph, parts)
    w = [[pg.edges[i, j]["total_bandwidth"] if i != j else 0.0 for j in range(len(parts))] for i in range(len(parts))]
    order = released_stage_order(w, 3)
    stages: list[tuple[int, ...]] = []
    for pi in order:
        for block in group_by_node(graph, parts[pi]):
            menu = [c for c in RELEASED_MENU.get(len(block), [[8] * (len(block) // 8) + [1] * (len(block) % 8)])
                    if _tp_ok(problem, c)] or [[1] * len(block)]
            best = None
            for cand in menu:
                sts, i = [], 0
                for t in cand:
                    sts.append(tuple(block[i:i + t]))
                    i += t
                L = problem.model.layers
                fake = [L * t // sum(cand) for t in cand]
                fake[-1] = L - sum(fake[:-1])
                c = cm.pipeline_time(sts, fake)
                if best is None or c < best[0]:
                    best = (c, sts)
            stages.extend(best[1])
    mem = [sum(cm.devs[d].gpu.memory_gib for d in g) for g in stages]
    counts = _memory_layers(stages, mem, problem.model.layers)
    kept = [(g, n) for g, n in zip(stages, counts) if n > 0]
    stages, counts = [g for g, _ in kept], [n for _, n in kept]
    if any(cm.oom(g, n, k == 0, k == len(stages) - 1) for k, (g, n) in enumerate(zip(stages, counts))):
        return None
    return stages, counts


def _tp_ok(problem: PlanProblem, cand: Sequence[int]) -> bool:
    try:
        for t in set(cand):
            problem.model.check_tp(t)
        return True
    except InvalidInputError:
        return False


def plan_hexiscale_released(problem: PlanProblem, *, seed: int = 0, profile: Profile = DEFAULT_PROFILE,
                            time_limit: float | None = None, niter: int = NITER) -> SolveResult:
    """Run the reproduced released planner, then score its plan with hexhelix's evaluator."""
    t0 = time.perf_counter()
    cl, tr = problem.cluster, problem.training
    graph = cl.device_graph()
    n, L, N = cl.num_gpus, problem.model.layers, tr.num_micro_batches
    rng = np.random.RandomState(RELEASED_SEED + seed)
    lo, hi = min(n // L + 1, n, N), max(1, min(n // 5, N, n))
    lo = min(lo, hi)
    P = min(max(2, lo), hi)
    best: tuple[float, list] | None = None
    iters = 0
    for _ in range(niter):
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            break
        iters += 1
        cm = ReleasedCostModel(problem, N // P)
        groups = partition_pipelines(graph, P, seed=seed, weighting="reciprocal")
        pipes = [_pipeline(problem, cm, graph, g, rng, seed) for g in groups]
        if all(p is not None for p in pipes):
            t_iter = PIPE_FACTOR * max(cm.pipeline_time(s, c) for s, c in pipes) + DP_FACTOR * cm.dp_time(pipes)
            if best is None or t_iter < best[0]:
                best = (t_iter, pipes)
        P = min(P + 1, hi) if rng.rand() < 0.5 else max(P - 1, lo)
    elapsed = time.perf_counter() - t0
    params = {"seed": seed, "rng_seed": RELEASED_SEED + seed, "niter": niter, "iterations_run": iters,
              "time_limit": time_limit, "pipe_factor": PIPE_FACTOR, "dp_factor": DP_FACTOR}
    if best is None:
        return SolveResult(solver="hexiscale-released", status=SolveStatus.INFEASIBLE, plan=None, evaluation=None,
                           solve_time_s=elapsed, params=params,
                           reason="the released planner found no plan: its own memory rule rejected every "
                                  f"candidate in {iters} iterations")
    t_rel, pipes = best
    P = len(pipes)
    devs = cl.devices()
    out = []
    for p, (stages, counts) in enumerate(pipes):
        sts, lo_l = [], 0
        for g, c in zip(stages, counts):
            sts.append(StagePlan(node=devs[g[0]].node, gpus=tuple(g), layers=(lo_l, lo_l + c)))
            lo_l += c
        out.append(PipelinePlan(stages=tuple(sts), micro_batches=N // P + (1 if p < N % P else 0)))
    plan = Plan(problem=problem, pipelines=tuple(out), meta={"solver": "hexiscale-released", "seed": seed})
    params["released_iteration_time_s"] = t_rel
    try:
        ev = evaluate(plan, profile)
    except UnsupportedError as err:                 # e.g. a 1-layer stage under W-shape folding
        return SolveResult(solver="hexiscale-released", status=SolveStatus.ERROR, plan=plan, evaluation=None,
                           objective_s=t_rel, solve_time_s=elapsed, params=params,
                           reason=f"the released planner's plan cannot run with schedule {problem.schedule}: {err}")
    if not ev.feasible:
        extra = f" (+{len(ev.violations) - 1} more)" if len(ev.violations) > 1 else ""
        return SolveResult(solver="hexiscale-released", status=SolveStatus.INFEASIBLE, plan=plan, evaluation=ev,
                           objective_s=t_rel, solve_time_s=elapsed, params=params,
                           reason="released planner's plan exceeds memory under the hexhelix cost model: "
                                  + ev.violations[0] + extra)
    return SolveResult(solver="hexiscale-released", status=SolveStatus.FEASIBLE, plan=plan, evaluation=ev,
                       objective_s=t_rel if math.isfinite(t_rel) else math.inf, bound_s=None,
                       solve_time_s=elapsed, params=params)
