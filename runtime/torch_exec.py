"""Per-rank executor: replay one rank's instruction list (docs/program.md) with real tensors.

One dispatch table maps each instruction kind to a handler. Conventions (shared/reference/
schedule_ir.md §7–8.8, the gloo pitfalls of §1.10):

* point-to-point is individual ``dist.isend``/``dist.irecv`` with ``tag = ch`` — never batched P2P
  on gloo; every returned work handle is kept: a RECV's handle is waited by the F/B that consumes
  it, SEND handles at the end of the step (the buffers stay alive until then);
* TP collectives run inside F/B on the stage's TP group (strand-private clone for strand 1);
  GRAD_SYNC all-reduces the bucket's slices on its ``dp.*`` group, each member's slice scaled by
  its weight first; OPT steps AdamW and zeroes the grads;
* PAIR co-executes its two halves: half ``a`` on a worker thread, half ``b`` on the calling thread,
  then joins (the barrier). While one strand waits on a TP collective or on its RECV, the other
  computes. Both halves touch disjoint autograd graphs; only B accumulates into ``.grad`` and a
  PAIR holds at most one B (W-shape pairs F with B), so the result is bit-identical to running
  ``a`` then ``b`` (``co_execute=False``). SYNC is then a no-op: the list runs in order.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from hexhelix.ir.errors import HexhelixError, InvalidInputError, UnsupportedError
from hexhelix.ir.params import param_layout, stage_param_names
from hexhelix.ir.program import Instr, Kind, Op, Program, StageInfo

from .data import DataSource
from .torch_groups import RankContext
from .torch_model import OptimConfig, StageModule
from .torch_tp import TPComm
from .watchdog import Watchdog, format_window

__all__ = ["ExecutionError", "Executor", "RunOptions", "check_rank_program"]

logger = logging.getLogger(__name__)

Key = tuple[int, int, int]  # (stage, micro-batch, strand)


class ExecutionError(HexhelixError):
    """An instruction failed on this rank (a peer died, a collective timed out, ...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """How to run a program: seed, data set, optimizer, whether PAIR halves run concurrently, and
    ``capture_grads`` keeps the gradients of the first step (after GRAD_SYNC) for the reference
    check; ``fault`` — a testing hook ``(rank, step, pc)`` at which that rank dies without cleanup."""

    seed: int = 0
    dataset: str = "text"
    optim: OptimConfig = field(default_factory=OptimConfig)
    co_execute: bool = True
    capture_grads: bool = False
    fault: tuple[int, int, int] | None = None


@dataclass(slots=True)
class _StepState:
    """Tensors alive within one step, keyed by (stage, mb, strand)."""

    data: dict[Key, tuple[torch.Tensor | None, torch.Tensor | None]] = field(default_factory=dict)
    recv: dict[tuple[Kind, Key], tuple[torch.Tensor, Any]] = field(default_factory=dict)
    stash: dict[Key, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)
    deferred_w: dict[Key, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)
    out: dict[tuple[Kind, Key], torch.Tensor] = field(default_factory=dict)  # act out / input grad
    uses: Counter = field(default_factory=Counter)
    sends: list[tuple[Any, torch.Tensor]] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)


def check_rank_program(program: Program, rank: int) -> None:
    """Static checks of one rank's list before any process group exists, so that a program this
    runtime cannot run fails at start with one line on every rank (docs/program.md §4, §6).

    * COLL has no tensor semantics yet and is rejected; PAIR halves must be compute ops;
    * per-layer compute parts (``layer >= 0``, emitted by ``compile --pair``) are rejected: this
      runtime executes whole virtual stages (docs/program.md §9);
    * every element of every parameter the rank holds is in exactly one slice entry of the
      buckets it syncs, so each gradient element gets its batch-share weight exactly once.
    """
    for pc, ins in enumerate(program.programs[rank]):
        if ins.op is Op.COLL:
            raise UnsupportedError(
                f"rank {rank} pc {pc}: COLL ({ins}) has no tensor semantics in docs/program.md and the "
                "compiler does not emit it; the torch runtime does not run it")
        for part in (ins, *(ins.pair or ())):
            if part.layer >= 0:
                raise UnsupportedError(
                    f"rank {rank} pc {pc}: per-layer part {part} (from `compile --pair`) is not implemented "
                    "by the torch runtime; compile without --pair to run this plan on torch")
        for half in ins.pair or ():
            if half.op not in (Op.F, Op.B, Op.BI, Op.BW):
                raise InvalidInputError(f"rank {rank} pc {pc}: PAIR half {half} is not a compute op",
                                        field="programs")
    local: dict[str, int] = {}
    for st in program.stages:
        if rank in st.ranks:
            names = set(stage_param_names(program.model, list(range(*st.layers)), st.embed, st.head))
            for spec in param_layout(program.model):
                if spec.name in names:
                    local[spec.name] = spec.numel // (len(st.ranks) if spec.shard_dim is not None else 1)
    shapes = {p.name: p.shape for p in param_layout(program.model)}
    covered: Counter = Counter()
    for b in {ins.bucket for ins in program.programs[rank] if ins.op is Op.GRAD_SYNC}:
        if b not in program.grad_sync:
            raise InvalidInputError(f"rank {rank}: GRAD_SYNC names bucket {b!r} that the header lacks",
                                    field="grad_sync")
        for e in program.grad_sync[b]:
            if e.param in local:
                covered[e.param] += (e.hi - e.lo) * math.prod(shapes[e.param]) // shapes[e.param][e.dim]
    for name, n in local.items():
        if covered[name] != n:
            raise InvalidInputError(
                f"rank {rank}: the slice plan covers {covered[name]} of the {n} local elements of {name}; "
                "recompile the program", field="grad_sync")


class Executor:
    """Holds one rank's stage modules, optimizer and dispatch table; ``run_step`` replays the list."""

    def __init__(self, ctx: RankContext, opts: RunOptions, watchdog: Watchdog | None = None):
        self.ctx, self.opts, self.watchdog = ctx, opts, watchdog
        prog = self.program = ctx.program
        self.rank = ctx.rank
        self.instrs = prog.programs[ctx.rank]
        self.tokens = [str(i) for i in self.instrs]  # for the watchdog, formatted once
        self._debug = logger.isEnabledFor(logging.DEBUG)  # per-instruction trace (HEXHELIX_DEBUG=1)
        tr = prog.training
        self.data = DataSource(seed=opts.seed, micro_batch=tr.micro_batch, seq_len=tr.seq_len,
                               vocab=prog.model.vocab, dataset=opts.dataset)
        self.boundary_shape = (tr.micro_batch, tr.seq_len, prog.model.hidden)
        self.pipe_of = {s.id: prog.pipes[s.pipe] for s in prog.stages}
        self.mb_offset = {p.id: sum(q.micro_batches for q in prog.pipes[: p.id]) for p in prog.pipes}
        self.modules: dict[int, StageModule] = {}
        self.comms: dict[tuple[int, int], TPComm] = {}
        for st in prog.stages:
            if ctx.rank in st.ranks:
                self._build_stage(st)
        self.params = {n: p for m in self.modules.values() for n, p in m.named_parameters()}
        # canonical [lo, ...) offset of each local parameter along its shard dim (None: replicated)
        self.shard_lo = {n: sl for m in self.modules.values() for n, sl in m.canonical_slices().items()}
        self.optimizer = opts.optim.build(self.params.values())
        check_rank_program(prog, ctx.rank)
        self.uses = self._count_uses()
        self.dispatch = {
            Op.LOAD: self._load, Op.F: self._forward, Op.B: self._backward, Op.BI: self._backward_input,
            Op.BW: self._backward_weight, Op.SEND: self._send, Op.RECV: self._recv,
            Op.GRAD_SYNC: self._grad_sync, Op.OPT: self._opt, Op.SYNC: self._sync, Op.PAIR: self._pair,
        }
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"strand-r{ctx.rank}")
        self.st = _StepState()
        self.captured: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ setup
    def _build_stage(self, st: StageInfo) -> None:
        prog, tp = self.program, len(st.ranks)
        j = st.ranks.index(self.rank)
        mod = StageModule(prog.model, range(*st.layers), embed=st.embed, head=st.head, tp_rank=j, tp=tp,
                          seed=self.opts.seed).to(self.ctx.device)
        mod.rope(prog.training.seq_len, self.ctx.device)  # fill the cache before threads share it
        self.modules[st.id] = mod
        for strand in range(prog.strands):
            self.comms[(st.id, strand)] = TPComm(group=self.ctx.group_for(st.tp_group, strand), size=tp, rank=j,
                                                 sequence_parallel=prog.training.sequence_parallel)

    def _count_uses(self) -> Counter:
        """How many times each produced boundary tensor is consumed on this rank (SENDs plus the
        in-memory handoff of the W-shape turnaround), so it is freed after its last use."""
        uses: Counter = Counter()
        recvs = {(i.kind, i.key) for i in self._flat() if i.op is Op.RECV}
        for ins in self._flat():
            if ins.op is Op.SEND:
                uses[(ins.kind, ins.key)] += 1
            elif ins.op is Op.F and (Kind.ACT, ins.key) not in recvs and not self.program.stage(ins.stage).embed:
                uses[(Kind.ACT, (self._neighbour(ins.stage, -1), ins.mb, ins.strand))] += 1
            elif ins.op in (Op.B, Op.BI) and (Kind.GRAD, ins.key) not in recvs \
                    and not self.program.stage(ins.stage).head:
                uses[(Kind.GRAD, (self._neighbour(ins.stage, +1), ins.mb, ins.strand))] += 1
        return uses

    def _flat(self) -> list[Instr]:
        return [h for i in self.instrs for h in (i.pair or (i,))]

    def _neighbour(self, stage: int, delta: int) -> int:
        order = self.pipe_of[stage].stages
        return order[order.index(stage) + delta]

    # ------------------------------------------------------------------ main loop
    def run_step(self, step: int) -> float:
        """Replay the rank's list once; returns the sum of the unscaled micro-batch losses this
        rank reports (TP rank 0 of a head stage), else 0."""
        self.st = _StepState(uses=Counter(self.uses))
        self.step = step
        for pc, ins in enumerate(self.instrs):
            if self.watchdog is not None:
                self.watchdog.enter(step, pc, self.tokens[pc])
            if self.opts.fault is not None and self.opts.fault == (self.rank, step, pc):
                import os

                logger.error("rank %d: injected fault at step %d pc %d (%s)", self.rank, step, pc, ins)
                os._exit(13)
            if self._debug:
                logger.debug("rank %d step %d pc %d %s", self.rank, step, pc, self.tokens[pc])
            try:
                self.dispatch[ins.op](ins)
            except HexhelixError:
                raise
            except Exception as err:
                where = self.watchdog.positions(pc) if self.watchdog is not None else {self.rank: pc}
                raise ExecutionError(
                    f"rank {self.rank}: step {step} pc {pc} ({ins}) failed: {type(err).__name__}: "
                    f"{str(err).splitlines()[0] if str(err) else ''}\n"
                    + format_window(self.program, where, fallback=pc)) from err
        for work, _ in self.st.sends:
            work.wait()
        if self.st.stash or self.st.deferred_w:
            logger.warning("rank %d: step %d ended with activations no backward consumed: %s", self.rank, step,
                           sorted(self.st.stash) + sorted(self.st.deferred_w))
        return float(sum(x.item() for x in self.st.losses))

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ handlers
    def _load(self, ins: Instr) -> None:
        st = self.program.stage(ins.stage)
        g = self.mb_offset[st.pipe] + ins.mb
        tokens, targets = self.data.micro_batch_at(self.step, g)
        dev = self.ctx.device
        self.st.data[ins.key] = (tokens.to(dev) if st.embed else None, targets.to(dev) if st.head else None)

    def _take(self, kind: Kind, key: Key) -> torch.Tensor:
        """The boundary tensor (act input or output grad) for ``key``: a received one (waited
        here) or the in-memory handoff from the neighbouring virtual stage on this rank."""
        if (kind, key) in self.st.recv:
            buf, work = self.st.recv.pop((kind, key))
            work.wait()
            return buf
        s, m, strand = key
        src = (kind, (self._neighbour(s, -1 if kind is Kind.ACT else +1), m, strand))
        return self._consume(src)

    def _consume(self, k: tuple[Kind, Key]) -> torch.Tensor:
        t = self.st.out[k]
        self.st.uses[k] -= 1
        if self.st.uses[k] <= 0:
            del self.st.out[k]
        return t

    def _forward(self, ins: Instr) -> None:
        st = self.program.stage(ins.stage)
        mod, comm = self.modules[ins.stage], self.comms[(ins.stage, ins.strand)]
        tokens, targets = self.st.data.pop(ins.key, (None, None))
        if st.embed:
            x = None
            inp = tokens
        else:
            x = self._take(Kind.ACT, ins.key).detach().requires_grad_(True)
            inp = x
        if st.head:
            loss = mod(inp, comm, targets)
            if comm.rank == 0:
                self.st.losses.append(loss.detach())
            self.st.stash[ins.key] = (loss / self.pipe_of[ins.stage].micro_batches, x)
        else:
            out = mod(inp, comm)
            self.st.stash[ins.key] = (out, x)
            if self.st.uses[(Kind.ACT, ins.key)]:
                self.st.out[(Kind.ACT, ins.key)] = out.detach()

    def _output_grad(self, ins: Instr) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(stage output or scaled loss, its gradient — None on the head —, the stage input leaf)."""
        out, x = self.st.stash.pop(ins.key)
        g = None if self.program.stage(ins.stage).head else self._take(Kind.GRAD, ins.key)
        return out, g, x

    def _publish_input_grad(self, ins: Instr, gx: torch.Tensor | None) -> None:
        if gx is not None and self.st.uses[(Kind.GRAD, ins.key)]:
            self.st.out[(Kind.GRAD, ins.key)] = gx

    def _backward(self, ins: Instr) -> None:
        out, g, x = self._output_grad(ins)
        torch.autograd.backward(out, g)
        self._publish_input_grad(ins, None if x is None else x.grad)

    def _backward_input(self, ins: Instr) -> None:
        """BI: input gradient only; the graph is kept for BW (zero-bubble style split)."""
        out, g, x = self._output_grad(ins)
        if x is not None:
            (gx,) = torch.autograd.grad(out, x, g, retain_graph=True)
            self._publish_input_grad(ins, gx)
        self.st.deferred_w[ins.key] = (out, g)

    def _backward_weight(self, ins: Instr) -> None:
        """BW: weight gradients of the graph BI kept (accumulated into the stage's parameters)."""
        out, g = self.st.deferred_w.pop(ins.key)
        torch.autograd.backward(out, g, inputs=list(self.modules[ins.stage].parameters()))

    def _send(self, ins: Instr) -> None:
        t = self._consume((ins.kind, ins.key)).contiguous()
        self.st.sends.append((dist.isend(t, dst=ins.peer, tag=ins.ch), t))

    def _recv(self, ins: Instr) -> None:
        buf = torch.empty(self.boundary_shape, dtype=torch.float32, device=self.ctx.device)
        self.st.recv[(ins.kind, ins.key)] = (buf, dist.irecv(buf, src=ins.peer, tag=ins.ch))

    def _grad_sync(self, ins: Instr) -> None:
        """Scale each local slice by this member's weight, SUM-all-reduce the bucket as one flat
        tensor on its group, write the slices back (docs/program.md §6)."""
        entries = self.program.grad_sync[ins.bucket]
        group = self.program.group(entries[0].group)
        me = group.ranks.index(self.rank)
        views = []
        for e in entries:
            p = self.params[e.param]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            lo = e.lo - self._shard_lo(e.param, e.dim)
            w = e.weights[me] if e.weights else self._default_weight(group.ranks)
            v = p.grad.narrow(e.dim, lo, e.hi - e.lo)
            v.mul_(w)
            views.append(v)
        handle = self.ctx.groups[group.name]
        if handle is None:  # a single holder: the weight is all there is to apply
            return
        flat = torch.cat([v.reshape(-1) for v in views])
        dist.all_reduce(flat, group=handle)
        off = 0
        for v in views:
            v.copy_(flat[off: off + v.numel()].view_as(v))
            off += v.numel()

    def _shard_lo(self, name: str, dim: int) -> int:
        sdim, lo, _ = self.shard_lo[name]
        return lo if sdim == dim else 0

    def _default_weight(self, ranks: tuple[int, ...]) -> float:
        """Weight of a slice entry written without weights: batch share over same-pipe holders."""
        pipe_of_rank = {r: s.pipe for s in self.program.stages for r in s.ranks}
        mine = pipe_of_rank[self.rank]
        return self.program.pipes[mine].batch_share / sum(pipe_of_rank[r] == mine for r in ranks)

    def _opt(self, ins: Instr) -> None:
        if self.opts.capture_grads and self.captured is None:  # the synchronised grads of the first step
            self.captured = {n: p.grad.detach().cpu().clone() for n, p in self.params.items()
                             if p.grad is not None}
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _sync(self, ins: Instr) -> None:
        """Strand barrier: a no-op here — the list runs in order and PAIR joins its halves."""

    def _on_worker(self, ins: Instr) -> None:
        if self.ctx.device.type == "cuda":  # the current device is per thread
            torch.cuda.set_device(self.ctx.device)
        self.dispatch[ins.op](ins)

    def _pair(self, ins: Instr) -> None:
        a, b = ins.pair  # type: ignore[misc]
        if not self.opts.co_execute:
            self.dispatch[a.op](a)
            self.dispatch[b.op](b)
            return
        fut = self._pool.submit(self._on_worker, a)
        try:
            self.dispatch[b.op](b)
        finally:
            fut.result()
