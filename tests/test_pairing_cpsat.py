"""The barrier-free CP-SAT model against a brute-force oracle on tiny instances.

The oracle enumerates every decision set of the same model — an order per resource and, for each
pair that may overlap, "i first", "j first" or "overlap and pay the penalty" — and takes the
longest path of each acyclic one. Every feasible schedule is dominated by the longest-path
schedule of its own decisions, so the minimum is the model's exact optimum.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hexhelix.ir.pairing import PairingProblem, PairOp
from hexhelix.solver.pairing import lower_bound_s, solve_pairing_all
from hexhelix.solver.pairing_costs import OverlapModel
from hexhelix.solver.result import SolveStatus


def tiny_problem(seed: int) -> PairingProblem:
    rng = random.Random(seed)
    cls = {"compute": ["gemm", "norm"], "intra": ["all_gather"], "inter": ["send_recv"]}

    def strand(prefix: str, n: int) -> tuple[PairOp, ...]:
        ops: list[PairOp] = []
        for i in range(n):
            r = rng.choices(["compute", "intra", "inter"], weights=[3, 2, 1])[0]
            deps = (ops[-1].name,) if ops and rng.random() < 0.8 else ()
            ops.append(PairOp(name=f"{prefix}{i}", op_class=rng.choice(cls[r]), resource=r,
                              duration_s=rng.uniform(0.5, 3.0), deps=deps))
        return tuple(ops)

    names = [c for cs in cls.values() for c in cs]
    oef = {f"{a}|{b}": rng.uniform(0.0, 1.0) for a in names for b in names}
    return PairingProblem(fwd=strand("f", rng.randint(1, 3)), bwd=strand("b", rng.randint(1, 3)), oef=oef)


def brute_force(p: PairingProblem) -> float:
    m = OverlapModel(p)
    n = len(m.base)
    by_res: dict[str, list[int]] = {}
    for i, r in enumerate(m.resource):
        by_res.setdefault(r, []).append(i)
    pairs = list(m.penalty)
    best = math.inf
    for orders in itertools.product(*(itertools.permutations(v) for v in by_res.values())):
        for choice in itertools.product(range(3), repeat=len(pairs)):
            dur = list(m.base)
            arcs: list[tuple[int, int]] = [(q, i) for i in range(n) for q in m.preds[i]]
            for seq in orders:
                arcs += list(itertools.pairwise(seq))
            for (i, j), c in zip(pairs, choice):
                if c == 0:
                    arcs.append((i, j))
                elif c == 1:
                    arcs.append((j, i))
                else:
                    who, pen = m.penalty[(i, j)]
                    dur[who] += pen
            span = _longest_path(n, arcs, dur)
            best = min(best, span)
    return best


def _longest_path(n: int, arcs: list[tuple[int, int]], dur: list[float]) -> float:
    succ: dict[int, list[int]] = {}
    indeg = [0] * n
    for a, b in arcs:
        succ.setdefault(a, []).append(b)
        indeg[b] += 1
    start = [0.0] * n
    ready = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while ready:
        a = ready.pop()
        seen += 1
        for b in succ.get(a, ()):
            start[b] = max(start[b], start[a] + dur[a])
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    if seen < n:
        return math.inf  # cyclic decisions: no schedule
    return max(start[i] + dur[i] for i in range(n))


@pytest.mark.parametrize("seed", range(25))
def test_cpsat_matches_brute_force_optimum(seed: int) -> None:
    p = tiny_problem(seed)
    exact = brute_force(p)
    dp, cp = solve_pairing_all(p, {"time_limit": 5.0, "workers": 1, "segments": "all"}, solvers=("dp", "cpsat"))
    assert cp.status is SolveStatus.OPTIMAL
    # optimal on the integer grid (tick = sequential / 1e6, durations floored): within a few ticks
    tol = 1e-5 * sum(o.duration_s for o in p.ops)
    assert abs(cp.makespan_s - exact) <= tol
    assert cp.bound_s <= exact + 1e-12
    assert lower_bound_s(p) <= exact + 1e-12 and exact <= dp.makespan_s + 1e-12
