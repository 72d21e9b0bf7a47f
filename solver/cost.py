"""The cost model: one pure function per formula (design.md §5). Everything that turns shapes,
GPUs and links into seconds or bytes lives here; formulations, heuristics, the evaluator and the
compiler call these functions and never re-derive them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hexhelix.ir.catalog import GpuType
from hexhelix.ir.cluster import Cluster
from hexhelix.ir.model import ModelConfig, TrainingConfig
from hexhelix.ir.opgraph import LayerGraph, Op, OpClass, Resource, build_head_ops, build_layer_graph
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

__all__ = [
    "LayerCost",
    "Link",
    "activation_bytes_per_layer",
    "boundary_bytes",
    "cluster_link",
    "cluster_links",
    "collective_steps",
    "collective_time",
    "gpu_peak_flops",
    "head_activation_bytes",
    "head_cost",
    "inflight_microbatches",
    "layer_cost",
    "layer_forward_flops",
    "model_flops_per_token",
    "model_state_bytes",
    "op_time",
    "optimizer_time",
    "p2p_time",
    "pipeline_time",
    "ring_factor",
    "stage_edge_cost",
    "wshape_pipeline_time",
]


# ----------------------------------------------------------------------------- FLOPs
def layer_forward_flops(model: ModelConfig, micro_batch: int, seq_len: int) -> float:
    """Forward FLOPs of one Llama layer: 2·b·s·(2h² + 2h·h_kv + 3h·f) + 4·b·s²·h (no causal saving).

    >>> from hexhelix.ir.model import PRESETS
    >>> round(layer_forward_flops(PRESETS["llama2-7b"], 1, 4096) / 1e12, 2)
    1.93
    """
    b, s, h, f, kv = micro_batch, seq_len, model.hidden, model.ffn, model.kv_hidden
    return 2.0 * b * s * (2 * h * h + 2 * h * kv + 3 * h * f) + 4.0 * b * s * s * h


def model_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token without recompute (forward + 2x backward), head included: used for MFU."""
    per_layer = 3.0 * layer_forward_flops(model, 1, seq_len) / seq_len
    head = 3.0 * 2.0 * model.hidden * model.vocab
    return model.layers * per_layer + head


def gpu_peak_flops(gpu: GpuType, profile: Profile = DEFAULT_PROFILE) -> float:
    """Peak FLOP/s of ``gpu``, unless the profile overrides its tflops."""
    return profile.gpu_overrides.get(gpu.name, {}).get("tflops", gpu.tflops) * 1e12


def _mem_bw(gpu: GpuType, profile: Profile) -> float:
    return profile.gpu_overrides.get(gpu.name, {}).get("mem_GBps", gpu.mem_GBps) * 1e9


# ----------------------------------------------------------------------------- communication
@dataclass(frozen=True, slots=True)
class Link:
    """A link as the cost model sees it: bandwidth in bytes/s and latency in seconds."""

    bandwidth: float
    latency: float


def link_order(lk: Link) -> float:
    """How the gradient-sync model ranks links, slowest first (smallest): bytes/s with the latency
    charged once per byte-second, bandwidth / (1 + bandwidth·latency)."""
    return lk.bandwidth / (1 + lk.bandwidth * lk.latency)


def ring_factor(op_class: OpClass, n: int) -> float:
    """Bytes each GPU moves per byte of payload: ring all-reduce 2(n−1)/n, AG/RS (n−1)/n, P2P 1."""
    if op_class is OpClass.SEND_RECV:
        return 1.0
    if n <= 1:
        return 0.0
    if op_class is OpClass.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    return (n - 1) / n


def collective_steps(op_class: OpClass, n: int) -> int:
    """Latency terms (α) of a ring collective over ``n`` GPUs: 2(n−1) for all-reduce, n−1 for
    AG/RS, 1 for a point-to-point message."""
    if op_class is OpClass.SEND_RECV:
        return 1
    return 2 * (n - 1) if op_class is OpClass.ALL_REDUCE else max(n - 1, 0)


def collective_time(op_class: OpClass, n: int, payload_bytes: float, link: Link,
                    profile: Profile = DEFAULT_PROFILE) -> float:
    """α–β time of a ring collective over ``n`` GPUs whose slowest link is ``link``:
    steps·α·a_c + ring_factor·S/(β·link_efficiency·b_c), with :func:`collective_steps` steps and
    the profile's per-class factors (a_c, b_c) = ``profile.link_factors(class)`` (1, 1 by default)."""
    if n <= 1 and op_class is not OpClass.SEND_RECV:
        return 0.0
    bw_factor, alpha_factor = profile.link_factors(op_class.value)
    bw = link.bandwidth * profile.link_efficiency * bw_factor
    return collective_steps(op_class, n) * link.latency * alpha_factor + ring_factor(op_class, n) * payload_bytes / bw


def p2p_time(payload_bytes: float, link: Link, profile: Profile = DEFAULT_PROFILE) -> float:
    """One point-to-point message: α + S/β_eff."""
    return collective_time(OpClass.SEND_RECV, 2, payload_bytes, link, profile)


# ----------------------------------------------------------------------------- compute
def op_time(op: Op, gpu: GpuType, link: Link | None = None, profile: Profile = DEFAULT_PROFILE) -> float:
    """Seconds for ``op`` on one GPU of type ``gpu``: GEMM/attention are FLOP-bound at
    peak × efficiency, norms and elementwise ops are bound by memory bandwidth × efficiency,
    collectives use :func:`collective_time` over ``link``."""
    if op.op_class.is_comm:
        if link is None:
            raise ValueError(f"op {op.name} is a collective and needs a link")
        return collective_time(op.op_class, op.group_size, op.payload_bytes, link, profile)
    eff = profile.eff(gpu.name, op.op_class.value)
    if op.op_class in (OpClass.GEMM, OpClass.ATTENTION):
        return op.flops / (gpu_peak_flops(gpu, profile) * eff)
    return op.mem_bytes / (_mem_bw(gpu, profile) * eff)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """Per-micro-batch seconds of one layer on a TP group: forward and backward (recompute
    included), each split into compute and (serial, un-overlapped) TP communication."""

    fwd_compute: float
    fwd_comm: float
    bwd_compute: float
    bwd_comm: float

    @property
    def fwd(self) -> float:
        return self.fwd_compute + self.fwd_comm

    @property
    def bwd(self) -> float:
        return self.bwd_compute + self.bwd_comm

    @property
    def total(self) -> float:
        return self.fwd + self.bwd


def _sum_ops(ops: tuple[Op, ...], gpu: GpuType, link: Link, profile: Profile) -> tuple[float, float]:
    comp = sum(op_time(o, gpu, link, profile) for o in ops if not o.op_class.is_comm)
    comm = sum(op_time(o, gpu, link, profile) for o in ops if o.op_class.is_comm)
    return comp, comm


class _Memo:
    """Results of a pure cost function by its hashable arguments and the identity of its profile
    (profiles hold dicts, so they are not hashable; the entry keeps the profile alive, so its id
    cannot be reused while cached). Bounded: cleared when full."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.hits: dict[tuple, tuple[Profile, object]] = {}

    def get(self, key: tuple, profile: Profile, compute: Callable[[], object]) -> Any:
        hit = self.hits.get((*key, id(profile)))
        if hit is not None and hit[0] is profile:
            return hit[1]
        if len(self.hits) >= self.size:
            self.hits.clear()
        value = compute()
        self.hits[(*key, id(profile))] = (profile, value)
        return value


_LAYER_COSTS, _HEAD_COSTS = _Memo(), _Memo()  # the evaluator asks for the same few (GPU, TP) pairs again and again


def layer_cost(model: ModelConfig, train: TrainingConfig, tp: int, gpu: GpuType, intra: Link,
               profile: Profile = DEFAULT_PROFILE, graph: LayerGraph | None = None) -> LayerCost:
    """Cost of one layer for one micro-batch, ops executed one after another (no overlap).

    Recompute: ``full`` re-runs the whole forward inside the backward, ``selective`` re-runs the
    attention core (Korthikanti et al. 2022)."""
    if graph is None:
        return _LAYER_COSTS.get((model, train, tp, gpu, intra), profile,
                                lambda: _layer_cost(model, train, tp, gpu, intra, profile, None))
    return _layer_cost(model, train, tp, gpu, intra, profile, graph)


def _layer_cost(model: ModelConfig, train: TrainingConfig, tp: int, gpu: GpuType, intra: Link,
                profile: Profile, graph: LayerGraph | None) -> LayerCost:
    g = graph or build_layer_graph(model, train, tp, link=Resource.INTRA)
    fc, fm = _sum_ops(g.forward, gpu, intra, profile)
    bc, bm = _sum_ops(g.backward, gpu, intra, profile)
    if train.recompute == "full":
        bc, bm = bc + fc, bm + fm
    elif train.recompute == "selective":
        bc += sum(op_time(o, gpu, intra, profile) for o in g.forward if o.op_class is OpClass.ATTENTION)
    return LayerCost(fwd_compute=fc, fwd_comm=fm, bwd_compute=bc, bwd_comm=bm)


def head_cost(model: ModelConfig, train: TrainingConfig, tp: int, gpu: GpuType,
              profile: Profile = DEFAULT_PROFILE) -> dict[str, float]:
    """Seconds of the embedding (first stage) and norm/head/loss (last stage), fwd and bwd."""
    def compute() -> dict[str, float]:
        ops = build_head_ops(model, train, tp)
        return {k: sum(op_time(o, gpu, None, profile) for o in v) for k, v in ops.items()}

    return dict(_HEAD_COSTS.get((model, train, tp, gpu), profile, compute))


def optimizer_time(params: float, gpu: GpuType, train: TrainingConfig,
                   profile: Profile = DEFAULT_PROFILE) -> float:
    """AdamW step over ``params`` parameters on one GPU: memory-bound, reading and writing the
    model states once (state_bytes_per_param each way), at the profile's ``optimizer`` efficiency
    (measured by ``hexhelix profile`` on the runtime's own AdamW step; the ``elementwise``
    efficiency when the profile has none).

    2·P·B_state / (memory bandwidth × eff_optimizer)"""
    eff = profile.eff(gpu.name, "optimizer", fallback="elementwise")
    return 2.0 * params * train.state_bytes_per_param / (_mem_bw(gpu, profile) * eff)


# ----------------------------------------------------------------------------- memory
def model_state_bytes(params: float, tp: int, train: TrainingConfig) -> float:
    """Weights + grads + optimizer states of ``params`` parameters sharded over ``tp`` GPUs
    (mixed-precision Adam: 16 B/param by default)."""
    return params * train.state_bytes_per_param / tp


def activation_bytes_per_layer(model: ModelConfig, train: TrainingConfig, tp: int,
                               profile: Profile = DEFAULT_PROFILE) -> float:
    """Activation bytes one layer keeps for one micro-batch (Korthikanti et al. 2022), per GPU.

    none:      s·b·h·(34 + 5·a·s/h)/t with TP+SP; s·b·h·(10 + 24/t + 5·a·s/(h·t)) with TP only
    selective: 34·s·b·h/t with SP; s·b·h·(10 + 24/t) without
    full:      2·s·b·h (the layer input checkpoint), /t with SP

    The 5·a·s²·b/t term (``none`` only) is the attention score matrix, its softmax and dropout
    mask; a profile with ``attention_scores_saved`` false (a fused attention that recomputes the
    scores in its backward, as torch SDPA does, measured by ``hexhelix profile``) drops it, which
    makes ``none`` equal to ``selective``. The constants count 16-bit activations (bf16/fp16, the
    default dtype); an fp32 run scales them by dtype_bytes/2 (dropout masks, 1 byte each in the
    paper, are scaled too: a slight overcount).
    """
    s, b, h, a, t = train.seq_len, train.micro_batch, model.hidden, model.heads, tp
    sp = train.sequence_parallel and t > 1
    sbh = s * b * h * train.dtype_bytes / 2
    if train.recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    if train.recompute == "selective" or not profile.attention_scores_saved:
        return 34.0 * sbh / t if sp else sbh * (10 + 24 / t)
    if sp or t == 1:
        return sbh * (34 + 5 * a * s / h) / t
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


def head_activation_bytes(model: ModelConfig, train: TrainingConfig, tp: int) -> float:
    """Activations of the final norm, LM head and loss for one micro-batch: 4·s·b·h·(1 + V/h)/t
    (16-bit activations; scaled by dtype_bytes/2 like :func:`activation_bytes_per_layer`)."""
    s, b, h, V = train.seq_len, train.micro_batch, model.hidden, model.vocab
    return 4.0 * s * b * h * (1 + V / h) / tp * train.dtype_bytes / 2


def inflight_microbatches(schedule: str, stage: int, num_stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage ``stage`` (0-based) of ``num_stages`` holds at its peak:
    GPipe all m; 1F1B min(K − k, m); W-shape min(K, m) on every stage (folding balances memory,
    shared/reference/dhelix.md §3.5)."""
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(num_stages - stage, micro_batches)
    if schedule == "wshape":
        return min(num_stages, micro_batches)
    raise ValueError(f"unknown schedule {schedule!r}")


# ----------------------------------------------------------------------------- pipelines
def pipeline_time(stage_times: list[float], micro_batches: int) -> float:
    """1F1B / GPipe makespan with per-micro-batch stage times u_k (fwd + bwd + comm):
    (m − 1)·max_k u_k + Σ_k u_k (design.md §5)."""
    return (micro_batches - 1) * max(stage_times) + sum(stage_times)


def wshape_pipeline_time(stage_times: list[float], savings: list[float], micro_batches: int,
                         compute: list[tuple[float, float]] | None = None) -> float:
    """W-shaped (DHelix folded) makespan of one pipeline.

    Parameters
    ----------
    stage_times
        u_k per physical stage: forward + backward of one micro-batch, communication included.
    savings
        g_k per stage: the saving of one co-executed tick.
    micro_batches
        m.
    compute
        optional (f_k, b_k) per stage, forward and backward compute seconds of one micro-batch;
        needed for the exact m ≤ P form. Without it m ≤ P falls back to the 1F1B time, an upper
        bound (the behaviour before the m ≤ P form existed).

    Returns
    -------
    float
        m > P: Σ u_k + (m−1)·max_k (1 − g_k)·u_k, for equal stages (f+b)·(P + (m−1)(1−g))
        (shared/reference/dhelix.md §3.4); unequal stages take the slowest stage's steady tick.
        m ≤ P: Σ u_k + (m−1)·max_k max(f_k, b_k) — no tick co-executes, so g does not apply.

    Notes
    -----
    Derivation of the m ≤ P form (equal stages, each leg chunk costs f/2 forward and b/2 backward,
    tick order of dhelix.md §3.3 / ``ir.schedules._wshape``). With m ≤ P no tick holds both a
    forward (needs t < m) and a backward (needs t ≥ P). On the turnaround stage P−1 the warm-up is
    empty, so its order is down-tick i, up-tick i for i = 0, 1, …: the 2m forward chunks
    F(down, 0) F(up, 0) F(down, 1) … F(up, m−1) run back to back (m·f), then — ticks m … P−1 being
    empty — the 2m backward chunks B(up, 0) B(down, 0) … B(down, m−1) (m·b). Two chains follow:

    * forward-bound: micro-batch 0 reaches stage P−1 after (P−1)·f/2; the serial forwards end
      after m·f more; micro-batch m−1 then climbs P−1 up-chunks ((P−1)·f/2) and runs its whole
      backward (P·b): P(f+b) + (m−1)·f;
    * backward-bound: micro-batch 0's forward ends at P·f, its gradient descends P−1 up-chunks
      ((P−1)·b/2) to stage P−1, whose serial backwards take m·b, and micro-batch m−1's gradient
      descends P−1 down-chunks ((P−1)·b/2): P(f+b) + (m−1)·b.

    So the makespan is at least P(f+b) + (m−1)·max(f, b), and the discrete-event simulator meets
    this bound exactly (tests/test_sim.py::test_wshape_with_m_at_most_P, tests/test_cost.py); the
    turnaround stage's serial runs carry no communication (its legs hand over in memory), which
    is why the increment is compute only. Below 1F1B's (m+P−1)(f+b) for m ≥ 2: the two folded
    chunks per stage fill the ramp like a 2-chunk interleaved schedule. Unequal stages take the
    slowest stage's max(f_k, b_k), as :func:`pipeline_time` takes the slowest u_k.
    """
    P, m = len(stage_times), micro_batches
    if m <= P:
        if compute is None:
            return pipeline_time(stage_times, m)
        if len(compute) != P:
            raise ValueError(f"compute has {len(compute)} (f, b) pairs for {P} stages")
        return sum(stage_times) + (m - 1) * max(max(f, b) for f, b in compute)
    steady = max((1 - g) * u for u, g in zip(stage_times, savings))
    return sum(stage_times) + (m - 1) * steady


def stage_edge_cost(model: ModelConfig, train: TrainingConfig, link: Link,
                    profile: Profile = DEFAULT_PROFILE) -> float:
    """Seconds to move one boundary tensor (b·s·h activations or gradients) between two stages."""
    return p2p_time(boundary_bytes(model, train), link, profile)


def boundary_bytes(model: ModelConfig, train: TrainingConfig) -> int:
    """Bytes of one boundary tensor between pipeline stages: b·s·h elements of the training dtype."""
    return train.micro_batch * train.seq_len * model.hidden * train.dtype_bytes


def cluster_link(cluster: Cluster, node_a: int, node_b: int) -> Link:
    """The cost model's view of the link between two nodes (intra-node when equal)."""
    bw, lat = cluster.node_link(node_a, node_b)
    return Link(bw, lat)


def cluster_links(cluster: Cluster) -> list[Link]:
    """Every distinct link of the cluster (inside a node or between two), each (bandwidth, latency)
    once: what a minimum over links needs (64 nodes have 2,080 pairs but a few distinct links)."""
    n = len(cluster.nodes)
    return list(dict.fromkeys(cluster_link(cluster, a, b) for a in range(n) for b in range(a, n)))
