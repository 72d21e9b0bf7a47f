"""Tensor-parallel communication operators (Megatron-LM's f/g, sequence-parallel variants and the
vocabulary-parallel embedding and cross-entropy), as autograd Functions with forward and
backward side by side.

Shoeybi et al., "Megatron-LM" (arXiv 1909.08053) §3: ``f`` is the identity forward and an
all-reduce backward (placed before a column-parallel linear); ``g`` is an all-reduce forward and
the identity backward (after a row-parallel linear). Korthikanti et al., "Reducing Activation
Recomputation" (arXiv 2205.05198) §4.2.2: with sequence parallelism ``f`` becomes an all-gather
along the sequence (reduce-scatter backward) and ``g`` a reduce-scatter (all-gather backward).

Every operator takes a :class:`TPComm` so that the two DHelix strands can run their collectives
on strand-private clones of the same TP group; a backward uses the group its forward used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = [
    "TPComm",
    "copy_to_tp",
    "gather_from_sp",
    "reduce_from_tp",
    "scatter_to_sp",
    "sum_grad_over_tp",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_embedding",
]


@dataclass(frozen=True, slots=True)
class TPComm:
    """The TP group a stage computes with: ``size`` ranks, this one is ``rank``; ``group`` is None
    for a single rank (every operator is then the identity or the plain torch op)."""

    group: Any
    size: int = 1
    rank: int = 0
    sequence_parallel: bool = False

    @property
    def sp(self) -> bool:
        """Sequence parallelism is active (it only means something with more than one rank)."""
        return self.sequence_parallel and self.size > 1


def _all_reduce(x: torch.Tensor, comm: TPComm, op: Any = None) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, op=op or dist.ReduceOp.SUM, group=comm.group)
    return x


def _all_gather_seq(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """Concatenate the ranks' sequence shards (dim 1 of ``(b, s/t, h)``)."""
    parts = [torch.empty_like(x) for _ in range(comm.size)]
    dist.all_gather(parts, x.contiguous(), group=comm.group)
    return torch.cat(parts, dim=1)


def _reduce_scatter_seq(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """Sum over ranks, keep this rank's sequence shard (gloo has no reduce_scatter: all-reduce
    then narrow, which gives the same numbers)."""
    full = _all_reduce(x.clone(), comm)
    n = x.shape[1] // comm.size
    return full.narrow(1, comm.rank * n, n).contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm) -> torch.Tensor:
        ctx.comm = comm
        return _all_gather_seq(x, comm) if comm.sp else x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        comm = ctx.comm
        return (_reduce_scatter_seq(g, comm) if comm.sp else _all_reduce(g.clone(), comm)), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm) -> torch.Tensor:
        ctx.comm = comm
        return _reduce_scatter_seq(x, comm) if comm.sp else _all_reduce(x.clone(), comm)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        comm = ctx.comm
        return (_all_gather_seq(g, comm) if comm.sp else g), None


class _ScatterToSP(torch.autograd.Function):
    """Replicated ``(b, s, h)`` → this rank's sequence shard; backward all-gathers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm) -> torch.Tensor:
        ctx.comm = comm
        n = x.shape[1] // comm.size
        return x.narrow(1, comm.rank * n, n).contiguous()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather_seq(g, ctx.comm), None


class _GatherFromSP(torch.autograd.Function):
    """Sequence shards → replicated ``(b, s, h)``; backward keeps this rank's shard of the grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm) -> torch.Tensor:
        ctx.comm = comm
        return _all_gather_seq(x, comm)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        comm = ctx.comm
        n = g.shape[1] // comm.size
        return g.narrow(1, comm.rank * n, n).contiguous(), None


class _SumGradOverTP(torch.autograd.Function):
    """Identity on a replicated weight whose gradient is summed over the TP group (Megatron's
    all-reduce of layer-norm grads under sequence parallelism, done inside the backward so TP peers
    hold identical replicated grads before GRAD_SYNC)."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, comm: TPComm) -> torch.Tensor:
        ctx.comm = comm
        return w.view_as(w)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(g.clone(), ctx.comm), None


def sum_grad_over_tp(w: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """``w`` unchanged; its gradient becomes the sum over the TP group (no-op on one rank)."""
    return w if comm.size == 1 else _SumGradOverTP.apply(w, comm)


def copy_to_tp(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """Megatron ``f``: enter a column-parallel region (all-gather the sequence under SP)."""
    return x if comm.size == 1 else _CopyToTP.apply(x, comm)


def reduce_from_tp(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """Megatron ``g``: leave a row-parallel region (sum the partials; reduce-scatter under SP)."""
    return x if comm.size == 1 else _ReduceFromTP.apply(x, comm)


def scatter_to_sp(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """Enter the sequence-parallel region from a replicated tensor (no-op without SP)."""
    return _ScatterToSP.apply(x, comm) if comm.sp else x


def gather_from_sp(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """Leave the sequence-parallel region to a replicated tensor (no-op without SP)."""
    return _GatherFromSP.apply(x, comm) if comm.sp else x


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, vocab_lo: int,
                             comm: TPComm) -> torch.Tensor:
    """Look up ``ids`` in the rows [vocab_lo, vocab_lo + weight.shape[0]) this rank holds; rows
    held elsewhere contribute zeros and the TP all-reduce (``g``) fills them in (Megatron §3)."""
    if comm.size == 1:
        return F.embedding(ids, weight)
    hi = vocab_lo + weight.shape[0]
    outside = (ids < vocab_lo) | (ids >= hi)
    local = (ids - vocab_lo).masked_fill(outside, 0)
    out = F.embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_tp(out, comm)


class _VocabParallelCE(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary (Megatron's
    ``vocab_parallel_cross_entropy``): three small all-reduces (max, target logit, sum of exp)
    instead of gathering ``b·s·V`` logits. Returns the per-token loss."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, vocab_lo: int,
                comm: TPComm) -> torch.Tensor:
        vloc = logits.shape[-1]
        lmax = _all_reduce(logits.detach().amax(dim=-1), comm, dist.ReduceOp.MAX)
        shifted = logits - lmax.unsqueeze(-1)
        outside = (target < vocab_lo) | (target >= vocab_lo + vloc)
        local_t = (target - vocab_lo).masked_fill(outside, 0)
        picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        picked = _all_reduce(picked, comm)
        exp = shifted.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), comm)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local_t, outside)
        return sum_exp.log() - picked

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local_t, outside = ctx.saved_tensors
        grad = softmax.clone()
        hit = (~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_t.unsqueeze(-1), -hit.unsqueeze(-1))
        return grad * g.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_lo: int,
                                 comm: TPComm) -> torch.Tensor:
    """Mean cross-entropy over all tokens; plain ``F.cross_entropy`` on one rank."""
    if comm.size == 1:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    return _VocabParallelCE.apply(logits, target, vocab_lo, comm).mean()
