"""A Llama-style decoder split into pipeline stages with tensor-parallel shards.

Parameter names, full shapes and TP shard dims are exactly :func:`hexhelix.ir.params.param_layout`
(``embed.weight``, ``layers.<i>.attn.wq.weight``, ..., ``norm.weight``, ``head.weight``), so the
compiler's gradient-sync slice plan addresses these tensors directly. Layout (Megatron-LM §3):

* ``embed.weight`` (V, h), ``head.weight`` (V, h): split along the vocabulary (dim 0); the head
  feeds a vocabulary-parallel cross-entropy;
* ``wq`` (h, h), ``wk``/``wv`` (h_kv, h), ``w_gate``/``w_up`` (f, h): column-parallel (dim 0,
  whole heads per rank, GQA groups stay on one rank because TP divides ``kv_heads``);
* ``wo`` (h, h), ``w_down`` (h, f): row-parallel (dim 1), followed by the TP all-reduce;
* RMSNorm weights: replicated.

Full weights are drawn once from ``seed`` (one generator per parameter, keyed by its canonical
name, so a stage draws only its own tensors and every process gets the same numbers), then each
rank keeps its slice: the single-process reference and every distributed layout start identical.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hexhelix.ir.errors import UnsupportedError
from hexhelix.ir.model import ModelConfig
from hexhelix.ir.params import ParamSpec, param_layout
from torch import nn

from .torch_tp import (
    TPComm,
    copy_to_tp,
    gather_from_sp,
    reduce_from_tp,
    scatter_to_sp,
    sum_grad_over_tp,
    vocab_parallel_cross_entropy,
    vocab_parallel_embedding,
)

__all__ = ["INIT_STD", "OptimConfig", "StageModule", "full_weight", "shard_range", "shard_weight"]

INIT_STD = 0.02  # GPT-2 / Llama init: N(0, 0.02) for matrices, ones for norms
NORM_EPS = 1e-5
ROPE_THETA = 10000.0


def full_weight(spec: ParamSpec, seed: int) -> torch.Tensor:
    """The unsharded initial value of one parameter, identical in every process.

    Each parameter has its own generator seeded from (seed, CRC32 of its name), so the value
    does not depend on which other parameters a process builds.
    """
    if spec.shard_dim is None and len(spec.shape) == 1:
        return torch.ones(spec.shape)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(spec.name.encode())) % (2**63))
    return torch.randn(spec.shape, generator=gen) * INIT_STD


def shard_range(spec: ParamSpec, tp_rank: int, tp: int) -> tuple[int, int]:
    """[lo, hi) of ``spec.shard_dim`` that TP rank ``tp_rank`` of ``tp`` holds (full range when
    replicated)."""
    if spec.shard_dim is None or tp == 1:
        return 0, spec.shape[spec.shard_dim or 0]
    n = spec.shape[spec.shard_dim] // tp
    return tp_rank * n, (tp_rank + 1) * n


def shard_weight(full: torch.Tensor, spec: ParamSpec, tp_rank: int, tp: int) -> torch.Tensor:
    """This rank's slice of a full weight (a copy, so shards never alias the full tensor)."""
    if spec.shard_dim is None or tp == 1:
        return full.clone()
    lo, hi = shard_range(spec, tp_rank, tp)
    return full.narrow(spec.shard_dim, lo, hi - lo).clone()


class _Weight(nn.Module):
    """Holds one ``weight`` so that module paths spell the canonical parameter names."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(value)


def rms_norm(x: torch.Tensor, w: torch.Tensor, comm: TPComm) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x²) + eps) · w."""
    if comm.sp:  # each rank normalises only its sequence shard: sum the weight's grad over TP
        w = sum_grad_over_tp(w, comm)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w


def rope_tables(seq: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``(seq, head_dim)`` of rotary embeddings (Su et al. 2021, rotate-half form)."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(nn.Module):
    """One decoder layer's TP shard: pre-norm rotary attention and a SwiGLU MLP."""

    def __init__(self, model: ModelConfig, weights: dict[str, torch.Tensor], prefix: str, tp: int):
        super().__init__()
        self.n_heads = model.heads // tp
        self.n_kv = model.kv_heads // tp
        self.head_dim = model.head_dim
        self.attn_norm = _Weight(weights[prefix + "attn_norm.weight"])
        self.attn = nn.Module()
        for name in ("wq", "wk", "wv", "wo"):
            self.attn.add_module(name, _Weight(weights[f"{prefix}attn.{name}.weight"]))
        self.mlp_norm = _Weight(weights[prefix + "mlp_norm.weight"])
        self.mlp = nn.Module()
        for name in ("w_gate", "w_up", "w_down"):
            self.mlp.add_module(name, _Weight(weights[f"{prefix}mlp.{name}.weight"]))

    def attention(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, s, _ = x.shape
        a = self.attn
        q = F.linear(x, a.wq.weight).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = F.linear(x, a.wk.weight).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = F.linear(x, a.wv.weight).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.n_kv != self.n_heads:  # GQA: each KV head serves n_heads / n_kv query heads
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, s, head_dim)
        return F.linear(o.transpose(1, 2).reshape(b, s, -1), a.wo.weight)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], comm: TPComm) -> torch.Tensor:
        h = copy_to_tp(rms_norm(x, self.attn_norm.weight, comm), comm)
        x = x + reduce_from_tp(self.attention(h, rope), comm)
        h = copy_to_tp(rms_norm(x, self.mlp_norm.weight, comm), comm)
        m = self.mlp
        y = F.linear(F.silu(F.linear(h, m.w_gate.weight)) * F.linear(h, m.w_up.weight), m.w_down.weight)
        return x + reduce_from_tp(y, comm)


class StageModule(nn.Module):
    """The TP shard of a contiguous layer range, with the embedding and/or the head when the
    stage is first/last. ``named_parameters()`` yields canonical names.

    ``forward`` maps token ids (embedding stage) or a replicated hidden state ``(b, s, h)`` to a
    replicated hidden state, or — on the head stage, given targets — to the mean loss.
    """

    def __init__(self, model: ModelConfig, layers: Iterable[int], *, embed: bool, head: bool,
                 tp_rank: int = 0, tp: int = 1, seed: int = 0):
        super().__init__()
        self.model_cfg = model
        self.layer_ids = list(layers)
        self.has_embed, self.has_head = embed, head
        self.tp_rank, self.tp = tp_rank, tp
        keep = {f"layer.{i}" for i in self.layer_ids} | ({"embedding"} if embed else set()) | (
            {"head"} if head else set())
        self.specs = {p.name: p for p in param_layout(model) if p.unit in keep}
        w = {n: shard_weight(full_weight(p, seed), p, tp_rank, tp) for n, p in self.specs.items()}
        if model.vocab % tp:
            raise UnsupportedError(f"vocabulary {model.vocab} is not divisible by TP degree {tp}")
        if model.tie_embeddings and head and not embed:
            raise UnsupportedError("tied embeddings need the embedding and the head on one stage")
        self.vocab_lo = tp_rank * (model.vocab // tp)
        if embed:
            self.embed = _Weight(w["embed.weight"])
        self.layers = nn.ModuleDict({str(i): Block(model, w, f"layers.{i}.", tp) for i in self.layer_ids})
        if head:
            self.norm = _Weight(w["norm.weight"])
            if "head.weight" in w:
                self.head = _Weight(w["head.weight"])
        self._rope: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def rope(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if seq not in self._rope:
            cos, sin = rope_tables(seq, self.model_cfg.head_dim)
            self._rope[seq] = (cos.to(device), sin.to(device))
        return self._rope[seq]

    def forward(self, x: torch.Tensor, comm: TPComm, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.has_embed:
            # under SP the embedding's reduction is a reduce-scatter: x is already this rank's shard
            x = vocab_parallel_embedding(x, self.embed.weight, self.vocab_lo, comm)
        elif comm.sp:
            x = scatter_to_sp(x, comm)
        seq = x.shape[1] * (comm.size if comm.sp else 1)
        rope = self.rope(seq, x.device)
        for blk in self.layers.values():
            x = blk(x, rope, comm)
        if not self.has_head:
            return gather_from_sp(x, comm)
        if targets is None:
            raise ValueError("the head stage needs targets")
        h = copy_to_tp(rms_norm(x, self.norm.weight, comm), comm)
        w = self.head.weight if hasattr(self, "head") else self.embed.weight
        return vocab_parallel_cross_entropy(F.linear(h, w), targets, self.vocab_lo, comm)

    def canonical_slices(self) -> dict[str, tuple[int | None, int, int]]:
        """Per local parameter: (shard dim, lo, hi) of the canonical tensor it holds."""
        out = {}
        for name, spec in self.specs.items():
            lo, hi = shard_range(spec, self.tp_rank, self.tp)
            out[name] = (spec.shard_dim if self.tp > 1 else None, lo, hi)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimConfig:
    """AdamW settings shared by the distributed run and the reference (Loshchilov & Hutter 2019).
    AdamW is element-wise, so a TP shard's optimizer state is the slice of the full model's."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1

    def build(self, params: Iterable[nn.Parameter]) -> torch.optim.AdamW:
        # foreach=False: the same single-tensor kernel on every rank and in the reference
        return torch.optim.AdamW(list(params), lr=self.lr, betas=self.betas, eps=self.eps,
                                 weight_decay=self.weight_decay, foreach=False)
