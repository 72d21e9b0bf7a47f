"""Static preparation of a program for the simulator: flat per-rank arrays, SEND/RECV matching
per channel, collective membership, which RECV feeds which compute op, and liveness bytes.

Everything here is checked before the event loop starts, so a program whose messages cannot
match (a SEND without its RECV, FIFO keys that disagree, a collective some member never issues)
fails with a :class:`~hexhelix.ir.errors.ScheduleError` naming the op, never with a hang.
Semantics follow docs/program.md.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hexhelix.ir.errors import InvalidInputError, ScheduleError
from hexhelix.ir.lower import prepost_recvs
from hexhelix.ir.profile import DEFAULT_PROFILE
from hexhelix.ir.program import Instr, Kind, Op, Program

__all__ = ["CODE", "Prepared", "prepare", "prepost_receives", "prepost_recvs"]

#: The compiler's pass (:func:`hexhelix.ir.lower.prepost_recvs`) under the simulator's older name:
#: ``SimOptions(recv_ahead=n)`` applies it again on top of what the program already does.
prepost_receives = prepost_recvs

# integer op codes (the event loop compares ints, not enums)
LOAD, F, B, BI, BW, SEND, RECV, COLL, GS, OPT, SYNC, PAIR = range(12)
CODE = {Op.LOAD: LOAD, Op.F: F, Op.B: B, Op.BI: BI, Op.BW: BW, Op.SEND: SEND, Op.RECV: RECV,
        Op.COLL: COLL, Op.GRAD_SYNC: GS, Op.OPT: OPT, Op.SYNC: SYNC, Op.PAIR: PAIR}
JOINT = -1  # strand of an instruction both strands execute (SYNC, PAIR)
INTRA, INTER = 1, 2  # stream ids of the link classes (0 is the compute stream)


@dataclass(slots=True)
class Prepared:
    """Flat arrays the event loop reads; index [r][i] is instruction i of rank r."""

    nstr: int
    code: list[list[int]]
    dur: list[list[float]]
    strand: list[list[int]]
    seqs: list[list[list[int]]]          # [r][s]: indices of strand s's instructions (JOINT in all)
    link: list[list[int]]                # transfer id (SEND/RECV) or collective id (COLL/GS), else -1
    consumer: list[dict[int, int]]       # [r]: RECV index -> index of the compute op it feeds
    ndeps: list[list[int]]               # [r][i]: RECVs that must complete before op i starts
    recv_in: list[list[int]]             # [r][i]: receive-buffer bytes released when op i starts
    alloc: list[list[int]]               # [r][i]: activation bytes op i keeps alive
    free: list[list[int]]                # [r][i]: activation bytes op i releases
    # point-to-point transfers
    t_src: list[int]
    t_si: list[int]
    t_dst: list[int]
    t_ri: list[int]
    t_dur: list[float]
    t_cls: list[int]
    t_bytes: list[int]
    # collectives (COLL on a header group, GRAD_SYNC on its bucket's group)
    c_members: list[list[tuple[int, int]]]
    c_dur: list[float]
    c_cls: list[int]
    pair_model: str


def _fail(program: Program, r: int, i: int, what: str) -> ScheduleError:
    tok = str(program.programs[r][i])
    return ScheduleError(f"rank {r} instruction {i} ({tok}): {what}", ops=[(r, i, tok)])


def pair_time(a: Instr, b: Instr, oef: float) -> float:
    """Co-executed time of two ops by the overlap model (DHelix Eq. 1 solved for T_ab):
    T_ab = T_a + T_b − OEF · min(T_a, T_b)."""
    return a.dur + b.dur - oef * min(a.dur, b.dur)


def prepare(program: Program, *, pair_oef: float | None = None, comm_scale: float = 1.0) -> Prepared:
    """Flatten ``program`` and match its messages; raise ScheduleError on what cannot match.

    PAIR timing: ``pair_oef`` (an override) gives T_a + T_b − OEF·min(T_a, T_b); otherwise the
    compiler's ``PAIR.dur`` (its co-executed estimate, from a pairing plan when one was given)
    applies; a PAIR without an estimate takes the OEF in ``program.meta["pair_oef"]`` or, failing
    that, ``DEFAULT_PROFILE``'s compute-with-compute factor.
    """
    W = program.world_size
    nstr = max(1, program.strands)
    node = [ri.node for ri in program.ranks]
    default_oef = float(program.meta_number("pair_oef", DEFAULT_PROFILE.overlap("gemm", "gemm")))
    pair_model = "override" if pair_oef is not None else "program"
    code: list[list[int]] = []
    dur: list[list[float]] = []
    strand: list[list[int]] = []
    seqs: list[list[list[int]]] = []
    alloc: list[list[int]] = []
    free: list[list[int]] = []
    consumers: list[dict[tuple[int, int, int, int], int]] = []
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    groups = {g.name: g.ranks for g in program.groups}
    issued: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r, prog in enumerate(program.programs):
        n = len(prog)
        c_r = [CODE[ins.op] for ins in prog]
        d_r = [ins.dur for ins in prog]
        s_r = [0] * n
        a_r = [0] * n
        f_r = [0] * n
        # the first op of a key consumes its RECV (per-layer parts: docs/program.md §4)
        by_key: dict[tuple[int, int, int, int], int] = {}
        fbytes: dict[tuple[int, int, int], int] = {}
        sq: list[list[int]] = [[] for _ in range(nstr)]
        for i, ins in enumerate(prog):
            c = c_r[i]
            if c == SYNC:
                s_r[i] = JOINT
                for q in sq:
                    q.append(i)
                continue
            st = ins.strand
            if c == SEND or c == RECV:
                peer = ins.peer
                if not 0 <= peer < W or peer == r:
                    raise _fail(program, r, i, f"peer {peer} is not another rank of 0..{W - 1}")
                if c == SEND:
                    sends[(r, peer, ins.ch)].append(i)
                else:
                    recvs[(peer, r, ins.ch)].append(i)
                d_r[i] *= comm_scale
            elif c == F:
                by_key.setdefault((F, ins.stage, ins.mb, st), i)
                fbytes[(ins.stage, ins.mb, st)] = a_r[i] = ins.bytes
            elif c == B or c == BI or c == BW:
                if c != BW:
                    by_key.setdefault((B, ins.stage, ins.mb, st), i)
                if c != BI:
                    f_r[i] = ins.bytes or fbytes.get((ins.stage, ins.mb, st), 0)
            elif c == PAIR:
                if ins.pair is None:
                    raise _fail(program, r, i, "PAIR without its two ops")
                a, b = ins.pair
                if pair_oef is not None:
                    d_r[i] = pair_time(a, b, pair_oef)
                elif ins.dur <= 0:
                    d_r[i] = pair_time(a, b, default_oef)
                for p in (a, b):
                    if not 0 <= p.strand < nstr:
                        raise _fail(program, r, i, f"strand {p.strand} outside 0..{nstr - 1}")
                    pc = CODE[p.op]
                    if pc == F:
                        by_key.setdefault((F, p.stage, p.mb, p.strand), i)
                        fbytes[(p.stage, p.mb, p.strand)] = p.bytes
                        a_r[i] += p.bytes
                    elif pc in (B, BI, BW):
                        if pc != BW:
                            by_key.setdefault((B, p.stage, p.mb, p.strand), i)
                        if pc != BI:
                            f_r[i] += p.bytes or fbytes.get((p.stage, p.mb, p.strand), 0)
                    else:
                        raise _fail(program, r, i, f"PAIR half {p} is not a compute op")
            elif c == COLL:
                if ins.group not in groups:
                    raise _fail(program, r, i, f"unknown group {ins.group!r}")
                issued[("C", ins.group)][r].append(i)
                d_r[i] *= comm_scale
            elif c == GS:
                if ins.bucket not in program.grad_sync:
                    raise _fail(program, r, i, f"unknown bucket {ins.bucket!r} (not in the header's grad_sync)")
                issued[("G", ins.bucket)][r].append(i)
                d_r[i] *= comm_scale
            if c == PAIR:
                s_r[i] = JOINT
                for q in sq:
                    q.append(i)
            else:
                if c == GS or c == OPT:
                    st = 0
                elif not 0 <= st < nstr:
                    raise _fail(program, r, i, f"strand {st} outside 0..{nstr - 1} (header strands = {nstr})")
                s_r[i] = st
                sq[st].append(i)
        code.append(c_r)
        dur.append(d_r)
        strand.append(s_r)
        seqs.append(sq)
        alloc.append(a_r)
        free.append(f_r)
        consumers.append(by_key)

    link = [[-1] * len(p) for p in program.programs]
    ndeps = [[0] * len(p) for p in program.programs]
    recv_in = [[0] * len(p) for p in program.programs]
    consumer: list[dict[int, int]] = [{} for _ in range(W)]
    t_src: list[int] = []
    t_si: list[int] = []
    t_dst: list[int] = []
    t_ri: list[int] = []
    t_dur: list[float] = []
    t_cls: list[int] = []
    t_bytes: list[int] = []
    for key in sorted(set(sends) | set(recvs)):
        src, dst, ch = key
        ss, rs = sends.get(key, []), recvs.get(key, [])
        if len(ss) != len(rs):
            k = min(len(ss), len(rs))
            if len(ss) > k:
                raise _fail(program, src, ss[k], f"no matching RECV on rank {dst} (channel {ch} carries "
                                                 f"{len(ss)} SENDs but {len(rs)} RECVs)")
            raise _fail(program, dst, rs[k], f"no matching SEND on rank {src} (channel {ch} carries "
                                             f"{len(ss)} SENDs but {len(rs)} RECVs)")
        for si, ri in zip(ss, rs):
            s_ins, r_ins = program.programs[src][si], program.programs[dst][ri]
            if (s_ins.kind, s_ins.mb, s_ins.strand) != (r_ins.kind, r_ins.mb, r_ins.strand):
                raise _fail(program, dst, ri, f"channel {ch} FIFO pairs it with {s_ins} on rank {src}")
            key4 = (F if r_ins.kind is Kind.ACT else B, r_ins.stage, r_ins.mb, r_ins.strand)
            c = consumers[dst].get(key4)
            if c is None or c < ri:
                raise _fail(program, dst, ri, "no later F/B on this rank consumes it")
            tid = len(t_src)
            link[src][si] = link[dst][ri] = tid
            consumer[dst][ri] = c
            ndeps[dst][c] += 1
            nbytes = max(s_ins.bytes, r_ins.bytes)
            recv_in[dst][c] += nbytes
            t_src.append(src)
            t_si.append(si)
            t_dst.append(dst)
            t_ri.append(ri)
            t_dur.append(max(dur[src][si], dur[dst][ri]))
            t_cls.append(INTRA if node[src] == node[dst] else INTER)
            t_bytes.append(nbytes)
    # ---- collectives: the k-th COLL on a group / GRAD_SYNC of a bucket at every member
    c_members: list[list[tuple[int, int]]] = []
    c_dur: list[float] = []
    c_cls: list[int] = []
    for (kind, name), per_rank in sorted(issued.items()):
        if kind == "C":
            members = tuple(groups[name])
        else:
            entries = program.grad_sync[name]
            gname = entries[0].group if entries else ""
            members = tuple(groups[gname]) if gname in groups else tuple(sorted(per_rank))
        for r in per_rank:
            if r not in members:
                raise _fail(program, r, per_rank[r][0], f"rank {r} is not a member of {members}")
        counts = {m: len(per_rank.get(m, [])) for m in members}
        if len(set(counts.values())) != 1:
            short = min(members, key=lambda m: counts[m])
            full = max(members, key=lambda m: counts[m])
            k = counts[short]
            raise _fail(program, full, per_rank[full][k],
                        f"rank {short} issues only {k} such collective(s) on {name!r}, rank {full} {counts[full]}")
        for k in range(counts[members[0]]):
            mem = [(m, per_rank[m][k]) for m in members]
            cid = len(c_members)
            for m, i in mem:
                link[m][i] = cid
            c_members.append(mem)
            c_dur.append(max(dur[m][i] for m, i in mem))
            c_cls.append(INTRA if len({node[m] for m in members}) == 1 else INTER)
    return Prepared(nstr=nstr, code=code, dur=dur, strand=strand, seqs=seqs, link=link, consumer=consumer,
                    ndeps=ndeps, recv_in=recv_in, alloc=alloc, free=free, t_src=t_src, t_si=t_si, t_dst=t_dst,
                    t_ri=t_ri, t_dur=t_dur, t_cls=t_cls, t_bytes=t_bytes, c_members=c_members, c_dur=c_dur,
                    c_cls=c_cls, pair_model=pair_model)


def check_options(p2p: str, pair_oef: float | None, comm_scale: float, recv_ahead: int = 0) -> None:
    """Reject simulator options outside their meaning, naming the option."""
    if isinstance(recv_ahead, bool) or not isinstance(recv_ahead, int) or recv_ahead < 0:
        raise InvalidInputError(f"must be a non-negative integer, got {recv_ahead!r}", field="recv_ahead")
    if p2p not in ("rendezvous", "eager"):
        raise InvalidInputError(f"must be 'rendezvous' or 'eager', got {p2p!r}", field="p2p")
    if pair_oef is not None and not -1.0 <= pair_oef <= 1.0:
        raise InvalidInputError(f"must be in [-1, 1] (DHelix OEF), got {pair_oef}", field="pair_oef")
    if not comm_scale >= 0:
        raise InvalidInputError(f"must be >= 0, got {comm_scale}", field="comm_scale")
