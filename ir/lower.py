"""Lowering: from per-pipeline compute orders to self-contained per-rank programs.

Every pass is a pure function ``Program -> Program`` (no I/O, no globals); :func:`lower` applies
them in the one order written down there. The semantics of what they emit are specified in
docs/program.md; the shape of the passes follows PyTorch pipelining's lowering (compute-only
order → comms inserted by the producer/consumer rule, shared/reference/schedule_ir.md §1.4) with
explicit peers, channels, groups and a gradient-sync slice plan (§8.3–8.4).

Passes, in order:

1. :func:`build_skeleton` — header (pipes, virtual stages, TP groups) and the compute-only order
   of every rank (a co-executed W-shape tick is one ``PAIR``).
2. :func:`add_send_recv` — LOAD before data-reading forwards, RECV before the consumer, SEND after
   the producer, for every cross-rank virtual-stage edge, TP degrees possibly different.
3. :func:`pair_strands` — W-shape: optional per-layer PAIR expansion (:func:`layer_pairs`), then
   strand barriers (``SYNC`` after every tick).
3b. :func:`prepost_recvs` — every RECV posted ``recv_ahead`` compute ops before its consumer, so a
   rendezvous transfer can start while the receiver still computes (docs/program.md §4).
4. :func:`add_grad_sync` — slice plan + DP groups + ``GRAD_SYNC`` per bucket.
5. :func:`add_opt` — the optimizer step, last.
6. :func:`annotate` — per-op ``dur``/``bytes`` from an :class:`Estimator` (the cost model lives in
   hexhelix.solver; ``ir`` only receives numbers).
7. :func:`order_grad_sync` — the global bucket order (greedy list scheduling on the estimates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .errors import InvalidInputError, UnsupportedError
from .model import ModelConfig, TrainingConfig
from .params import param_layout
from .program import GroupInfo, Instr, Kind, Op, PipeInfo, Program, RankInfo, SliceEntry, StageInfo
from .schedules import fold_layers, num_strands, pipeline_order, stage_positions
from .slices import cut_unit

__all__ = [
    "Estimator",
    "NullEstimator",
    "PipeLayout",
    "add_grad_sync",
    "add_opt",
    "add_send_recv",
    "annotate",
    "build_skeleton",
    "channel_map",
    "layer_pairs",
    "lower",
    "order_grad_sync",
    "pair_strands",
    "prepost_recvs",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeLayout:
    """What lowering needs of one pipeline: micro-batches and, per physical stage, its ranks (TP
    order) and its plan layer range [lo, hi)."""

    micro_batches: int
    ranks: tuple[tuple[int, ...], ...]
    layers: tuple[tuple[int, int], ...]


class Estimator(Protocol):
    """Per-op estimates (seconds, bytes) for :func:`annotate`; implemented by hexhelix.solver.compile."""

    def compute(self, stage: StageInfo, op: Op) -> tuple[float, int]:
        """(seconds, activation bytes kept/freed) of F or B of one micro-batch on ``stage``."""
        ...

    def compute_layer(self, stage: StageInfo, op: Op, layer: int) -> tuple[float, int]:
        """Same for one layer of ``stage`` (per-layer PAIR expansion): the embedding rides on the
        stage's first layer, norm/head/loss on its last."""
        ...

    def boundary_bytes(self) -> int:
        """Bytes of one boundary tensor (activation or its gradient) between stages."""
        ...

    def p2p(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds to send ``nbytes`` from rank ``src`` to rank ``dst``."""
        ...

    def allreduce(self, ranks: tuple[int, ...], elements: int) -> tuple[float, int]:
        """(seconds, bytes) of a SUM all-reduce of ``elements`` gradient elements over ``ranks``."""
        ...

    def optimizer(self, rank: int, program: Program) -> float:
        """Seconds of the optimizer step on ``rank``."""
        ...

    def pair(self, a: Instr, b: Instr, stage: StageInfo) -> float:
        """Seconds of co-executing annotated compute ops ``a`` and ``b`` on ``stage``'s ranks."""
        ...


class NullEstimator:
    """All estimates zero: structure-only programs (tests, tools that need no cost model)."""

    def compute(self, stage: StageInfo, op: Op) -> tuple[float, int]:
        return 0.0, 0

    def compute_layer(self, stage: StageInfo, op: Op, layer: int) -> tuple[float, int]:
        return 0.0, 0

    def boundary_bytes(self) -> int:
        return 0

    def p2p(self, src: int, dst: int, nbytes: int) -> float:
        return 0.0

    def allreduce(self, ranks: tuple[int, ...], elements: int) -> tuple[float, int]:
        return 0.0, 0

    def optimizer(self, rank: int, program: Program) -> float:
        return 0.0

    def pair(self, a: Instr, b: Instr, stage: StageInfo) -> float:
        return a.dur + b.dur


def tp_group_name(pipe: int, phys: int) -> str:
    """Name of the TP group of physical stage ``phys`` of pipeline ``pipe`` (docs/program.md §3)."""
    return f"tp.p{pipe}.s{phys}"


# ----------------------------------------------------------------------------- 1. skeleton
def _virtual_layers(schedule: str, layout: PipeLayout, num_layers: int) -> dict[int, tuple[int, int]]:
    """Data-flow position -> layer range of one pipeline's virtual stages."""
    P = len(layout.ranks)
    if schedule != "wshape":
        return dict(enumerate(layout.layers))
    folded = fold_layers([hi - lo for lo, hi in layout.layers], num_layers)
    out = {}
    for k, (down, up) in enumerate(folded):
        out[k], out[2 * P - 1 - k] = down, up
    return out


def build_skeleton(*, schedule: str, model: ModelConfig, training: TrainingConfig,
                   pipes: Sequence[PipeLayout], ranks: Sequence[RankInfo],
                   meta: Mapping[str, Any] | None = None) -> Program:
    """Header and compute-only per-rank orders (pass 1)."""
    strands = num_strands(schedule)
    world = len(ranks)
    total_mb = sum(p.micro_batches for p in pipes)
    stages: list[StageInfo] = []
    pipe_infos: list[PipeInfo] = []
    groups: list[GroupInfo] = []
    programs: list[list[Instr]] = [[] for _ in range(world)]
    for p, layout in enumerate(pipes):
        P = len(layout.ranks)
        positions = stage_positions(schedule, P)
        vlayers = _virtual_layers(schedule, layout, model.layers)
        base = len(stages)
        npos = sum(len(x) for x in positions)
        phys_of = {pos: k for k, poss in enumerate(positions) for pos in poss}
        for pos in range(npos):
            k = phys_of[pos]
            leg = "" if schedule != "wshape" else ("down" if pos < P else "up")
            stages.append(StageInfo(id=base + pos, pipe=p, phys=k, layers=vlayers[pos], ranks=layout.ranks[k],
                                    tp_group=tp_group_name(p, k), embed=pos == 0, head=pos == npos - 1, leg=leg))
        for k, rk in enumerate(layout.ranks):
            groups.append(GroupInfo(name=tp_group_name(p, k), ranks=tuple(rk)))
        pipe_infos.append(PipeInfo(id=p, stages=tuple(range(base, base + npos)), micro_batches=layout.micro_batches,
                                   batch_share=layout.micro_batches / total_mb))
        if model.tie_embeddings and set(layout.ranks[0]) != set(stages[-1].ranks):
            raise UnsupportedError("tied embeddings need the embedding and the head on the same ranks "
                                   "(use wshape or a single-stage pipeline)")
        for k, order in enumerate(pipeline_order(schedule, P, layout.micro_batches)):
            instrs = []
            for tick in order:
                ops = [Instr(op=c.op, stage=base + c.pos, mb=c.mb, strand=c.strand) for c in tick.ops]
                instrs.append(ops[0] if len(ops) == 1 else Instr(op=Op.PAIR, pair=(ops[0], ops[1])))
            for r in layout.ranks[k]:
                programs[r] = list(instrs)
    return Program(world_size=world, strands=strands, schedule=schedule, model=model, training=training,
                   pipes=tuple(pipe_infos), stages=tuple(stages), groups=tuple(groups), grad_sync={},
                   ranks=tuple(ranks), programs=tuple(tuple(p) for p in programs), meta=dict(meta or {}))


# ----------------------------------------------------------------------------- 2. send / recv
def channel_map(program: Program) -> dict[tuple[int, Kind, int], int]:
    """(producer virtual stage, kind, strand) -> channel id for every cross-rank edge, numbered in
    pipe order, edge order, act before grad, strand 0 before 1 (docs/program.md §5)."""
    out: dict[tuple[int, Kind, int], int] = {}
    for pipe in program.pipes:
        for a, b in zip(pipe.stages, pipe.stages[1:]):
            if program.stages[a].ranks == program.stages[b].ranks:
                continue
            for kind in (Kind.ACT, Kind.GRAD):
                for st in range(program.strands):
                    out[(a, kind, st)] = len(out)
    return out


def _neighbours(program: Program) -> tuple[dict[int, int], dict[int, int]]:
    prev, nxt = {}, {}
    for pipe in program.pipes:
        for a, b in zip(pipe.stages, pipe.stages[1:]):
            nxt[a], prev[b] = b, a
    return prev, nxt


def _comms_for(program: Program, rank: int, c: Instr, prev: dict[int, int], nxt: dict[int, int],
               ch: dict[tuple[int, Kind, int], int]) -> tuple[list[Instr], list[Instr]]:
    """(instructions before, instructions after) compute op ``c`` on ``rank``."""
    s = program.stages[c.stage]
    j = s.ranks.index(rank)
    before: list[Instr] = []
    after: list[Instr] = []
    common = {"mb": c.mb, "strand": c.strand}
    if c.op is Op.F:
        if c.stage in prev and program.stages[prev[c.stage]].ranks != s.ranks:
            src = program.stages[prev[c.stage]]
            before.append(Instr(op=Op.RECV, kind=Kind.ACT, stage=s.id, peer=src.ranks[j % len(src.ranks)],
                                ch=ch[(src.id, Kind.ACT, c.strand)], **common))
        if s.embed or s.head:
            before.append(Instr(op=Op.LOAD, stage=s.id, **common))
        if c.stage in nxt and program.stages[nxt[c.stage]].ranks != s.ranks:
            dst = program.stages[nxt[c.stage]]
            after += [Instr(op=Op.SEND, kind=Kind.ACT, stage=s.id, peer=dst.ranks[jj],
                            ch=ch[(s.id, Kind.ACT, c.strand)], **common)
                      for jj in range(len(dst.ranks)) if jj % len(s.ranks) == j]
    elif c.op in (Op.B, Op.BI):
        if c.stage in nxt and program.stages[nxt[c.stage]].ranks != s.ranks:
            src = program.stages[nxt[c.stage]]
            before.append(Instr(op=Op.RECV, kind=Kind.GRAD, stage=s.id, peer=src.ranks[j % len(src.ranks)],
                                ch=ch[(s.id, Kind.GRAD, c.strand)], **common))
        if c.stage in prev and program.stages[prev[c.stage]].ranks != s.ranks:
            dst = program.stages[prev[c.stage]]
            after += [Instr(op=Op.SEND, kind=Kind.GRAD, stage=s.id, peer=dst.ranks[jj],
                            ch=ch[(dst.id, Kind.GRAD, c.strand)], **common)
                      for jj in range(len(dst.ranks)) if jj % len(s.ranks) == j]
    return before, after


def add_send_recv(program: Program) -> Program:
    """Insert LOAD/RECV before and SEND after each compute op (pass 2, docs/program.md §5).

    Receiver TP rank j of a stage receives from sender TP rank ``j mod p`` (p = sender's TP
    degree) in both directions, so every rank that ran a forward gets the gradient it needs.
    Consecutive virtual stages on the same ranks hand over in memory.
    """
    ch = channel_map(program)
    prev, nxt = _neighbours(program)
    out = []
    for rank, prog in enumerate(program.programs):
        new: list[Instr] = []
        for ins in prog:
            ops = list(ins.pair) if ins.op is Op.PAIR and ins.pair else [ins]
            if ins.op not in (Op.PAIR, Op.F, Op.B, Op.BI):
                new.append(ins)
                continue
            parts = [_comms_for(program, rank, c, prev, nxt, ch) for c in ops]
            new += [i for b, _ in parts for i in b]
            new.append(ins)
            new += [i for _, a in parts for i in a]
        out.append(tuple(new))
    return replace(program, programs=tuple(out))


# ----------------------------------------------------------------------------- 3. strands
def layer_pairs(program: Program, pair: Instr) -> list[Instr]:
    """Expand ``PAIR(F a, B b)`` per layer pair (DHelix §3.2): the forward walks ``a``'s layers
    ascending, the backward walks ``b``'s layers descending; the i-th layers of the two walks are
    co-executed as ``PAIR(F a[l], B b[l'])``, a leftover layer (legs of unequal length) runs alone."""
    assert pair.pair is not None
    fa, bb = pair.pair
    lf = list(range(*program.stages[fa.stage].layers))
    lb = list(reversed(range(*program.stages[bb.stage].layers)))
    out = []
    for i in range(max(len(lf), len(lb))):
        f = replace(fa, layer=lf[i]) if i < len(lf) else None
        b = replace(bb, layer=lb[i]) if i < len(lb) else None
        if f is not None and b is not None:
            out.append(replace(pair, pair=(f, b)))
        else:
            out.append(f or b)
    return out


def pair_strands(program: Program, per_layer: bool = False) -> Program:
    """W-shape strand barriers (pass 3, docs/program.md §7). With ``per_layer`` every
    ``PAIR(F, B)`` is first expanded by :func:`layer_pairs`. Then a ``SYNC:k`` closes every tick
    (after the tick's SENDs; each layer pair of an expanded PAIR is its own tick), k counting ticks
    per rank. No-op for single-strand programs."""
    if program.strands < 2:
        return program
    out = []
    for prog in program.programs:
        expanded: list[Instr] = []
        for ins in prog:
            expanded += layer_pairs(program, ins) if per_layer and ins.op is Op.PAIR else [ins]
        new: list[Instr] = []
        k = 0
        open_tick = False
        for ins in expanded:
            if open_tick and ins.op is not Op.SEND:
                new.append(Instr(op=Op.SYNC, sync=k))
                k += 1
                open_tick = False
            new.append(ins)
            if ins.op in (Op.PAIR, Op.F, Op.B, Op.BI, Op.BW):
                open_tick = True
        if open_tick:
            new.append(Instr(op=Op.SYNC, sync=k))
        out.append(tuple(new))
    return replace(program, programs=tuple(out))


# ----------------------------------------------------------------------------- 3b. pre-posted receives
_COMPUTE = (Op.F, Op.B, Op.BI, Op.BW, Op.PAIR)


def prepost_recvs(program: Program, ahead: int = 1) -> Program:
    """Post every RECV ``ahead`` compute ops before its consumer (pass 3b, docs/program.md §4).

    :func:`add_send_recv` puts each RECV right before the compute op that consumes it. A RECV is a
    non-blocking post (``irecv``); its consumer waits for the data. Under rendezvous point-to-point
    (gloo and NCCL for large messages, the simulator's default) a transfer starts only once both
    ends are posted, so a RECV posted at its consumer makes the receiver wait out the whole
    transfer: the 1F1B period of an interior stage becomes f + b + 4c where the cost model
    (``solver.evaluate``) charges f + b + 2c. Posted one compute op earlier, the transfer runs
    under that op.

    Parameters
    ----------
    program
        any program; only the positions of its RECVs change.
    ahead
        how many compute ops (F/B/BI/BW/PAIR, a per-layer PAIR part counting as one) before its
        consumer each RECV is posted: the RECV moves right in front of the ``ahead``-th compute op
        before it on its rank (to the start of the list when there are fewer). 0 returns
        ``program`` unchanged (RECV right before its consumer).

    Returns
    -------
    Program
        the same instructions on every rank; RECVs keep their relative order (so per-channel FIFO
        matching is unchanged) and still precede their consumers; every other instruction keeps
        its relative order. Apply it once (a second application moves RECVs further).

    Raises
    ------
    InvalidInputError
        ``ahead`` is not a non-negative integer.
    """
    if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 0:
        raise InvalidInputError(f"must be a non-negative integer, got {ahead!r}", field="recv_ahead")
    if ahead == 0:
        return program
    progs = []
    for prog in program.programs:
        seen: list[int] = []  # positions of the compute ops met so far
        keys: list[tuple[float, int]] = []
        for k, ins in enumerate(prog):
            if ins.op is Op.RECV:  # just in front of the ahead-th compute op before it
                keys.append((seen[-ahead] - 0.5 if len(seen) >= ahead else -0.5, k))
            else:
                keys.append((float(k), k))
            if ins.op in _COMPUTE:
                seen.append(k)
        order = sorted(range(len(prog)), key=keys.__getitem__)
        progs.append(tuple(prog[k] for k in order))
    return replace(program, programs=tuple(progs))


# ----------------------------------------------------------------------------- 4. gradient sync
def _unit_holders(program: Program, unit: str) -> list[StageInfo]:
    """Per pipeline, the virtual stage holding parameter unit ``unit``."""
    out = []
    for pipe in program.pipes:
        sts = [program.stages[s] for s in pipe.stages]
        if unit == "embedding":
            out.append(next(s for s in sts if s.embed))
        elif unit == "head":
            out.append(next(s for s in sts if s.head))
        else:
            i = int(unit.split(".")[1])
            out.append(next(s for s in sts if s.layers[0] <= i < s.layers[1]))
    return out


def slice_plan(program: Program) -> list[SliceEntry]:
    """Every parameter cut at the union of its holders' shard boundaries; each piece all-reduced
    over exactly its holders, weighted by batch share (docs/program.md §6)."""
    model = program.model
    share = {p.id: p.batch_share for p in program.pipes}
    entries: list[SliceEntry] = []
    by_unit: dict[str, list] = {}
    for spec in param_layout(model):
        by_unit.setdefault(spec.unit, []).append(spec)
    for unit, specs in by_unit.items():
        holders = _unit_holders(program, unit)
        pieces = cut_unit(unit, [h.ranks for h in holders])
        for spec in specs:
            if spec.shard_dim is None:
                ranks = sorted(r for h in holders for r in h.ranks)
                w = {r: share[h.pipe] / len(h.ranks) for h in holders for r in h.ranks}
                entries.append(SliceEntry(param=spec.name, dim=0, lo=0, hi=spec.shape[0],
                                          group=_dp_name(ranks), weights=tuple(w[r] for r in ranks)))
                continue
            n = spec.shape[spec.shard_dim]
            for piece in pieces:
                lo, hi = piece.lo * n, piece.hi * n
                if lo.denominator != 1 or hi.denominator != 1:
                    raise UnsupportedError(f"{spec.name}: dim {spec.shard_dim} of size {n} cannot be split into "
                                           f"the TP shards {[len(h.ranks) for h in holders]}")
                pipe_of = {r: h.pipe for h in holders for r in h.ranks}
                ranks = sorted(piece.gpus)
                entries.append(SliceEntry(param=spec.name, dim=spec.shard_dim, lo=int(lo), hi=int(hi),
                                          group=_dp_name(ranks), weights=tuple(share[pipe_of[r]] for r in ranks)))
    return entries


def _dp_name(ranks: Sequence[int]) -> str:
    return "dp." + "-".join(str(r) for r in ranks)


def add_grad_sync(program: Program) -> Program:
    """Slice plan into buckets (one per group, first-appearance order), DP groups appended to the
    header, and ``GRAD_SYNC`` of each bucket on each member in ascending bucket order (pass 4)."""
    buckets: dict[str, list[SliceEntry]] = {}
    for e in slice_plan(program):
        buckets.setdefault(e.group, []).append(e)
    names = {g: f"b{i}" for i, g in enumerate(buckets)}
    groups = list(program.groups) + [GroupInfo(name=g, ranks=tuple(int(x) for x in g[3:].split("-")))
                                     for g in buckets]
    per_rank: list[list[Instr]] = [list(p) for p in program.programs]
    for g, _entries in buckets.items():
        for r in (int(x) for x in g[3:].split("-")):
            per_rank[r].append(Instr(op=Op.GRAD_SYNC, bucket=names[g]))
    return replace(program, groups=tuple(groups),
                   grad_sync={names[g]: tuple(es) for g, es in buckets.items()},
                   programs=tuple(tuple(p) for p in per_rank))


# ----------------------------------------------------------------------------- 5. optimizer
def add_opt(program: Program) -> Program:
    """Append the optimizer step as every rank's last instruction (pass 5)."""
    return replace(program, programs=tuple((*tuple(p), Instr(op=Op.OPT)) for p in program.programs))


# ----------------------------------------------------------------------------- 6. estimates
def annotate(program: Program, est: Estimator) -> Program:
    """Fill ``dur``/``bytes`` of every instruction from ``est`` (pass 6, docs/program.md §4)."""
    nbytes = est.boundary_bytes()
    numel = {s.name: s.numel for s in param_layout(program.model)}
    sizes = {s.name: s.shape for s in param_layout(program.model)}

    def entry_elems(e: SliceEntry) -> int:
        return numel[e.param] // sizes[e.param][e.dim] * (e.hi - e.lo)

    # a bucket is all-reduced as one concatenated buffer
    gs = {b: est.allreduce(program.group(es[0].group).ranks, sum(entry_elems(e) for e in es))
          for b, es in program.grad_sync.items()}

    compute: dict[tuple[int, Op, int], tuple[float, int]] = {}  # estimates are pure: ask once per key
    p2p: dict[tuple[int, int], float] = {}

    def one(rank: int, ins: Instr) -> Instr:
        match ins.op:
            case Op.F | Op.B | Op.BI | Op.BW:
                key = (ins.stage, ins.op, ins.layer)
                if key not in compute:
                    st = program.stages[ins.stage]
                    compute[key] = est.compute(st, ins.op) if ins.layer < 0 else est.compute_layer(st, ins.op,
                                                                                                   ins.layer)
                dur, byt = compute[key]
                return replace(ins, dur=dur, bytes=byt)
            case Op.SEND:
                if (rank, ins.peer) not in p2p:
                    p2p[(rank, ins.peer)] = est.p2p(rank, ins.peer, nbytes)
                return replace(ins, dur=p2p[(rank, ins.peer)], bytes=nbytes)
            case Op.RECV:
                return replace(ins, bytes=nbytes)
            case Op.GRAD_SYNC:
                return replace(ins, dur=gs[ins.bucket][0], bytes=gs[ins.bucket][1])
            case Op.OPT:
                return replace(ins, dur=est.optimizer(rank, program))
            case Op.PAIR:
                assert ins.pair is not None
                a, b = one(rank, ins.pair[0]), one(rank, ins.pair[1])
                return replace(ins, pair=(a, b), dur=est.pair(a, b, program.stages[a.stage]))
        return ins

    return replace(program, programs=tuple(tuple(one(r, i) for i in prog) for r, prog in enumerate(program.programs)))


# ----------------------------------------------------------------------------- 7. bucket order
def order_grad_sync(program: Program) -> Program:
    """Choose the one global bucket order every rank follows (pass 7, after :func:`annotate`).

    Any single global order is deadlock-free; a bad one chains collectives that share a member.
    Greedy list scheduling: each rank is ready when its non-GRAD_SYNC work is done (sum of
    ``dur``, a lower bound); repeatedly issue the bucket that can start earliest (ties: longer
    first, then lower number). Buckets are renumbered in that order, DP groups listed in it, and
    every rank's GRAD_SYNCs follow it — so "ascending bucket number" stays the rule."""
    if not program.grad_sync:
        return program
    members = {b: program.group(es[0].group).ranks for b, es in program.grad_sync.items()}
    dur: dict[str, float] = {}
    ready = [0.0] * program.world_size
    for r, prog in enumerate(program.programs):
        for ins in prog:
            if ins.op is Op.GRAD_SYNC:
                dur[ins.bucket] = max(dur.get(ins.bucket, 0.0), ins.dur)
            elif ins.op is not Op.OPT:
                ready[r] += ins.dur
    index = {b: int(b[1:]) for b in members}
    left = set(members)
    order: list[str] = []
    while left:
        b = min(left, key=lambda x: (max(ready[m] for m in members[x]), -dur.get(x, 0.0), index[x]))
        start = max(ready[m] for m in members[b])
        for m in members[b]:
            ready[m] = start + dur.get(b, 0.0)
        order.append(b)
        left.remove(b)
    rename = {old: f"b{k}" for k, old in enumerate(order)}
    grad_sync = {rename[b]: program.grad_sync[b] for b in order}
    dp = {g.name: g for g in program.groups if g.name.startswith("dp.")}
    groups = [g for g in program.groups if not g.name.startswith("dp.")]
    groups += [dp[program.grad_sync[b][0].group] for b in order]
    progs = []
    for prog in program.programs:
        syncs = sorted((replace(i, bucket=rename[i.bucket]) for i in prog if i.op is Op.GRAD_SYNC),
                       key=lambda i: int(i.bucket[1:]))
        it = iter(syncs)
        progs.append(tuple(next(it) if i.op is Op.GRAD_SYNC else i for i in prog))
    return replace(program, grad_sync=grad_sync, groups=tuple(groups), programs=tuple(progs))


# ----------------------------------------------------------------------------- driver
def lower(*, schedule: str, model: ModelConfig, training: TrainingConfig, pipes: Sequence[PipeLayout],
          ranks: Sequence[RankInfo], estimator: Estimator | None = None, per_layer_pairs: bool = False,
          meta: Mapping[str, Any] | None = None, recv_ahead: int = 1) -> Program:
    """The pass order, written once: skeleton → send/recv → strands → pre-posted receives → grad
    sync → opt → estimates → bucket order.

    ``per_layer_pairs`` expands W-shape PAIRs per layer pair (used when a pairing plan is given);
    ``recv_ahead`` is :func:`prepost_recvs`'s ``ahead`` (0: each RECV right before its consumer)."""
    prog = build_skeleton(schedule=schedule, model=model, training=training, pipes=pipes, ranks=ranks, meta=meta)
    prog = add_send_recv(prog)
    prog = pair_strands(prog, per_layer_pairs)
    prog = prepost_recvs(prog, recv_ahead)
    prog = add_grad_sync(prog)
    prog = add_opt(prog)
    prog = annotate(prog, estimator or NullEstimator())
    return order_grad_sync(prog)
