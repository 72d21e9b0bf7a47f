"""Torch kernels that stand for the cost model's compute ops, for the profiler to time.

:func:`layer_kernels` pairs every compute op of :func:`hexhelix.ir.opgraph.build_layer_graph`
(and of the embedding/head) with a kernel of the same shape — the layouts the runtime's autograd
runs: x·Wᵀ forward, g·W input gradient, gᵀ·x weight gradient, causal SDPA, RMSNorm, SwiGLU — and
checks that every GEMM's shape reproduces the graph's FLOPs, so what is timed is what is counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hexhelix.ir.model import ModelConfig, TrainingConfig
from hexhelix.ir.opgraph import Op, build_head_ops, build_layer_graph

__all__ = ["layer_kernels", "layer_saved_bytes", "layer_saved_tensors", "make_kernel", "make_layer_step",
           "make_optimizer_step"]


# ----------------------------------------------------------------------------- kernels
def make_kernel(spec: tuple, device: Any, dtype: Any, *, seed: int = 0) -> Callable[[], Any]:
    """A closure running the torch kernel described by ``spec`` on fresh seeded tensors.

    Specs: ``("gemm", m, k, n, layout)`` with layout ``nt`` (x·Wᵀ, forward), ``nn`` (g·W, input
    gradient) or ``tn`` (gᵀ·x, weight gradient); ``("attention", b, heads, s, d, bwd)``;
    ``("rmsnorm", tokens, h, bwd)``; ``("add", tokens, width)``; ``("swiglu", tokens, width,
    bwd)``; ``("embedding", tokens, h, vocab, bwd)``; ``("cross_entropy", tokens, vocab)``;
    ``("copy", nbytes)``; ``("seq", spec, spec, ...)`` runs several one after another.
    """
    import torch
    import torch.nn.functional as F

    if isinstance(dtype, str):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dgen = torch.Generator(device=device).manual_seed(seed)  # large tensors are drawn on the device

    def rand(*shape: int, grad: bool = False) -> torch.Tensor:
        t = torch.randn(*shape, generator=dgen, device=device, dtype=torch.float32).to(dtype)
        return t.requires_grad_(grad)

    def backward_of(out: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
        g = torch.ones_like(out)
        return lambda: torch.autograd.grad(out, inputs, g, retain_graph=True)

    kind = spec[0]
    if kind == "seq":
        parts = [make_kernel(s, device, dtype, seed=seed + i) for i, s in enumerate(spec[1:])]
        return lambda: [p() for p in parts]
    if kind == "gemm":
        m, k, n, layout = int(spec[1]), int(spec[2]), int(spec[3]), spec[4]
        if layout == "nt":
            a, b = rand(m, k), rand(n, k)
            return lambda: torch.mm(a, b.t())
        if layout == "nn":
            a, b = rand(m, k), rand(k, n)
            return lambda: torch.mm(a, b)
        a, b = rand(k, m), rand(k, n)
        return lambda: torch.mm(a.t(), b)
    if kind == "attention":
        b, heads, s, d, bwd = (int(x) for x in spec[1:6])
        q, k, v = (rand(b, heads, s, d, grad=bool(bwd)) for _ in range(3))
        if not bwd:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return backward_of(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v))
    if kind == "rmsnorm":
        tokens, h, bwd = int(spec[1]), int(spec[2]), bool(spec[3])
        x, w = rand(tokens, h, grad=bwd), rand(h, grad=bwd)
        if not bwd:
            return lambda: F.rms_norm(x, (h,), w, 1e-5)
        return backward_of(F.rms_norm(x, (h,), w, 1e-5), (x, w))
    if kind == "add":
        x, y = rand(int(spec[1]), int(spec[2])), rand(int(spec[1]), int(spec[2]))
        return lambda: torch.add(x, y)
    if kind == "swiglu":
        tokens, width, bwd = int(spec[1]), int(spec[2]), bool(spec[3])
        gate, up = rand(tokens, width, grad=bwd), rand(tokens, width, grad=bwd)
        if not bwd:
            return lambda: F.silu(gate) * up
        return backward_of(F.silu(gate) * up, (gate, up))
    if kind == "embedding":
        tokens, h, vocab, bwd = int(spec[1]), int(spec[2]), int(spec[3]), bool(spec[4])
        idx = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
        table = rand(vocab, h, grad=bwd)
        if not bwd:
            return lambda: F.embedding(idx, table)
        return backward_of(F.embedding(idx, table), (table,))
    if kind == "cross_entropy":
        tokens, vocab = int(spec[1]), int(spec[2])
        logits, tgt = rand(tokens, vocab), torch.randint(0, vocab, (tokens,), generator=gen).to(device)
        return lambda: F.cross_entropy(logits.float(), tgt)
    if kind == "copy":
        el = max(1, int(spec[1]) // torch.tensor([], dtype=dtype).element_size())
        src, dst = torch.ones(el, dtype=dtype, device=device), torch.empty(el, dtype=dtype, device=device)
        return lambda: dst.copy_(src)
    raise ValueError(f"unknown kernel spec {spec!r}")


def _gemm_shapes(model: ModelConfig, train: TrainingConfig, tp: int) -> dict[str, tuple]:
    """(m, k, n, layout) of every GEMM of the layer graph and the head, by op name."""
    T, h, f, t, V = train.micro_batch * train.seq_len, model.hidden, model.ffn, tp, model.vocab
    q = (h + 2 * model.kv_hidden) // t
    return {
        "gemm_attn_c": (T, h, q, "nt"), "gemm_attn_l": (T, h // t, h, "nt"),
        "gemm_mlp_c": (T, h, 2 * f // t, "nt"), "gemm_mlp_l": (T, f // t, h, "nt"),
        "gemm_dgrad_mlp_l": (T, h, f // t, "nn"), "gemm_wgrad_mlp_l": (f // t, T, h, "tn"),
        "gemm_dgrad_mlp_c": (T, 2 * f // t, h, "nn"), "gemm_wgrad_mlp_c": (2 * f // t, T, h, "tn"),
        "gemm_dgrad_attn_l": (T, h, h // t, "nn"), "gemm_wgrad_attn_l": (h // t, T, h, "tn"),
        "gemm_dgrad_attn_c": (T, q, h, "nn"), "gemm_wgrad_attn_c": (q, T, h, "tn"),
        "lm_head": (T, h, V // t, "nt"),
    }


def layer_kernels(model: ModelConfig, train: TrainingConfig, tp: int) -> list[tuple[Op, tuple]]:
    """Every compute op of one layer (forward and backward) and of the embedding/head at TP ``tp``,
    paired with the torch kernel that executes it (see :func:`make_kernel`).

    Raises ``ValueError`` if the op graph has an op this table does not know, or a GEMM whose
    shape disagrees with the graph's FLOPs — the profiler must time exactly what the cost model
    counts.
    """
    g = build_layer_graph(model, train, tp)
    heads = build_head_ops(model, train, tp)
    T, h, t, V = train.micro_batch * train.seq_len, model.hidden, tp, model.vocab
    Tr = T // t if g.sequence_parallel else T
    fl = model.ffn // t
    gemms = _gemm_shapes(model, train, tp)
    attn = (train.micro_batch, model.heads // t, train.seq_len, model.head_dim)
    table: dict[str, tuple] = {
        "ln_attn": ("rmsnorm", Tr, h, 0), "ln_mlp": ("rmsnorm", Tr, h, 0),
        "ln_mlp_bwd": ("rmsnorm", Tr, h, 1), "ln_attn_bwd": ("rmsnorm", Tr, h, 1),
        "bda_attn": ("add", Tr, h), "bda_mlp": ("add", Tr, h),
        "bda_mlp_bwd": ("add", Tr, h), "bda_attn_bwd": ("add", Tr, h),
        "swiglu_mlp": ("swiglu", T, fl, 0), "swiglu_bwd": ("swiglu", T, fl, 1),
        "fl_attn": ("attention", *attn, 0), "attn_bwd": ("attention", *attn, 1),
        "embedding": ("embedding", T, h, V, 0), "embedding_bwd": ("embedding", T, h, V, 1),
        "final_norm": ("rmsnorm", T, h, 0), "final_norm_bwd": ("rmsnorm", T, h, 1),
        "loss": ("cross_entropy", T, V // t),
        "lm_head_bwd": ("seq", ("gemm", T, V // t, h, "nn"), ("gemm", V // t, T, h, "tn")),
    }
    for name, (m, k, n, layout) in gemms.items():
        table[name] = ("gemm", m, k, n, layout)
    out: list[tuple[Op, tuple]] = []
    for op in (*g.forward, *g.backward, *(o for ops in heads.values() for o in ops)):
        if op.op_class.is_comm:
            continue
        if op.name not in table:
            raise ValueError(f"profiler has no kernel for op {op.name!r} of the layer graph")
        spec = table[op.name]
        if spec[0] == "gemm" and not math.isclose(2.0 * spec[1] * spec[2] * spec[3], op.flops, rel_tol=1e-9):
            raise ValueError(f"GEMM {op.name}: kernel shape {spec[1:4]} disagrees with the graph's FLOPs")
        out.append((op, spec))
    return out


def _stage_forward(model: ModelConfig, train: TrainingConfig, tp: int, layers: int, device: Any, dtype: Any,
                   seed: int) -> tuple[Callable[[], Any], Any, Any]:
    """(forward closure returning the stage output, the output gradient, the module) of the
    runtime's own :class:`~hexhelix.runtime.torch_model.StageModule`: a middle stage (no embedding
    or head) of ``layers`` layers at the TP-sharded shapes of TP rank 0, with its collectives off
    (a one-rank :class:`~hexhelix.runtime.torch_tp.TPComm`: the shard's compute only). Timing what
    the runtime executes — RoPE, separate Q/K/V and gate/up projections, its RMSNorm — rather than
    a stand-in layer is what makes the folded overhead match a run (issue 8)."""
    import torch

    from .torch_model import StageModule
    from .torch_tp import TPComm

    if isinstance(dtype, str):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    mod = StageModule(model, range(layers), embed=False, head=False, tp_rank=0, tp=tp, seed=seed)
    mod = mod.to(device=device, dtype=dtype)
    cos, sin = mod.rope(train.seq_len, device)
    if cos.dtype != dtype:  # the runtime runs fp32; at bf16 the rotary tables must follow the weights
        mod._rope[train.seq_len] = (cos.to(dtype), sin.to(dtype))
    comm = TPComm(group=None)
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (train.micro_batch, train.seq_len, model.hidden)
    x0 = torch.randn(*shape, generator=gen, device=device).to(dtype)

    def forward() -> Any:
        return mod(x0.detach().requires_grad_(True), comm)
    return forward, torch.ones(*shape, device=device, dtype=dtype), mod


def make_layer_step(model: ModelConfig, train: TrainingConfig, tp: int, device: Any, dtype: Any, *,
                    layers: int = 1, seed: int = 0) -> Callable[[], Any]:
    """Forward and backward of a ``layers``-layer middle stage of the runtime's StageModule, as
    the runtime's F and B run it (TP-sharded shapes on one rank, no collectives). Timing it
    against the sum of the layer's isolated kernels gives the framework overhead (autograd
    bookkeeping, the runtime's extra elementwise work, cold caches) that the kernels alone miss."""
    import torch

    forward, g, _ = _stage_forward(model, train, tp, layers, device, dtype, seed)
    return lambda: torch.autograd.backward(forward(), g)


def make_optimizer_step(model: ModelConfig, train: TrainingConfig, tp: int, device: Any, dtype: Any, *,
                        layers: int = 1, seed: int = 0) -> tuple[Callable[[], Any], int]:
    """(closure, parameter count): one step of the runtime's own AdamW
    (:class:`~hexhelix.runtime.torch_model.OptimConfig`) over the parameters of a ``layers``-layer
    stage, then ``zero_grad(set_to_none=True)``, as the runtime's OPT instruction runs it. The
    gradients are re-attached before every step (an assignment, no copy)."""
    import torch

    from .torch_model import OptimConfig

    _, _, mod = _stage_forward(model, train, tp, layers, device, dtype, seed)
    params = list(mod.parameters())
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    grads = [torch.randn(p.shape, generator=gen, device=device).to(p.dtype) for p in params]
    opt = OptimConfig().build(params)

    def step() -> None:
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, sum(p.numel() for p in params)


def layer_saved_tensors(model: ModelConfig, train: TrainingConfig, tp: int, device: Any, dtype: Any, *,
                        layers: int = 1, seed: int = 0) -> tuple[int, bool]:
    """(bytes, attention scores saved?) that autograd keeps from the forward of a ``layers``-layer
    stage of the runtime's StageModule for its backward (distinct storages, weights excluded, the
    stage input included): the measured counterpart of the cost model's activation bytes per layer
    and micro-batch (Korthikanti et al.).

    The second value says whether any saved tensor is an attention score matrix: shape
    (…, s, s) with at least b·(a/t)·s² elements — the 5·a·s²·b term of the formula, which an
    unfused attention keeps and torch's fused SDPA recomputes in its backward."""
    import torch

    forward, _, mod = _stage_forward(model, train, tp, layers, device, dtype, seed)
    # Weights and the rotary tables (one cache per stage, shared by every micro-batch) are not
    # activations.
    constants = (*mod.parameters(), *mod.rope(train.seq_len, device))
    weights = {t.untyped_storage().data_ptr() for t in constants}
    s = train.seq_len
    score_numel = train.micro_batch * (model.heads // tp) * s * s
    seen: dict[int, int] = {}
    scores = False

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal scores
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            seen[st.data_ptr()] = st.nbytes()
            if t.dim() >= 2 and tuple(t.shape[-2:]) == (s, s) and t.numel() >= score_numel:
                scores = True
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(seen.values()), scores


def layer_saved_bytes(model: ModelConfig, train: TrainingConfig, tp: int, device: Any, dtype: Any, *,
                      layers: int = 1, seed: int = 0) -> int:
    """Bytes of :func:`layer_saved_tensors` (kept for callers that need only the bytes)."""
    return layer_saved_tensors(model, train, tp, device, dtype, layers=layers, seed=seed)[0]
