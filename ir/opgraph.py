"""Operator graph of one Llama transformer layer (forward chain, backward DAG) at a TP degree.

Under TP with sequence parallelism (Megatron TP+SP, as DHelix runs it) the forward is a 14-op
chain and the backward an 18-op DAG whose four weight-gradient GEMMs are free sinks
(reference: DHelix code ``dstb.py``, shared/reference/dhelix.md §1). Without SP the collectives
are two all-reduces per direction; at TP 1 there is no collective at all.

FLOPs and bytes are *per GPU of the TP group* for one micro-batch of ``b`` sequences of length
``s``. Communication ops carry the full (gathered) tensor size ``payload_bytes``; the ring factor
is applied by the cost model (``hexhelix.solver.cost``), which alone turns ops into seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .errors import InvalidInputError
from .model import ModelConfig, TrainingConfig

__all__ = [
    "LayerGraph",
    "Op",
    "OpClass",
    "OpKind",
    "Resource",
    "build_head_ops",
    "build_layer_graph",
]


class OpKind(StrEnum):
    COMPUTE = "compute"
    COMM = "comm"


class Resource(StrEnum):
    """The hardware an op occupies: the SMs, the intra-node link or the inter-node link."""

    COMPUTE = "compute"
    INTRA = "intra"
    INTER = "inter"


class OpClass(StrEnum):
    GEMM = "gemm"
    ATTENTION = "attention"
    NORM = "norm"
    ELEMENTWISE = "elementwise"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    SEND_RECV = "send_recv"

    @property
    def is_comm(self) -> bool:
        return self in (OpClass.ALL_GATHER, OpClass.REDUCE_SCATTER, OpClass.ALL_REDUCE, OpClass.SEND_RECV)


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operator: what it computes or moves, on which resource, after which ops."""

    name: str
    direction: str  # "fwd" | "bwd"
    op_class: OpClass
    resource: Resource
    flops: float = 0.0
    mem_bytes: float = 0.0
    payload_bytes: float = 0.0
    group_size: int = 1
    deps: tuple[str, ...] = ()
    wgrad: bool = False

    def __post_init__(self) -> None:
        # floats throughout, so an op built in memory and the same op read back from JSON
        # serialise to the same bytes (67108864 vs 67108864.0)
        for name in ("flops", "mem_bytes", "payload_bytes"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def kind(self) -> OpKind:
        return OpKind.COMM if self.op_class.is_comm else OpKind.COMPUTE

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "direction": self.direction, "kind": self.kind.value,
            "op_class": self.op_class.value, "resource": self.resource.value, "flops": self.flops,
            "mem_bytes": self.mem_bytes, "payload_bytes": self.payload_bytes,
            "group_size": self.group_size, "deps": list(self.deps), "wgrad": self.wgrad,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Op:
        return cls(name=d["name"], direction=d["direction"], op_class=OpClass(d["op_class"]),
                   resource=Resource(d["resource"]), flops=float(d["flops"]),
                   mem_bytes=float(d["mem_bytes"]), payload_bytes=float(d["payload_bytes"]),
                   group_size=int(d["group_size"]), deps=tuple(d["deps"]), wgrad=bool(d["wgrad"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerGraph:
    """Forward chain and backward DAG of one layer at TP degree ``tp`` (SP on/off)."""

    tp: int
    sequence_parallel: bool
    micro_batch: int
    seq_len: int
    link: Resource
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    _index: dict[str, Op] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for op in (*self.forward, *self.backward):
            if op.name in seen:
                raise InvalidInputError(f"duplicate op name {op.name!r}", field="ops")
            for dep in op.deps:
                if dep not in seen:
                    raise InvalidInputError(
                        f"op {op.name!r} depends on {dep!r}, which is not an earlier op of the layer", field="deps")
            seen.add(op.name)
            self._index[op.name] = op

    def op(self, name: str) -> Op:
        return self._index[name]

    @property
    def ops(self) -> tuple[Op, ...]:
        return (*self.forward, *self.backward)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp, "sequence_parallel": self.sequence_parallel, "micro_batch": self.micro_batch,
            "seq_len": self.seq_len, "link": self.link.value,
            "forward": [o.to_dict() for o in self.forward],
            "backward": [o.to_dict() for o in self.backward],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerGraph:
        return cls(tp=int(d["tp"]), sequence_parallel=bool(d["sequence_parallel"]),
                   micro_batch=int(d["micro_batch"]), seq_len=int(d["seq_len"]), link=Resource(d["link"]),
                   forward=tuple(Op.from_dict(o) for o in d["forward"]),
                   backward=tuple(Op.from_dict(o) for o in d["backward"]))


def build_layer_graph(model: ModelConfig, train: TrainingConfig, tp: int, *,
                      sequence_parallel: bool | None = None,
                      link: Resource = Resource.INTRA) -> LayerGraph:
    """Build the operator graph of one transformer layer on each GPU of a TP group of ``tp``.

    Parameters
    ----------
    model, train : shapes and micro-batch size / sequence length / dtype.
    tp : tensor-parallel degree (must divide heads, kv_heads and ffn).
    sequence_parallel : default ``train.sequence_parallel``; ignored (no collectives) when tp == 1.
    link : which link the TP collectives use (intra-node for any TP group hexhelix plans).

    Examples
    --------
    >>> from hexhelix.ir.model import PRESETS, TrainingConfig
    >>> g = build_layer_graph(PRESETS["llama2-7b"], TrainingConfig(), 8, sequence_parallel=True)
    >>> len(g.forward), len(g.backward)
    (14, 18)
    """
    model.check_tp(tp)
    sp = train.sequence_parallel if sequence_parallel is None else sequence_parallel
    sp = sp and tp > 1
    b, s, h, f, t = train.micro_batch, train.seq_len, model.hidden, model.ffn, tp
    kv, db = model.kv_hidden, train.dtype_bytes
    T = b * s                      # tokens of the micro-batch
    Tr = T / t if sp else T        # tokens held by one rank in the "SP region"
    S = T * h * db                 # full boundary tensor bytes (payload of AG/RS/AR)
    qkv = h + 2 * kv

    def gemm(name: str, direction: str, m: float, k: float, n: float, deps: tuple[str, ...] = (),
             wgrad: bool = False) -> Op:
        return Op(name=name, direction=direction, op_class=OpClass.GEMM, resource=Resource.COMPUTE,
                  flops=2.0 * m * k * n, mem_bytes=db * (m * k + k * n + m * n), deps=deps, wgrad=wgrad)

    def elem(name: str, direction: str, cls: OpClass, tokens: float, width: float, passes: float,
             deps: tuple[str, ...] = ()) -> Op:
        return Op(name=name, direction=direction, op_class=cls, resource=Resource.COMPUTE,
                  flops=passes * tokens * width, mem_bytes=passes * db * tokens * width, deps=deps)

    def coll(name: str, direction: str, cls: OpClass, deps: tuple[str, ...] = ()) -> Op:
        return Op(name=name, direction=direction, op_class=cls, resource=link, payload_bytes=S,
                  group_size=t, deps=deps)

    def attn(name: str, direction: str, factor: float, deps: tuple[str, ...] = ()) -> Op:
        return Op(name=name, direction=direction, op_class=OpClass.ATTENTION, resource=Resource.COMPUTE,
                  flops=factor * 4.0 * b * s * s * h / t, mem_bytes=factor * db * T * (qkv + h) / t, deps=deps)

    comm = t > 1
    F, N, E = "fwd", OpClass.NORM, OpClass.ELEMENTWISE
    fwd: list[Op] = [elem("ln_attn", F, N, Tr, h, 4)]
    if comm and sp:
        fwd.append(coll("allgather_attn", F, OpClass.ALL_GATHER))
    fwd += [gemm("gemm_attn_c", F, T, h, qkv / t), attn("fl_attn", F, 1.0),
            gemm("gemm_attn_l", F, T, h / t, h)]
    if comm:
        fwd.append(coll("reduce_scatter_attn" if sp else "allreduce_attn", F,
                        OpClass.REDUCE_SCATTER if sp else OpClass.ALL_REDUCE))
    fwd += [elem("bda_attn", F, E, Tr, h, 3), elem("ln_mlp", F, N, Tr, h, 4)]
    if comm and sp:
        fwd.append(coll("allgather_mlp", F, OpClass.ALL_GATHER))
    fwd += [gemm("gemm_mlp_c", F, T, h, 2 * f / t), elem("swiglu_mlp", F, E, T, f / t, 4),
            gemm("gemm_mlp_l", F, T, f / t, h)]
    if comm:
        fwd.append(coll("reduce_scatter_mlp" if sp else "allreduce_mlp", F,
                        OpClass.REDUCE_SCATTER if sp else OpClass.ALL_REDUCE))
    fwd.append(elem("bda_mlp", F, E, Tr, h, 3))
    # The forward is a chain: each op depends on the one before.
    fwd = [_with_deps(op, (fwd[i - 1].name,) if i else ()) for i, op in enumerate(fwd)]

    B = "bwd"
    bwd: list[Op] = [elem("bda_mlp_bwd", B, E, Tr, h, 2)]
    last = "bda_mlp_bwd"
    if comm and sp:
        bwd.append(coll("allgather_mlp_bwd", B, OpClass.ALL_GATHER, (last,)))
        last = "allgather_mlp_bwd"
    bwd += [gemm("gemm_dgrad_mlp_l", B, T, h, f / t, (last,)),
            gemm("gemm_wgrad_mlp_l", B, f / t, T, h, (last,), wgrad=True),
            elem("swiglu_bwd", B, E, T, f / t, 8, ("gemm_dgrad_mlp_l",)),
            gemm("gemm_dgrad_mlp_c", B, T, 2 * f / t, h, ("swiglu_bwd",)),
            gemm("gemm_wgrad_mlp_c", B, 2 * f / t, T, h, ("swiglu_bwd",), wgrad=True)]
    last = "gemm_dgrad_mlp_c"
    if comm:
        name = "reduce_scatter_mlp_c_bwd" if sp else "allreduce_mlp_c_bwd"
        bwd.append(coll(name, B, OpClass.REDUCE_SCATTER if sp else OpClass.ALL_REDUCE, (last,)))
        last = name
    bwd += [elem("ln_mlp_bwd", B, N, Tr, h, 8, (last,)), elem("bda_attn_bwd", B, E, Tr, h, 2, ("ln_mlp_bwd",))]
    last = "bda_attn_bwd"
    if comm and sp:
        bwd.append(coll("allgather_attn_bwd", B, OpClass.ALL_GATHER, (last,)))
        last = "allgather_attn_bwd"
    bwd += [gemm("gemm_dgrad_attn_l", B, T, h, h / t, (last,)),
            gemm("gemm_wgrad_attn_l", B, h / t, T, h, (last,), wgrad=True),
            attn("attn_bwd", B, 2.0, ("gemm_dgrad_attn_l",)),
            gemm("gemm_dgrad_attn_c", B, T, qkv / t, h, ("attn_bwd",)),
            gemm("gemm_wgrad_attn_c", B, qkv / t, T, h, ("attn_bwd",), wgrad=True)]
    last = "gemm_dgrad_attn_c"
    if comm:
        name = "reduce_scatter_attn_c_bwd" if sp else "allreduce_attn_c_bwd"
        bwd.append(coll(name, B, OpClass.REDUCE_SCATTER if sp else OpClass.ALL_REDUCE, (last,)))
        last = name
    bwd.append(elem("ln_attn_bwd", B, N, Tr, h, 8, (last,)))
    return LayerGraph(tp=t, sequence_parallel=sp, micro_batch=b, seq_len=s, link=link,
                      forward=tuple(fwd), backward=tuple(bwd))


def _with_deps(op: Op, deps: tuple[str, ...]) -> Op:
    return Op(name=op.name, direction=op.direction, op_class=op.op_class, resource=op.resource,
              flops=op.flops, mem_bytes=op.mem_bytes, payload_bytes=op.payload_bytes,
              group_size=op.group_size, deps=deps, wgrad=op.wgrad)


def build_head_ops(model: ModelConfig, train: TrainingConfig, tp: int) -> dict[str, tuple[Op, ...]]:
    """Embedding (first stage) and final norm + LM head + loss (last stage), vocab-parallel over
    ``tp``: ``{"embed_fwd", "embed_bwd", "head_fwd", "head_bwd"}`` op tuples per GPU."""
    b, s, h, V, db, t = train.micro_batch, train.seq_len, model.hidden, model.vocab, train.dtype_bytes, tp
    T = b * s
    emb_f = Op(name="embedding", direction="fwd", op_class=OpClass.ELEMENTWISE, resource=Resource.COMPUTE,
               flops=T * h, mem_bytes=2 * db * T * h)
    emb_b = Op(name="embedding_bwd", direction="bwd", op_class=OpClass.ELEMENTWISE,
               resource=Resource.COMPUTE, flops=T * h, mem_bytes=2 * db * T * h)
    norm = Op(name="final_norm", direction="fwd", op_class=OpClass.NORM, resource=Resource.COMPUTE,
              flops=4 * T * h, mem_bytes=2 * db * T * h)
    head = Op(name="lm_head", direction="fwd", op_class=OpClass.GEMM, resource=Resource.COMPUTE,
              flops=2.0 * T * h * V / t, mem_bytes=db * (T * h + h * V / t + T * V / t), deps=("final_norm",))
    loss = Op(name="loss", direction="fwd", op_class=OpClass.ELEMENTWISE, resource=Resource.COMPUTE,
              flops=5.0 * T * V / t, mem_bytes=2 * 4 * T * V / t, deps=("lm_head",))
    head_b = Op(name="lm_head_bwd", direction="bwd", op_class=OpClass.GEMM, resource=Resource.COMPUTE,
                flops=4.0 * T * h * V / t, mem_bytes=2 * db * (T * h + h * V / t + T * V / t))
    norm_b = Op(name="final_norm_bwd", direction="bwd", op_class=OpClass.NORM, resource=Resource.COMPUTE,
                flops=8 * T * h, mem_bytes=4 * db * T * h, deps=("lm_head_bwd",))
    return {"embed_fwd": (emb_f,), "embed_bwd": (emb_b,), "head_fwd": (norm, head, loss),
            "head_bwd": (head_b, norm_b)}
