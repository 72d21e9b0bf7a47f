"""Multi-rank dry run: replay every rank's program together and find deadlocks.

Semantics (docs/program.md §5): SEND is non-blocking (the message becomes available when the
sender has issued it); RECV is non-blocking too — it posts the receive and takes the next message
of its (src, dst, channel) FIFO — and the compute op that consumes it (the first later F/B/BI or
PAIR half of the RECV's (stage, micro-batch, strand), docs/program.md §4) blocks until that
message has been sent; a RECV that no later op consumes blocks where it stands. A collective
(GRAD_SYNC, COLL) blocks until every member of its group stands at it; everything else proceeds. Ranks execute their lists in order (the sequential reading of strands;
SYNC is a no-op, PAIR runs both halves).

When no rank can move and some have not finished, the dry run builds the wait-for graph (rank →
the ranks it waits on) and reports a cycle of waiting ranks with their ops and a window of the
per-rank grid around the stuck positions. Along the way it accumulates a simple time estimate
(compute and sends take ``dur``; a RECV finishes no earlier than its message; a collective starts
when its last member arrives) — a sanity number, not the discrete-event simulator.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import networkx as nx

from .errors import ScheduleError
from .program import Instr, Kind, Op, Program

__all__ = ["DryRunReport", "check_deadlock", "consumers", "dry_run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunReport:
    """Outcome of a dry run: finished or not, the estimated makespan and, if stuck, the error."""

    finished: bool
    makespan_s: float
    rank_end_s: tuple[float, ...]
    executed: int
    error: ScheduleError | None = field(default=None)


def _collective_group(p: Program, ins: Instr) -> str | None:
    if ins.op is Op.GRAD_SYNC:
        entries = p.grad_sync.get(ins.bucket)
        return entries[0].group if entries else None
    if ins.op is Op.COLL:
        return ins.group
    return None


def _window(p: Program, pcs: list[int], ranks: list[int], radius: int = 3) -> str:
    lines = []
    for r in ranks:
        prog = p.programs[r]
        lo, hi = max(0, pcs[r] - radius), min(len(prog), pcs[r] + radius + 1)
        toks = [(f">>{prog[i]}<<" if i == pcs[r] else str(prog[i])) for i in range(lo, hi)]
        lines.append(f"  rank {r:>3} [{lo}..{hi - 1}]: " + " ".join(toks))
    return "\n".join(lines)


def consumers(program: Program) -> list[dict[int, list[int]]]:
    """Per rank: position of a compute op (or PAIR) -> positions of the RECVs it waits for.

    A RECV of kind ``act`` feeds the first later F of its (stage, mb, strand), one of kind
    ``grad`` the first later B or BI (inside a PAIR: the PAIR's position). A RECV with no such op
    after it maps to itself (it then blocks where it stands)."""
    out: list[dict[int, list[int]]] = []
    for prog in program.programs:
        waits: dict[int, list[int]] = defaultdict(list)
        pending: dict[tuple, list[int]] = defaultdict(list)
        for i, ins in enumerate(prog):
            if ins.op is Op.RECV:
                pending[(ins.kind is Kind.ACT, ins.stage, ins.mb, ins.strand)].append(i)
                continue
            for half in ins.pair or (ins,):
                if half.op in (Op.F, Op.B, Op.BI):
                    waits[i] += pending.pop((half.op is Op.F, half.stage, half.mb, half.strand), [])
        for left in pending.values():
            for i in left:
                waits[i].append(i)
        out.append({i: js for i, js in waits.items() if js})
    return out


def dry_run(program: Program) -> DryRunReport:
    """Execute all ranks' programs together (see module doc); never raises on a deadlock, reports it."""
    p = program
    W = p.world_size
    pcs = [0] * W
    clock = [0.0] * W
    sent: dict[tuple[int, int, int], list[float]] = defaultdict(list)  # (src,dst,ch) -> availability times
    posted: dict[tuple[int, int, int], int] = defaultdict(int)  # RECVs posted per FIFO
    seq: list[dict[int, int]] = [{} for _ in range(W)]  # [r]: RECV position -> its index in its FIFO
    waits = consumers(p)
    groups = {g.name: g.ranks for g in p.groups}
    executed = 0
    progress = True
    while progress:
        progress = False
        for r in range(W):
            prog = p.programs[r]
            while pcs[r] < len(prog):
                i = pcs[r]
                ins = prog[i]
                g = _collective_group(p, ins)
                if ins.op is Op.RECV and i not in seq[r]:  # post it: it takes the next message
                    key = _fifo(ins, r)
                    seq[r][i] = posted[key]
                    posted[key] += 1
                if i in waits[r]:  # the data this op consumes must have been sent
                    need = [(_fifo(prog[j], r), seq[r][j]) for j in waits[r][i]]
                    if any(k >= len(sent[key]) for key, k in need):
                        break
                    clock[r] = max([clock[r], *(sent[key][k] for key, k in need)])
                if ins.op is Op.RECV:
                    pass
                elif g is not None:
                    members = groups.get(g, ())
                    tok = str(ins.stripped())
                    if not all(pcs[m] < len(p.programs[m]) and str(p.programs[m][pcs[m]].stripped()) == tok
                               for m in members):
                        break
                    start = max(clock[m] for m in members)
                    for m in members:
                        clock[m] = start + p.programs[m][pcs[m]].dur
                        pcs[m] += 1
                    executed += len(members)
                    progress = True
                    continue
                elif ins.op is Op.SEND:
                    clock[r] += ins.dur
                    sent[(r, ins.peer, ins.ch)].append(clock[r])
                else:
                    clock[r] += ins.dur
                pcs[r] += 1
                executed += 1
                progress = True
    finished = all(pcs[r] == len(p.programs[r]) for r in range(W))
    error = None if finished else _deadlock(p, pcs, sent, seq, waits, groups)
    return DryRunReport(finished=finished, makespan_s=max(clock, default=0.0), rank_end_s=tuple(clock),
                        executed=executed, error=error)


def _fifo(recv: Instr, rank: int) -> tuple[int, int, int]:
    return (recv.peer, rank, recv.ch)


def _deadlock(p: Program, pcs: list[int], sent: dict, seq: list[dict[int, int]], waits: list[dict[int, list[int]]],
              groups: dict) -> ScheduleError:
    W = p.world_size
    wait = nx.DiGraph()
    why: dict[int, str] = {}
    for r in range(W):
        if pcs[r] >= len(p.programs[r]):
            continue
        ins = p.programs[r][pcs[r]]
        g = _collective_group(p, ins)
        missing = [j for j in waits[r].get(pcs[r], []) if seq[r][j] >= len(sent[_fifo(p.programs[r][j], r)])]
        if missing:
            j = missing[0]
            recv = p.programs[r][j]
            wait.add_edge(r, recv.peer)
            sends = [k for k, x in enumerate(p.programs[recv.peer])
                     if x.op is Op.SEND and x.peer == r and x.ch == recv.ch]
            k = seq[r][j]
            where = (f"rank {recv.peer} issues that send only at position {sends[k]} "
                     f"({p.programs[recv.peer][sends[k]]})" if k < len(sends)
                     else f"rank {recv.peer} never issues that send")
            posted = "" if j == pcs[r] else f" (its {recv} was posted at position {j})"
            why[r] = (f"rank {r} at position {pcs[r]} ({ins}) waits for the {recv.kind.value if recv.kind else ''} "
                      f"of micro-batch {recv.mb} from rank {recv.peer} on channel {recv.ch}{posted}, and {where}")
        elif g is not None:
            absent = [m for m in groups.get(g, ()) if m != r and not (
                pcs[m] < len(p.programs[m]) and str(p.programs[m][pcs[m]].stripped()) == str(ins.stripped()))]
            for m in absent:
                wait.add_edge(r, m)
            why[r] = f"rank {r} at position {pcs[r]} ({ins}) waits for ranks {absent} to join group {g}"
    try:
        cycle = [u for u, _ in nx.find_cycle(wait)]
    except nx.NetworkXNoCycle:
        cycle = []
    if cycle:
        ops = [(r, pcs[r], str(p.programs[r][pcs[r]])) for r in cycle]
        desc = "; ".join(why[r] for r in cycle)
        msg = (f"deadlock: ranks {' -> '.join(map(str, cycle + cycle[:1]))} wait on each other in a cycle: "
               f"{desc}.\n{_window(p, pcs, cycle)}")
        return ScheduleError(msg, cycle=cycle, ops=ops)
    # No cycle: someone waits for a rank that finished (a message or a collective that never comes).
    stuck = sorted(why)
    r = stuck[0]
    ops = [(s, pcs[s], str(p.programs[s][pcs[s]])) for s in stuck]
    targets = sorted({v for v in wait.successors(r)}) if r in wait else []
    done = [t for t in targets if pcs[t] >= len(p.programs[t])]
    msg = (f"stuck: {why[r]}, but rank(s) {done or targets} finished without providing it "
           f"({len(stuck)} rank(s) stuck).\n{_window(p, pcs, stuck[:8])}")
    return ScheduleError(msg, cycle=[], ops=ops)


def check_deadlock(program: Program) -> DryRunReport:
    """:func:`dry_run`, raising the :class:`ScheduleError` (cycle and ops attached) when stuck."""
    rep = dry_run(program)
    if rep.error is not None:
        raise rep.error
    return rep
