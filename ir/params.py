"""Canonical parameter layout of the Llama-style model: names, full shapes and the TP shard dim.

The compiler's gradient-sync slice plan and the torch runtime both read this table, so a slice
``(param, dim, lo, hi)`` means the same elements on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import ModelConfig

__all__ = ["ParamSpec", "param_layout", "stage_param_names"]


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """A parameter's canonical name, unsharded shape, and the dim TP shards (None: replicated)."""

    name: str
    shape: tuple[int, ...]
    shard_dim: int | None
    unit: str  # "embedding", "layer.<i>" or "head": the slice-plan unit it belongs to

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _layer(model: ModelConfig, i: int) -> list[ParamSpec]:
    h, kv, f, u = model.hidden, model.kv_hidden, model.ffn, f"layer.{i}"
    p = f"layers.{i}."
    return [
        ParamSpec(p + "attn_norm.weight", (h,), None, u),
        ParamSpec(p + "attn.wq.weight", (h, h), 0, u),
        ParamSpec(p + "attn.wk.weight", (kv, h), 0, u),
        ParamSpec(p + "attn.wv.weight", (kv, h), 0, u),
        ParamSpec(p + "attn.wo.weight", (h, h), 1, u),
        ParamSpec(p + "mlp_norm.weight", (h,), None, u),
        ParamSpec(p + "mlp.w_gate.weight", (f, h), 0, u),
        ParamSpec(p + "mlp.w_up.weight", (f, h), 0, u),
        ParamSpec(p + "mlp.w_down.weight", (h, f), 1, u),
    ]


def param_layout(model: ModelConfig) -> list[ParamSpec]:
    """Every parameter of the model in canonical order (embedding, layers, final norm, head)."""
    out = [ParamSpec("embed.weight", (model.vocab, model.hidden), 0, "embedding")]
    for i in range(model.layers):
        out += _layer(model, i)
    out.append(ParamSpec("norm.weight", (model.hidden,), None, "head"))
    if not model.tie_embeddings:
        out.append(ParamSpec("head.weight", (model.vocab, model.hidden), 0, "head"))
    return out


def stage_param_names(model: ModelConfig, layers: list[int], embed: bool, head: bool) -> list[str]:
    """Names of the parameters a stage holding ``layers`` (and embedding/head) owns."""
    keep = {f"layer.{i}" for i in layers} | ({"embedding"} if embed else set()) | ({"head"} if head else set())
    return [p.name for p in param_layout(model) if p.unit in keep]
