"""Hand-built uniform programs (GPipe, 1F1B, W-shape) with given per-stage times: the ground
truths of the simulator's tests and the workloads of its speed benchmark.

They follow docs/program.md (channels per edge/kind/strand, RECV before its consumer, SEND after
its producer, W ticks ending in SYNC) but are written directly from the schedule definitions,
independent of the compiler, so they can check the simulator against closed forms:
1F1B/GPipe (m+P−1)(f+b); W-shape (f+b)(P+(m−1)(1−g)) (shared/reference/dhelix.md §3.4).
"""

from __future__ import annotations

from collections.abc import Callable

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.program import (
    GroupInfo,
    Instr,
    Kind,
    Op,
    PipeInfo,
    Program,
    RankInfo,
    SliceEntry,
    StageInfo,
)

__all__ = ["synthetic_program"]

_Channel = Callable[[int, int, str, int], int]


def synthetic_program(schedule: str, stages: int, micro_batches: int, *, f: float = 1.0, b: float = 2.0,
                      comm: float = 0.0, g: float = 0.0, pipes: int = 1, act_bytes: int = 0,
                      state_bytes: int = 0, capacity_bytes: int = 80 * 2**30, ranks_per_node: int = 1,
                      grad_sync: float = 0.0, opt: float = 0.0) -> Program:
    """A program of ``pipes`` identical pipelines of ``stages`` one-GPU stages.

    Each stage's forward takes ``f`` and backward ``b`` seconds per micro-batch and keeps
    ``act_bytes`` of activations; every boundary transfer takes ``comm``. Under ``wshape`` each
    physical stage holds two folded chunks (f/2, b/2, act_bytes/2 each) and a tick that pairs a
    forward with a backward lasts (1−g)(f+b)/2. With ``pipes`` > 1 every stage index gets one
    gradient-sync bucket over its replicas taking ``grad_sync`` seconds; OPT takes ``opt``.
    Rank = pipe·stages + stage; ranks fill nodes of ``ranks_per_node``.
    """
    if schedule not in ("gpipe", "1f1b", "wshape"):
        raise InvalidInputError(f"unknown schedule {schedule!r}", field="schedule")
    P, m = stages, micro_batches
    if P < 1 or m < 1 or pipes < 1:
        raise InvalidInputError("stages, micro_batches and pipes must be >= 1")
    W = pipes * P
    wshape = schedule == "wshape"
    nv = 2 * P if wshape else P  # virtual stages per pipe
    channels: dict[tuple[int, int, str, int], int] = {}

    def ch(src: int, dst: int, kind: str, strand: int) -> int:
        return channels.setdefault((src, dst, kind, strand), len(channels))

    stage_infos: list[StageInfo] = []
    for q in range(pipes):
        for v in range(nv):
            phys = v if v < P else nv - 1 - v
            r = q * P + phys
            stage_infos.append(StageInfo(id=q * nv + v, pipe=q, phys=phys, layers=(v, v + 1), ranks=(r,),
                                         tp_group=f"tp.p{q}.s{phys}", embed=v == 0, head=v == nv - 1,
                                         leg=("down" if v < P else "up") if wshape else ""))
    programs: list[list[Instr]] = []
    for r in range(W):
        q, k = divmod(r, P)
        prog: list[Instr] = []
        if wshape:
            _wshape_rank(prog, q, k, P, m, f, b, comm, g, act_bytes, ch)
        else:
            _single_rank(prog, schedule, q, k, P, m, f, b, comm, act_bytes, ch)
        if pipes > 1:
            prog.append(Instr(op=Op.GRAD_SYNC, bucket=f"b{k}", dur=grad_sync))
        prog.append(Instr(op=Op.OPT, dur=opt))
        programs.append(prog)
    groups = [GroupInfo(name=f"tp.p{q}.s{k}", ranks=(q * P + k,)) for q in range(pipes) for k in range(P)]
    buckets: dict[str, tuple[SliceEntry, ...]] = {}
    if pipes > 1:
        for k in range(P):
            name = f"dp.{'-'.join(str(q * P + k) for q in range(pipes))}"
            groups.append(GroupInfo(name=name, ranks=tuple(q * P + k for q in range(pipes))))
            buckets[f"b{k}"] = (SliceEntry(param=f"layers.{k}", dim=0, lo=0, hi=1, group=name),)
    ranks = tuple(RankInfo(rank=r, node=f"n{r // ranks_per_node}", gpu="synthetic", capacity_bytes=capacity_bytes,
                           state_bytes=state_bytes) for r in range(W))
    return Program(world_size=W, strands=2 if wshape else 1, schedule=schedule, model=PRESETS["tiny"],
                   training=TrainingConfig(global_batch=pipes * m, micro_batch=1, seq_len=128),
                   pipes=tuple(PipeInfo(id=q, stages=tuple(range(q * nv, (q + 1) * nv)), micro_batches=m,
                                        batch_share=1 / pipes) for q in range(pipes)),
                   stages=tuple(stage_infos), groups=tuple(groups), grad_sync=buckets, ranks=ranks,
                   programs=tuple(tuple(p) for p in programs), meta={"synthetic": True, "runtime_reserve_bytes": 0})


def _single_rank(prog: list[Instr], schedule: str, q: int, k: int, P: int, m: int, f: float, b: float,
                 comm: float, act: int, ch: _Channel) -> None:
    """GPipe (all F, then all B) or 1F1B (min(P−k−1, m) warm-up forwards, F/B steady, cool-down)."""
    s, base = q * P + k, q * P

    def fwd(j: int) -> None:
        if k > 0:
            prog.append(Instr(op=Op.RECV, kind=Kind.ACT, stage=s, mb=j, peer=base + k - 1, ch=ch(s - 1, s, "a", 0)))
        if k in (0, P - 1):
            prog.append(Instr(op=Op.LOAD, stage=s, mb=j))
        prog.append(Instr(op=Op.F, stage=s, mb=j, dur=f, bytes=act))
        if k < P - 1:
            prog.append(Instr(op=Op.SEND, kind=Kind.ACT, stage=s, mb=j, peer=base + k + 1, ch=ch(s, s + 1, "a", 0),
                              dur=comm))

    def bwd(j: int) -> None:
        if k < P - 1:
            prog.append(Instr(op=Op.RECV, kind=Kind.GRAD, stage=s, mb=j, peer=base + k + 1,
                              ch=ch(s + 1, s, "g", 0)))
        prog.append(Instr(op=Op.B, stage=s, mb=j, dur=b, bytes=act))
        if k > 0:
            prog.append(Instr(op=Op.SEND, kind=Kind.GRAD, stage=s, mb=j, peer=base + k - 1,
                              ch=ch(s, s - 1, "g", 0), dur=comm))

    if schedule == "gpipe":
        for j in range(m):
            fwd(j)
        for j in range(m):
            bwd(j)
        return
    warm = min(P - k - 1, m)
    for j in range(warm):
        fwd(j)
    for i in range(m - warm):
        fwd(warm + i)
        bwd(i)
    for j in range(m - warm, m):
        bwd(j)


def _wshape_rank(prog: list[Instr], q: int, p: int, P: int, m: int, f: float, b: float, comm: float, g: float,
                 act: int, ch: _Channel) -> None:
    """DHelix ticks on physical stage p (docs/program.md §7, shared/reference/dhelix.md §3.3):
    warm-up P−p−1 down-ticks, then down-tick w+i / up-tick i alternately, then the rest; a down-tick
    t runs F(down_p, t) ∥ B(up_p, t−P), an up-tick F(up_p, t) ∥ B(down_p, t−P)."""
    nv = 2 * P
    base_v, base_r = q * nv, q * P
    down, up = base_v + p, base_v + nv - 1 - p
    half_act = act // 2
    ticks = [("d", t) for t in range(P - p - 1)]
    di, ui = P - p - 1, 0
    while di < m + P or ui < m + P:
        if di < m + P:
            ticks.append(("d", di))
            di += 1
        if ui < m + P:
            ticks.append(("u", ui))
            ui += 1

    def strand(j: int) -> int:
        return (j // P) % 2

    sync_id = 0
    for leg, t in ticks:
        fmb, bmb = t, t - P
        fstage, bstage = (down, up) if leg == "d" else (up, down)
        recvs: list[Instr] = []
        sends: list[Instr] = []
        ops: list[Instr] = []
        if fmb < m:
            st = strand(fmb)
            # activation into F: down_p from p-1 (p>0); up_p from p+1 (p<P-1, else in-memory turnaround)
            src = p - 1 if leg == "d" else p + 1
            dst = p + 1 if leg == "d" else p - 1
            if 0 <= src < P and not (leg == "u" and p == P - 1):
                recvs.append(Instr(op=Op.RECV, kind=Kind.ACT, stage=fstage, mb=fmb, strand=st, peer=base_r + src,
                                   ch=ch(fstage - 1, fstage, "a", st)))
            ops.append(Instr(op=Op.F, stage=fstage, mb=fmb, strand=st, dur=f / 2, bytes=half_act))
            if 0 <= dst < P and not (leg == "d" and p == P - 1):
                sends.append(Instr(op=Op.SEND, kind=Kind.ACT, stage=fstage, mb=fmb, strand=st, peer=base_r + dst,
                                   ch=ch(fstage, fstage + 1, "a", st), dur=comm))
        if 0 <= bmb < m:
            st = strand(bmb)
            # gradient into B: up_p from p-1 (p>0; up_0 has the loss); down_p from p+1 (p<P-1, else turnaround)
            src = p - 1 if leg == "d" else p + 1
            dst = p + 1 if leg == "d" else p - 1
            if 0 <= src < P and not (leg == "u" and p == P - 1):
                recvs.append(Instr(op=Op.RECV, kind=Kind.GRAD, stage=bstage, mb=bmb, strand=st, peer=base_r + src,
                                   ch=ch(bstage + 1, bstage, "g", st)))
            ops.append(Instr(op=Op.B, stage=bstage, mb=bmb, strand=st, dur=b / 2, bytes=half_act))
            if 0 <= dst < P and not (leg == "d" and p == P - 1):
                sends.append(Instr(op=Op.SEND, kind=Kind.GRAD, stage=bstage, mb=bmb, strand=st, peer=base_r + dst,
                                   ch=ch(bstage, bstage - 1, "g", st), dur=comm))
        if not ops:
            continue
        prog.extend(recvs)
        if fmb < m and p == 0:
            prog.append(Instr(op=Op.LOAD, stage=fstage, mb=fmb, strand=strand(fmb)))
        if len(ops) == 2:
            prog.append(Instr(op=Op.PAIR, pair=(ops[0], ops[1]), dur=(1 - g) * (f + b) / 2))
        else:
            prog.append(ops[0])
        prog.extend(sends)
        prog.append(Instr(op=Op.SYNC, sync=sync_id))
        sync_id += 1
