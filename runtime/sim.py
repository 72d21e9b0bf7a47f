"""Discrete-event simulator: replays a compiled program over all ranks with the durations and byte
counts the compiler wrote into it (design.md §8, shared/reference/schedule_ir.md §8.7).

Execution model (instruction semantics: docs/program.md)
--------------------------------------------------------
* Each rank has one **compute stream** and one **stream per link class** (intra-node, inter-node),
  so communication overlaps compute. Streams serve work first come, first served: an op starts
  at max(ready time, time its stream(s) become free).
* Each **strand** of a rank walks its instructions in program order (strand s runs the ops whose
  ``strand`` is s; SYNC and PAIR belong to both; GRAD_SYNC and OPT to strand 0). Compute ops
  (F/B/BI/BW/PAIR/OPT), collectives (COLL, GRAD_SYNC) and LOAD block the strand until they end;
  SEND and RECV are posted without blocking (``isend``/``irecv``), and the op consuming a RECV
  waits for its data.
* **Point-to-point** is matched FIFO per (src, dst, channel). Under *rendezvous* semantics (the
  default) a transfer starts only once both ends are posted; under *eager* it starts when the
  send is posted and the receiver finds the data when it gets there. A transfer occupies the
  link-class stream of both ends for max(SEND.dur, RECV.dur).
  The compiler posts each RECV one compute op before its consumer by default
  (:func:`hexhelix.ir.lower.prepost_recvs`), so under rendezvous the transfer runs while the
  receiver computes; a program compiled with ``recv_ahead=0`` (RECV right before its consumer)
  makes the receiver wait out every transfer. ``SimOptions(recv_ahead=n)`` applies the same pass
  once more, posting every RECV n further compute ops earlier than the program does.
* **Collectives** (COLL on a header group, GRAD_SYNC over its bucket's group) start when every
  member has arrived and their link streams are free; they last the longest member's ``dur``.
* **SYNC** releases when both strands arrive. **PAIR** waits for both strands, then runs its two
  ops together on the compute stream for the co-executed time (see :func:`~.sim_prep.prepare`).
* **Memory** (liveness per rank): F allocates its ``bytes`` when it starts, B (or BW) frees them
  when it ends; a receive buffer is live from its post (rendezvous) or arrival (eager) until
  its consumer starts. In a PAIR the F's allocation and the B's release proceed together, layer
  by layer as in DHelix (reference/dhelix.md §3.5), so the pair's net change lands at its end
  (the transient of at most one layer is not modelled). Peak = model states + runtime reserve +
  peak live bytes, the terms of the cost model's memory.
* **Not modelled**: TP peers are simulated independently (their programs are identical, so they
  stay in step; the TP collectives inside F/B are part of ``dur``); a link stream carries one
  transfer at a time in either direction (no full-duplex overlap of a send and a receive on the
  same link class).
* **Deadlock**: when no event is left and some strand has not finished, the run stops with
  :class:`~hexhelix.ir.errors.ScheduleError` carrying the wait-for cycle, never a hang.

Cost: O(log n) per event (one binary heap), O(n log n) post-processing; no scan over ranks per
event.
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass

from hexhelix.ir.errors import ScheduleError
from hexhelix.ir.profile import DEFAULT_PROFILE
from hexhelix.ir.program import Program

from .sim_prep import (
    COLL,
    GS,
    JOINT,
    LOAD,
    PAIR,
    RECV,
    SEND,
    SYNC,
    check_options,
    prepare,
    prepost_receives,
)
from .sim_result import RankStats, SimResult, Timeline

__all__ = ["SimOptions", "simulate"]

logger = logging.getLogger(__name__)

_OP, _XFER, _COLL = 0, 1, 2  # event kinds


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    """Knobs of the simulation.

    ``p2p``: "rendezvous" (a transfer starts once both ends are posted) or "eager" (when the
    send is posted). ``pair_oef``: override every PAIR's time with T_a + T_b − OEF·min(T_a, T_b).
    ``comm_scale``: multiply every transfer and collective duration (0 = free communication).
    ``recv_ahead``: post every RECV ``recv_ahead`` further compute ops earlier than the program
    places it (a runtime pre-posting ``irecv`` more aggressively; the compiler's own pass,
    :func:`hexhelix.ir.lower.prepost_recvs`, applied once more).
    ``record``: keep the timeline for traces and Gantt charts. ``reserve_bytes``: per-GPU runtime
    reserve (CUDA context, NCCL buffers) added to every rank's peak, as the cost model does;
    default ``program.meta["runtime_reserve_bytes"]`` or ``DEFAULT_PROFILE.runtime_reserve_bytes``.
    """

    p2p: str = "rendezvous"
    pair_oef: float | None = None
    comm_scale: float = 1.0
    recv_ahead: int = 0
    record: bool = True
    reserve_bytes: int | None = None

    def __post_init__(self) -> None:
        check_options(self.p2p, self.pair_oef, self.comm_scale, self.recv_ahead)


def simulate(program: Program, options: SimOptions | None = None) -> SimResult:
    """Replay ``program`` and return its :class:`~.sim_result.SimResult`.

    Raises
    ------
    ScheduleError
        When messages cannot match (statically) or the run deadlocks; the error carries the
        wait-for cycle (``cycle``: (rank, strand, token) triples) and the blocked ops.
    """
    opts = options or SimOptions()
    t0 = time.perf_counter()
    if opts.recv_ahead:
        program = prepost_receives(program, opts.recv_ahead)
    eng = _Engine(program, opts)
    eng.run()
    res = eng.result(time.perf_counter() - t0)
    logger.debug("simulated %d instructions on %d ranks in %.3f s", res.instructions, res.world_size, res.wall_s)
    return res


class _Engine:
    def __init__(self, program: Program, opts: SimOptions) -> None:
        self.program = program
        self.opts = opts
        p = self.p = prepare(program, pair_oef=opts.pair_oef, comm_scale=opts.comm_scale)
        W = program.world_size
        self.eager = opts.p2p == "eager"
        self.stride = max((len(x) for x in program.programs), default=0) + 1
        self.pos = [[0] * p.nstr for _ in range(W)]
        self.arrive = [[0] * len(x) for x in program.programs]     # joint ops: strands arrived
        self.issued = [[False] * len(x) for x in program.programs]
        self.cfree = [0.0] * W                                      # compute stream free at
        self.lfree = [[0.0, 0.0, 0.0] for _ in range(W)]            # link streams free at
        nt = len(p.t_src)
        self.t_posted = [0] * nt
        self.t_recv_posted = [False] * nt
        self.t_done = [False] * nt
        self.c_arrived = [0] * len(p.c_members)
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.work: list[tuple[int, int]] = []
        self.busy = [0.0] * W
        self.comm = [0.0] * W
        self.mem: list[list[tuple[float, int]]] = [[] for _ in range(W)]
        self.comp_iv: list[list[tuple[float, float]]] = [[] for _ in range(W)]
        self.comm_iv: list[list[tuple[float, float]]] = [[] for _ in range(W)]
        self.spans: list[list[tuple[float, float, int, int]]] = [[] for _ in range(W)]
        self.flows: list[tuple[int, int, int, int, float, float]] = []
        self.end = 0.0

    # ------------------------------------------------------------------ event loop
    def _push(self, t: float, kind: int, x: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, x))

    def run(self) -> None:
        nstr = self.p.nstr
        heap, work, stride = self.heap, self.work, self.stride
        for r in range(self.program.world_size):
            for s in range(nstr):
                self._advance(r, s, 0.0)
            while work:  # strands released at time 0 (e.g. a program that opens with SYNC)
                r2, s2 = work.pop()
                self._advance(r2, s2, 0.0)
        while heap:
            t, _, kind, x = heapq.heappop(heap)
            self.end = t
            if kind == _OP:
                r, i = divmod(x, stride)
                s = self.p.strand[r][i]
                if s == JOINT:
                    for s2 in range(nstr):
                        self.pos[r][s2] += 1
                        work.append((r, s2))
                else:
                    self.pos[r][s] += 1
                    work.append((r, s))
            elif kind == _XFER:
                self.t_done[x] = True
                if self.t_recv_posted[x]:
                    self._deliver(x, t)
            else:
                for m, i in self.p.c_members[x]:
                    self.pos[m][self.p.strand[m][i]] += 1
                    work.append((m, self.p.strand[m][i]))
            while work:
                r, s = work.pop()
                self._advance(r, s, t)
        self._check_finished()

    def _advance(self, r: int, s: int, t: float) -> None:
        """Walk strand s of rank r from its position at time t until it blocks or ends."""
        p = self.p
        seq = p.seqs[r][s]
        code = p.code[r]
        pos = self.pos[r][s]
        n = len(seq)
        while pos < n:
            i = seq[pos]
            c = code[i]
            if c == SEND or c == RECV:
                self._post(r, i, c, t)
                pos += 1
                continue
            if c == SYNC or c == PAIR:
                arrived = self.arrive[r][i] + 1
                self.arrive[r][i] = arrived
                if arrived < p.nstr:
                    break  # wait for the other strand
                if c == SYNC:
                    for s2 in range(p.nstr):
                        if s2 != s:
                            self.pos[r][s2] += 1
                            self.work.append((r, s2))
                    pos += 1
                    continue
            elif c == LOAD and p.dur[r][i] == 0.0:
                pos += 1
                continue
            elif c == COLL or c == GS:
                cid = p.link[r][i]
                self.c_arrived[cid] += 1
                if self.c_arrived[cid] == len(p.c_members[cid]):
                    self._start_coll(cid, t)
                break
            # blocking compute (F/B/BI/BW/PAIR/OPT, LOAD with a duration)
            self.issued[r][i] = True
            if p.ndeps[r][i] == 0:
                self._start(r, i, t)
            break
        self.pos[r][s] = pos

    def _start(self, r: int, i: int, t: float) -> None:
        p = self.p
        d = p.dur[r][i]
        if p.code[r][i] == LOAD:
            st = t
        else:
            st = t if t > self.cfree[r] else self.cfree[r]
            self.cfree[r] = st + d
            self.busy[r] += d
            self.comp_iv[r].append((st, st + d))
        en = st + d
        mem = self.mem[r]
        if p.recv_in[r][i]:
            mem.append((st, -p.recv_in[r][i]))
        if p.code[r][i] == PAIR:
            mem.append((en, p.alloc[r][i]))
        elif p.alloc[r][i]:
            mem.append((st, p.alloc[r][i]))
        if p.free[r][i]:
            mem.append((en, -p.free[r][i]))
        if self.opts.record:
            self.spans[r].append((st, en, 0, i))
        self._push(en, _OP, r * self.stride + i)

    def _post(self, r: int, i: int, c: int, t: float) -> None:
        p = self.p
        tid = p.link[r][i]
        self.t_posted[tid] += 1
        if c == RECV:
            self.t_recv_posted[tid] = True
            if not self.eager:
                self.mem[r].append((t, p.t_bytes[tid]))
            if self.t_done[tid]:  # eager: the data is already here
                self._deliver(tid, t)
            elif not self.eager and self.t_posted[tid] == 2:
                self._start_xfer(tid, t)
        elif self.eager or self.t_posted[tid] == 2:
            self._start_xfer(tid, t)

    def _start_xfer(self, tid: int, t: float) -> None:
        p = self.p
        src, dst, cls = p.t_src[tid], p.t_dst[tid], p.t_cls[tid]
        lf_s, lf_d = self.lfree[src], self.lfree[dst]
        st = max(t, lf_s[cls], lf_d[cls])
        d = p.t_dur[tid]
        en = st + d
        lf_s[cls] = lf_d[cls] = en
        if d > 0:
            self.comm[src] += d
            self.comm[dst] += d
            self.comm_iv[src].append((st, en))
            self.comm_iv[dst].append((st, en))
        if self.eager:
            self.mem[dst].append((st, p.t_bytes[tid]))
        if self.opts.record:
            self.spans[src].append((st, en, cls, p.t_si[tid]))
            self.spans[dst].append((st, en, cls, p.t_ri[tid]))
            self.flows.append((src, p.t_si[tid], dst, p.t_ri[tid], st, en))
        self._push(en, _XFER, tid)

    def _deliver(self, tid: int, t: float) -> None:
        p = self.p
        dst = p.t_dst[tid]
        c = p.consumer[dst][p.t_ri[tid]]
        left = p.ndeps[dst][c] - 1
        p.ndeps[dst][c] = left
        if left == 0 and self.issued[dst][c]:
            self._start(dst, c, t)

    def _start_coll(self, cid: int, t: float) -> None:
        p = self.p
        members, cls, d = p.c_members[cid], p.c_cls[cid], p.c_dur[cid]
        st = max(t, max(self.lfree[m][cls] for m, _ in members))
        en = st + d
        for m, i in members:
            self.lfree[m][cls] = en
            if d > 0:
                self.comm[m] += d
                self.comm_iv[m].append((st, en))
            if self.opts.record:
                self.spans[m].append((st, en, cls, i))
        self._push(en, _COLL, cid)

    # ------------------------------------------------------------------ deadlock
    def _check_finished(self) -> None:
        p = self.p
        blocked = {(r, s): p.seqs[r][s][self.pos[r][s]] for r in range(self.program.world_size)
                   for s in range(p.nstr) if self.pos[r][s] < len(p.seqs[r][s])}
        if not blocked:
            return
        prog = self.program.programs
        edges: dict[tuple[int, int], list[tuple[int, int]]] = {}
        why: dict[tuple[tuple[int, int], tuple[int, int]], str] = {}
        for (r, s), i in blocked.items():
            c = p.code[r][i]
            out: list[tuple[tuple[int, int], str]] = []
            if c in (SYNC, PAIR) and self.arrive[r][i] < p.nstr:
                out += [((r, s2), f"strand {s2} to reach it") for s2 in range(p.nstr) if blocked.get((r, s2)) != i]
            if c in (COLL, GS):
                out += [((m, p.strand[m][j]), f"rank {m} to reach {prog[m][j]}") for m, j in p.c_members[p.link[r][i]]
                        if blocked.get((m, p.strand[m][j])) != j]
            if p.ndeps[r][i] > 0:  # waiting for data: which end of the transfer is not posted?
                for ri, cons in p.consumer[r].items():
                    tid = p.link[r][ri]
                    if cons == i and not self.t_done[tid]:
                        if not self.t_recv_posted[tid]:  # its RECV sits in the other strand
                            out.append(((r, p.strand[r][ri]), f"{prog[r][ri]} to be posted"))
                        else:
                            src, si = p.t_src[tid], p.t_si[tid]
                            out.append(((src, p.strand[src][si]), f"{prog[src][si]} on rank {src}"))
            edges[(r, s)] = [v for v, _ in out if v in blocked]
            for v, reason in out:
                why.setdefault(((r, s), v), reason)
        cycle = _find_cycle(edges)
        where = cycle or sorted(blocked)[:8]
        desc = [(r, s, str(prog[r][blocked[(r, s)]])) for r, s in where]
        steps = []
        for k, (r, s, tok) in enumerate(desc[:8]):
            nxt = where[(k + 1) % len(where)] if cycle else None
            reason = why.get(((r, s), nxt), "") if nxt else ""
            steps.append(f"rank {r} strand {s} at {tok}" + (f" (waits for {reason})" if reason else ""))
        text = " -> ".join(steps)
        if cycle:
            msg = f"deadlock: wait-for cycle of {len(cycle)}: {text} -> (back to rank {cycle[0][0]})"
        else:
            msg = f"deadlock: {len(blocked)} strand(s) blocked with no cycle found; first: {text}"
        ops = [(r, s, blocked[(r, s)], str(prog[r][blocked[(r, s)]])) for r, s in sorted(blocked)]
        raise ScheduleError(msg, cycle=desc if cycle else [], ops=ops)

    # ------------------------------------------------------------------ result
    def result(self, wall: float) -> SimResult:
        program, W = self.program, self.program.world_size
        makespan = self.end
        reserve = self.opts.reserve_bytes
        if reserve is None:
            reserve = int(program.meta_number("runtime_reserve_bytes", DEFAULT_PROFILE.runtime_reserve_bytes))
        stats = []
        record = self.opts.record
        levels: list[tuple[tuple[float, int], ...]] = []
        for r in range(W):
            peak = level = 0
            curve: list[tuple[float, int]] = []
            for when, delta in sorted(self.mem[r]):
                level += delta
                peak = max(peak, level)
                if record:
                    if curve and curve[-1][0] == when:
                        curve[-1] = (when, level)
                    else:
                        curve.append((when, level))
            levels.append(tuple(curve))
            exposed = _exposed(self.comm_iv[r], self.comp_iv[r])
            union = _exposed(self.comm_iv[r], [])
            info = program.ranks[r]
            stats.append(RankStats(rank=r, busy_s=self.busy[r], idle_s=makespan - self.busy[r],
                                   comm_s=self.comm[r], exposed_comm_s=exposed, hidden_comm_s=union - exposed,
                                   peak_activation_bytes=int(peak), peak_memory_bytes=int(info.state_bytes + reserve + peak),
                                   capacity_bytes=info.capacity_bytes, state_bytes=info.state_bytes,
                                   reserve_bytes=reserve))
        timeline = None
        if self.opts.record:
            timeline = Timeline(program=program, spans=tuple(tuple(s) for s in self.spans), flows=tuple(self.flows),
                                memory=tuple(levels))
        n = sum(len(x) for x in program.programs)
        options = {"p2p": self.opts.p2p, "pair_oef": self.opts.pair_oef, "comm_scale": self.opts.comm_scale,
                   "recv_ahead": self.opts.recv_ahead, "pair_model": self.p.pair_model, "reserve_bytes": reserve}
        return SimResult(makespan_s=makespan, schedule=program.schedule, strands=program.strands, instructions=n,
                         ranks=tuple(stats), options=options, wall_s=wall, timeline=timeline)


def _find_cycle(edges: dict[tuple[int, int], list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """A cycle of the wait-for graph (iterative DFS), or [] if it has none."""
    color: dict[tuple[int, int], int] = {}
    for root in sorted(edges):
        if color.get(root):
            continue
        stack = [(root, iter(edges.get(root, [])))]
        path = [root]
        color[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
                path.pop()
                continue
            if color.get(nxt) == 1:
                return path[path.index(nxt):]
            if not color.get(nxt):
                color[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, []))))
                path.append(nxt)
    return []


def _exposed(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float:
    """Length of the union of ``comm`` intervals not covered by the union of ``compute`` ones."""
    def union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        for a, b in sorted(iv):
            if b <= a:
                continue
            if out and a <= out[-1][1]:
                if b > out[-1][1]:
                    out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out

    cu, pu = union(comm), union(compute)
    total, j = 0.0, 0
    for a, b in cu:
        covered = 0.0
        while j < len(pu) and pu[j][1] <= a:
            j += 1
        k = j
        while k < len(pu) and pu[k][0] < b:
            covered += min(b, pu[k][1]) - max(a, pu[k][0])
            k += 1
        total += (b - a) - covered
    return total

