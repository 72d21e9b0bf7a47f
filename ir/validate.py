"""Static validation of a Program (docs/program.md; checks of shared/reference/schedule_ir.md §8.7).

:func:`validate` returns findings (empty = valid) in a fixed check order, so the first finding is
the first problem a user should fix. No check executes anything; the multi-rank dry run that finds
deadlocks is :mod:`hexhelix.ir.dryrun`.

Checks, in order: ``schema`` (header consistency and references), ``complete`` (one F and one B per
(pipe, stage, micro-batch) on every rank of the stage, with the expected strand), ``order`` (LOAD and
RECV before the compute that consumes them, SEND after the producer, F before B, GRAD_SYNC after all
compute, OPT last), ``edges`` (every cross-rank boundary has the SEND/RECV pairs the TP edge rule
requires, right peer and channel), ``fifo`` (per (src, dst, channel) the sender's and the receiver's
payload sequences are equal), ``tp`` (TP peers run identical compute sequences), ``collectives``
(every group sees its collectives in one order on all members), ``strands`` (SYNC ids and PAIR
halves), ``slices`` (slice plan covers every element of every replica exactly once, groups are
exactly the holders, weights sum to one).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from fractions import Fraction

from .params import param_layout
from .program import COMPUTE_OPS, Instr, Kind, Op, Program
from .schedules import wshape_strand

__all__ = ["Finding", "format_finding", "validate"]

_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: the check that found it, where (rank, position, token; -1/"" when global), what."""

    check: str
    message: str
    rank: int = -1
    pos: int = -1
    token: str = ""


def format_finding(f: Finding) -> str:
    """One readable paragraph: ``[check] rank r, position i (token): message``."""
    where = ""
    if f.rank >= 0:
        where = f"rank {f.rank}" + (f", position {f.pos}" if f.pos >= 0 else "") + (f" ({f.token})" if f.token else "")
        where += ": "
    return f"[{f.check}] {where}{f.message}"


def _flat(prog: tuple[Instr, ...]) -> list[tuple[int, Instr]]:
    """(position, instruction) with PAIR halves expanded at the PAIR's position."""
    out = []
    for i, ins in enumerate(prog):
        if ins.op is Op.PAIR and ins.pair is not None:
            out += [(i, ins.pair[0]), (i, ins.pair[1])]
        else:
            out.append((i, ins))
    return out


# ----------------------------------------------------------------------------- schema
def _check_schema(p: Program) -> list[Finding]:
    out: list[Finding] = []
    W = p.world_size
    names = [g.name for g in p.groups]
    if len(set(names)) != len(names):
        out.append(Finding("schema", "group names are not unique"))
    for g in p.groups:
        if not g.ranks or any(not 0 <= r < W for r in g.ranks) or len(set(g.ranks)) != len(g.ranks):
            out.append(Finding("schema", f"group {g.name} has invalid ranks {list(g.ranks)} (world size {W})"))
    for i, s in enumerate(p.stages):
        if s.id != i:
            out.append(Finding("schema", f"stage at index {i} has id {s.id}; ids must equal positions"))
        if s.tp_group not in names or tuple(p.group(s.tp_group).ranks) != tuple(s.ranks):
            out.append(Finding("schema", f"stage {s.id}: TP group {s.tp_group!r} missing or not equal to its ranks"))
        if any(not 0 <= r < W for r in s.ranks):
            out.append(Finding("schema", f"stage {s.id}: rank out of range in {list(s.ranks)}"))
        if not 0 <= s.layers[0] < s.layers[1] <= p.model.layers:
            out.append(Finding("schema", f"stage {s.id}: layers [{s.layers[0]}, {s.layers[1]}) are not a non-empty "
                                         f"range of the model's {p.model.layers}"))
    listed = [s for pipe in p.pipes for s in pipe.stages]
    if sorted(listed) != list(range(len(p.stages))):
        out.append(Finding("schema", "pipes do not list every stage exactly once"))
    for pipe in p.pipes:
        if pipe.micro_batches < 1:
            out.append(Finding("schema", f"pipe {pipe.id}: micro_batches must be >= 1"))
        if any(p.stages[s].pipe != pipe.id for s in pipe.stages if 0 <= s < len(p.stages)):
            out.append(Finding("schema", f"pipe {pipe.id} lists a stage of another pipe"))
    total = sum(pipe.micro_batches for pipe in p.pipes)
    if total != p.training.num_micro_batches:   # also bounds every per-micro-batch check below
        out.append(Finding("schema", f"the pipes' micro-batches sum to {total}, not the step's "
                                     f"{p.training.num_micro_batches} (global batch / micro-batch)"))
    share = sum(pipe.batch_share for pipe in p.pipes)
    if abs(share - 1.0) > 1e-6:
        out.append(Finding("schema", f"pipe batch shares sum to {share}, not 1"))
    if out:
        return out
    owner: dict[int, tuple[int, int]] = {}
    for s in p.stages:
        for r in s.ranks:
            if owner.setdefault(r, (s.pipe, s.phys)) != (s.pipe, s.phys):
                out.append(Finding("schema", f"rank {r} is in two physical stages"))
    for r, prog in enumerate(p.programs):
        for i, ins in _flat(prog):
            tok = str(ins)
            if ins.op in (*COMPUTE_OPS, Op.LOAD, Op.SEND, Op.RECV):
                if not 0 <= ins.stage < len(p.stages) or r not in p.stages[ins.stage].ranks:
                    out.append(Finding("schema", f"refers to stage {ins.stage}, which this rank does not hold",
                                       r, i, tok))
                    continue
                st = p.stages[ins.stage]
                if ins.op in COMPUTE_OPS and ins.layer >= 0 and not st.layers[0] <= ins.layer < st.layers[1]:
                    out.append(Finding("schema", f"layer {ins.layer} is not in stage {st.id}'s layers "
                                       f"[{st.layers[0]}, {st.layers[1]})", r, i, tok))
                if not 0 <= ins.strand < p.strands:
                    out.append(Finding("schema", f"strand {ins.strand} but the program has {p.strands}", r, i, tok))
            if ins.op in (Op.SEND, Op.RECV) and (not 0 <= ins.peer < W or ins.peer == r or ins.kind is None):
                out.append(Finding("schema", f"invalid peer {ins.peer} or kind", r, i, tok))
            if ins.op is Op.GRAD_SYNC and ins.bucket not in p.grad_sync:
                out.append(Finding("schema", f"bucket {ins.bucket!r} is not in the slice plan", r, i, tok))
            if ins.op is Op.COLL and ins.group not in names:
                out.append(Finding("schema", f"group {ins.group!r} does not exist", r, i, tok))
            if ins.op is Op.PAIR and (ins.pair is None or any(x.op not in COMPUTE_OPS for x in ins.pair)):
                out.append(Finding("schema", "PAIR must hold two compute ops", r, i, tok))
            if ins.op is Op.SYNC and p.strands < 2:
                out.append(Finding("schema", "SYNC in a single-strand program", r, i, tok))
    for b, entries in p.grad_sync.items():
        for e in entries:
            if e.group not in names:
                out.append(Finding("schema", f"bucket {b}: entry {e.param} uses unknown group {e.group!r}"))
    return out


# ----------------------------------------------------------------------------- completeness & order
def _expected_strand(p: Program, stage: int, mb: int) -> int:
    if p.strands < 2:
        return 0
    pipe = p.pipes[p.stages[stage].pipe]
    nphys = len({p.stages[s].phys for s in pipe.stages})
    return wshape_strand(mb, nphys)


def _parts_ok(whole: int, parts: list[int], layers: tuple[int, int]) -> bool:
    """One whole op, or exactly one per-layer part for every layer of the stage."""
    return (whole == 1 and not parts) or (whole == 0 and sorted(parts) == list(range(*layers)))


def _check_complete(p: Program) -> list[Finding]:
    out: list[Finding] = []
    for r, prog in enumerate(p.programs):
        seen: dict[tuple[int, int], list[Instr]] = defaultdict(list)
        first_pos: dict[tuple[int, int], int] = {}
        for i, ins in _flat(prog):
            if ins.op in COMPUTE_OPS:
                seen[(ins.stage, ins.mb)].append(ins)
                first_pos.setdefault((ins.stage, ins.mb), i)
                if ins.strand != _expected_strand(p, ins.stage, ins.mb):
                    out.append(Finding("complete", f"strand {ins.strand}, expected "
                                       f"{_expected_strand(p, ins.stage, ins.mb)} for micro-batch {ins.mb}",
                                       r, i, str(ins)))
        for s in p.stages:
            if r not in s.ranks:
                continue
            for mb in range(p.pipes[s.pipe].micro_batches):
                ops = seen.pop((s.id, mb), [])
                whole = Counter(x.op for x in ops if x.layer < 0)
                parts = {o: [x.layer for x in ops if x.op is o and x.layer >= 0] for o in COMPUTE_OPS}
                if not _parts_ok(whole[Op.F], parts[Op.F], s.layers):
                    out.append(Finding("complete", f"forward F{s.id}.{mb} must run exactly once (whole, or once per "
                                       f"layer {s.layers[0]}..{s.layers[1] - 1}); found {whole[Op.F]} whole and "
                                       f"parts {parts[Op.F]}", r))
                full_b = _parts_ok(whole[Op.B], parts[Op.B], s.layers)
                split_b = _parts_ok(whole[Op.BI], parts[Op.BI], s.layers) and _parts_ok(
                    whole[Op.BW], parts[Op.BW], s.layers)
                no_b = whole[Op.B] == 0 and not parts[Op.B]
                no_split = whole[Op.BI] == whole[Op.BW] == 0 and not parts[Op.BI] and not parts[Op.BW]
                if not ((full_b and no_split) or (no_b and split_b)):
                    out.append(Finding("complete", f"stage {s.id} micro-batch {mb} needs its backward exactly once "
                                       f"(one B, or one BI and one BW); has {dict(whole)} whole, parts "
                                       f"{ {o.value: v for o, v in parts.items() if v} }", r))
        for key, ops in seen.items():
            out.append(Finding("complete", f"compute on stage {key[0]} for micro-batch {key[1]}, which is out of "
                               "range for this rank", r, first_pos[key], str(ops[0])))
    return out


def _part_role(ins: Instr, layers: tuple[int, int]) -> tuple[bool, bool, int]:
    """(first part, last part, expected predecessor layer or None) of a compute op: forwards walk
    the stage's layers ascending, backwards descending; a whole op is both first and last."""
    if ins.layer < 0:
        return True, True, -1
    lo, hi = layers
    if ins.op is Op.F:
        return ins.layer == lo, ins.layer == hi - 1, ins.layer - 1
    return ins.layer == hi - 1, ins.layer == lo, ins.layer + 1


def _check_order(p: Program) -> list[Finding]:
    out: list[Finding] = []
    prev, nxt = {}, {}
    for pipe in p.pipes:
        for a, b in zip(pipe.stages, pipe.stages[1:]):
            nxt[a], prev[b] = b, a
    for r, prog in enumerate(p.programs):
        done: set[tuple] = set()
        last_part: dict[tuple[Op, int, int], int] = {}
        last_compute = max((i for i, ins in enumerate(prog) if ins.op in (*COMPUTE_OPS, Op.PAIR)), default=-1)
        for i, ins in _flat(prog):
            tok = str(ins)
            s = p.stages[ins.stage] if 0 <= ins.stage < len(p.stages) else None
            key = (ins.stage, ins.mb)
            first, last = True, True
            if ins.op in COMPUTE_OPS and s is not None:
                first, last, pred = _part_role(ins, s.layers)
                if ins.layer >= 0 and not first and last_part.get((ins.op, *key)) != pred:
                    out.append(Finding("order", f"layer part out of order: layer {pred} of this "
                                       f"{ins.op.value}{ins.stage}.{ins.mb} must run just before it", r, i, tok))
                last_part[(ins.op, *key)] = ins.layer
            if ins.op is Op.F and s is not None and first:
                if (s.embed or s.head) and ("L", *key) not in done:
                    out.append(Finding("order", "forward of an embedding/head stage before its LOAD", r, i, tok))
                if ins.stage in prev:
                    src = prev[ins.stage]
                    need = ("F", src, ins.mb) if p.stages[src].ranks == s.ranks else ("RA", *key)
                    if need not in done:
                        what = f"F{src}.{ins.mb} (in-memory handoff)" if need[0] == "F" else \
                            f"its activation RECV (RA{ins.stage}.{ins.mb})"
                        out.append(Finding("order", f"runs before {what}; it consumes that input", r, i, tok))
            if ins.op in (Op.B, Op.BI) and s is not None:
                if ("F", *key) not in done:
                    out.append(Finding("order", f"backward before its forward F{ins.stage}.{ins.mb}", r, i, tok))
                if ins.stage in nxt and first:
                    dst = nxt[ins.stage]
                    need = ("B", dst, ins.mb) if p.stages[dst].ranks == s.ranks else ("RG", *key)
                    if need not in done:
                        what = f"B{dst}.{ins.mb} (in-memory handoff)" if need[0] == "B" else \
                            f"its gradient RECV (RG{ins.stage}.{ins.mb})"
                        out.append(Finding("order", f"runs before {what}; it consumes that gradient", r, i, tok))
            if ins.op is Op.BW and ("BI", *key) not in done:
                out.append(Finding("order", "BW before its BI", r, i, tok))
            if ins.op is Op.SEND:
                producer = ("F", *key) if ins.kind is Kind.ACT else ("B", *key)
                if producer not in done and ("BI", *key) not in done:
                    out.append(Finding("order", f"sends before the op that produces it ({producer[0]}{ins.stage}."
                                       f"{ins.mb}) ran", r, i, tok))
            if ins.op is Op.GRAD_SYNC and i < last_compute:
                out.append(Finding("order", "GRAD_SYNC before the rank's last compute op", r, i, tok))
            if ins.op is Op.OPT and i != len(prog) - 1:
                out.append(Finding("order", "OPT must be the last instruction", r, i, tok))
            tag = {Op.LOAD: "L", Op.F: "F", Op.B: "B", Op.BI: "BI", Op.BW: "BW"}.get(ins.op)
            if ins.op is Op.RECV:
                tag = "RA" if ins.kind is Kind.ACT else "RG"
            if tag and last:
                done.add((tag, *key))
                if ins.op is Op.B:
                    done.add(("BI", *key))
        if sum(1 for ins in prog if ins.op is Op.OPT) != 1:
            out.append(Finding("order", "needs exactly one OPT", r))
    return out


# ----------------------------------------------------------------------------- edges & FIFO
def _expected_messages(p: Program) -> list[tuple[int, int, Kind, int, int, int, int, int]]:
    """(src, dst, kind, send stage, recv stage, mb, strand, ch) of every message the TP edge rule
    (docs/program.md §5) requires."""
    from .lower import channel_map

    ch = channel_map(p)
    out = []
    for pipe in p.pipes:
        for a, b in zip(pipe.stages, pipe.stages[1:]):
            sa, sb = p.stages[a], p.stages[b]
            if sa.ranks == sb.ranks:
                continue
            for mb in range(pipe.micro_batches):
                st = _expected_strand(p, a, mb)
                for j, dst in enumerate(sb.ranks):
                    out.append((sa.ranks[j % len(sa.ranks)], dst, Kind.ACT, a, b, mb, st, ch[(a, Kind.ACT, st)]))
                for i, dst in enumerate(sa.ranks):
                    out.append((sb.ranks[i % len(sb.ranks)], dst, Kind.GRAD, b, a, mb, st, ch[(a, Kind.GRAD, st)]))
    return out


def _check_edges(p: Program) -> list[Finding]:
    out: list[Finding] = []
    exp_recv: dict[tuple, tuple[int, int]] = {}
    exp_send: dict[tuple, int] = {}
    for src, dst, kind, s_send, s_recv, mb, st, ch in _expected_messages(p):
        exp_recv[(dst, kind, s_recv, mb, st)] = (src, ch)
        exp_send[(src, dst, kind, s_send, mb, st)] = ch
    got_recv: set[tuple] = set()
    got_send: set[tuple] = set()
    for r, prog in enumerate(p.programs):
        for i, ins in enumerate(prog):
            if ins.op is Op.RECV:
                key = (r, ins.kind, ins.stage, ins.mb, ins.strand)
                want = exp_recv.get(key)
                if want is None:
                    out.append(Finding("edges", "receives a tensor no stage boundary produces for this rank",
                                       r, i, str(ins)))
                elif key in got_recv:
                    out.append(Finding("edges", "duplicate receive", r, i, str(ins)))
                elif want != (ins.peer, ins.ch):
                    out.append(Finding("edges", f"waits for rank {ins.peer} on channel {ins.ch}, but the edge rule "
                                       f"sends it from rank {want[0]} on channel {want[1]}", r, i, str(ins)))
                got_recv.add(key)
            elif ins.op is Op.SEND:
                key = (r, ins.peer, ins.kind, ins.stage, ins.mb, ins.strand)
                want_ch = exp_send.get(key)
                if want_ch is None:
                    out.append(Finding("edges", f"sends to rank {ins.peer}, which does not receive this tensor from "
                                       "this rank under the edge rule", r, i, str(ins)))
                elif key in got_send:
                    out.append(Finding("edges", "duplicate send", r, i, str(ins)))
                elif want_ch != ins.ch:
                    out.append(Finding("edges", f"uses channel {ins.ch}, the edge's channel is {want_ch}",
                                       r, i, str(ins)))
                got_send.add(key)
    for (dst, kind, stage, mb, st), (src, ch) in exp_recv.items():
        if (dst, kind, stage, mb, st) not in got_recv:
            k = "A" if kind is Kind.ACT else "G"
            out.append(Finding("edges", f"missing R{k}{stage}.{mb}{f'@{st}' if st else ''}<{src}#{ch}: nothing "
                               f"receives the {kind.value} that rank {src} must send for micro-batch {mb}", dst))
    for (src, dst, kind, stage, mb, st), ch in exp_send.items():
        if (src, dst, kind, stage, mb, st) not in got_send:
            k = "A" if kind is Kind.ACT else "G"
            out.append(Finding("edges", f"missing S{k}{stage}.{mb}{f'@{st}' if st else ''}>{dst}#{ch}: rank {dst} "
                               "needs this tensor", src))
    return out


def _check_fifo(p: Program) -> list[Finding]:
    out: list[Finding] = []
    sends: dict[tuple[int, int, int], list[tuple]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[tuple]] = defaultdict(list)
    for r, prog in enumerate(p.programs):
        for i, ins in enumerate(prog):
            payload = (ins.kind, ins.mb, ins.strand, ins.bytes)
            if ins.op is Op.SEND:
                sends[(r, ins.peer, ins.ch)].append((*payload, i, str(ins)))
            elif ins.op is Op.RECV:
                recvs[(ins.peer, r, ins.ch)].append((*payload, i, str(ins)))
    for key in sorted(set(sends) | set(recvs)):
        src, dst, ch = key
        ss, rr = sends.get(key, []), recvs.get(key, [])
        for k in range(max(len(ss), len(rr))):
            if k >= len(ss):
                out.append(Finding("fifo", f"message #{k} on channel {ch} from rank {src} is never sent "
                                   f"(rank {src} sends only {len(ss)} on this channel)", dst, rr[k][4], rr[k][5]))
                break
            if k >= len(rr):
                out.append(Finding("fifo", f"message #{k} to rank {dst} on channel {ch} is never received "
                                   f"(rank {dst} receives only {len(rr)} on this channel)", src, ss[k][4], ss[k][5]))
                break
            if ss[k][:4] != rr[k][:4]:
                out.append(Finding("fifo", f"message #{k} on channel {ch} from rank {src} is {ss[k][5]} "
                                   f"(position {ss[k][4]} there), not what this RECV expects", dst, rr[k][4], rr[k][5]))
                break
    return out


# ----------------------------------------------------------------------------- TP, collectives, strands
def _check_tp(p: Program) -> list[Finding]:
    out: list[Finding] = []
    keep = (*COMPUTE_OPS, Op.LOAD, Op.PAIR, Op.SYNC, Op.OPT)
    done_groups = set()
    for s in p.stages:
        if s.tp_group in done_groups or len(s.ranks) < 2:
            continue
        done_groups.add(s.tp_group)
        proj = {r: [(i, str(ins.stripped())) for i, ins in enumerate(p.programs[r]) if ins.op in keep]
                for r in s.ranks}
        ref = proj[s.ranks[0]]
        for r in s.ranks[1:]:
            for k in range(max(len(ref), len(proj[r]))):
                a = ref[k][1] if k < len(ref) else "<end>"
                b = proj[r][k] if k < len(proj[r]) else (-1, "<end>")
                if a != b[1]:
                    out.append(Finding("tp", f"TP peers of {s.tp_group} diverge: compute op #{k} is {b[1]} here but "
                                       f"{a} on rank {s.ranks[0]}", r, b[0], b[1]))
                    break
    return out


def _check_collectives(p: Program) -> list[Finding]:
    out: list[Finding] = []
    bucket_group = {b: es[0].group for b, es in p.grad_sync.items() if es}
    for b, es in p.grad_sync.items():
        if len({e.group for e in es}) != 1:
            out.append(Finding("collectives", f"bucket {b} mixes groups {sorted({e.group for e in es})}"))
    seqs: dict[str, dict[int, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    for r, prog in enumerate(p.programs):
        for i, ins in enumerate(prog):
            g = bucket_group.get(ins.bucket) if ins.op is Op.GRAD_SYNC else ins.group if ins.op is Op.COLL else None
            if g is None:
                continue
            if r not in p.group(g).ranks:
                out.append(Finding("collectives", f"issues a collective on group {g}, which it is not a member of",
                                   r, i, str(ins)))
            seqs[g][r].append((i, str(ins.stripped())))
    for b, g in bucket_group.items():
        for r in p.group(g).ranks:
            n = sum(1 for _, t in seqs[g][r] if t == f"GS:{b}")
            if n != 1:
                out.append(Finding("collectives", f"must issue GS:{b} (group {g}) exactly once, issues it {n} times", r))
    for g, per in seqs.items():
        members = p.group(g).ranks
        ref_rank = members[0]
        ref = [t for _, t in per.get(ref_rank, [])]
        for r in members[1:]:
            mine = per.get(r, [])
            toks = [t for _, t in mine]
            if toks != ref:
                k = next(k for k in range(max(len(ref), len(toks)))
                         if k >= len(ref) or k >= len(toks) or ref[k] != toks[k])
                pos, tok = mine[k] if k < len(mine) else (-1, "<end>")
                want = ref[k] if k < len(ref) else "<end>"
                out.append(Finding("collectives", f"collective #{k} on group {g} is {tok} here but {want} on rank "
                                   f"{ref_rank}; members must issue one order", r, pos, tok))
    return out


def _check_strands(p: Program) -> list[Finding]:
    if p.strands < 2:
        return []
    out: list[Finding] = []
    for r, prog in enumerate(p.programs):
        expect = 0
        open_at = -1
        for i, ins in enumerate(prog):
            if ins.op is Op.SYNC:
                if ins.sync != expect:
                    out.append(Finding("strands", f"strand barrier ids must run 0, 1, 2, ...; expected SYNC:{expect}"
                                       + (f" (SYNC:{expect} is missing)" if ins.sync > expect else ""), r, i, str(ins)))
                    break
                expect += 1
                open_at = -1
            elif ins.op in (*COMPUTE_OPS, Op.PAIR, Op.GRAD_SYNC, Op.OPT):
                if open_at >= 0:
                    out.append(Finding("strands", f"the tick of {prog[open_at]} (position {open_at}) is not closed "
                                       "by a SYNC before this op; both strands must meet between ticks", r, i, str(ins)))
                    break
                if ins.op in (*COMPUTE_OPS, Op.PAIR):
                    open_at = i
            if ins.op is Op.PAIR and ins.pair is not None and ins.pair[0].strand == ins.pair[1].strand:
                out.append(Finding("strands", "PAIR halves must belong to different strands", r, i, str(ins)))
    return out


# ----------------------------------------------------------------------------- slice plan
def _check_slices(p: Program) -> list[Finding]:
    out: list[Finding] = []
    specs = {s.name: s for s in param_layout(p.model)}
    share = {pipe.id: pipe.batch_share for pipe in p.pipes}
    entries: dict[str, list] = defaultdict(list)
    for b, es in p.grad_sync.items():
        for e in es:
            if e.param not in specs:
                out.append(Finding("slices", f"bucket {b}: unknown parameter {e.param!r}"))
            else:
                entries[e.param].append((b, e))
    for name, spec in specs.items():
        dim = spec.shard_dim if spec.shard_dim is not None else 0
        n = spec.shape[dim]
        shards: dict[int, tuple[int, int, int]] = {}  # rank -> (lo, hi, pipe)
        for pipe in p.pipes:
            for sid in pipe.stages:
                s = p.stages[sid]
                holds = (spec.unit == "embedding" and s.embed) or (spec.unit == "head" and s.head) or (
                    spec.unit.startswith("layer.") and s.layers[0] <= int(spec.unit[6:]) < s.layers[1])
                if not holds:
                    continue
                t = len(s.ranks)
                for j, r in enumerate(s.ranks):
                    lo, hi = (Fraction(j * n, t), Fraction((j + 1) * n, t)) if spec.shard_dim is not None else (0, n)
                    shards[r] = (int(lo), int(hi), pipe.id)
        covered: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for b, e in entries.get(name, []):
            members = p.group(e.group).ranks
            where = f"bucket {b}: {name}[{e.lo}:{e.hi}] on dim {e.dim}"
            if e.dim != dim or not 0 <= e.lo < e.hi <= n:
                out.append(Finding("slices", f"{where}: must be a range of dim {dim} within [0, {n})"))
                continue
            holders = sorted(r for r, (lo, hi, _) in shards.items() if lo < e.hi and e.lo < hi)
            if sorted(members) != holders:
                out.append(Finding("slices", f"{where}: group {e.group} is {sorted(members)}, but the ranks holding "
                                   f"these elements are {holders}"))
                continue
            if any(not (shards[r][0] <= e.lo and e.hi <= shards[r][1]) for r in members):
                out.append(Finding("slices", f"{where}: crosses a shard boundary of a member"))
            if len(e.weights) != len(members) or abs(sum(e.weights) - 1.0) > _TOL:
                out.append(Finding("slices", f"{where}: weights {list(e.weights)} must give one weight per member "
                                   "and sum to 1"))
            else:
                per_pipe: dict[int, float] = defaultdict(float)
                for r, w in zip(members, e.weights):
                    per_pipe[shards[r][2]] += w
                bad = [q for q, w in per_pipe.items() if abs(w - share[q]) > _TOL]
                if bad:
                    out.append(Finding("slices", f"{where}: pipe {bad[0]} contributes weight {per_pipe[bad[0]]}, "
                                       f"its batch share is {share[bad[0]]}"))
            for r in members:
                covered[r].append((e.lo, e.hi))
        for r, (lo, hi, _) in sorted(shards.items()):
            pieces = sorted(covered.get(r, []))
            pos = lo
            for a, b in pieces:
                if a != pos:
                    break
                pos = b
            if pos != hi or len(pieces) != len(set(pieces)):
                gap = f"elements from {pos}" if pos != hi else "overlapping entries"
                out.append(Finding("slices", f"{name} (dim {dim}, rank {r} holds [{lo}, {hi})): {gap} not covered "
                                   "exactly once by the slice plan", r))
    return out


_CHECKS = (("schema", _check_schema), ("complete", _check_complete), ("order", _check_order),
           ("edges", _check_edges), ("fifo", _check_fifo), ("tp", _check_tp), ("collectives", _check_collectives),
           ("strands", _check_strands), ("slices", _check_slices))


def validate(program: Program, *, stop_early: bool = True) -> list[Finding]:
    """All static findings of ``program`` (empty list: valid), first problem first.

    With ``stop_early`` the checks stop after the first check family that reports (later checks
    would mostly repeat its consequences); the schema check always stops further checks."""
    found: list[Finding] = []
    for name, check in _CHECKS:
        f = check(program)
        found += f
        if f and (stop_early or name == "schema"):
            break
    return found
