"""The profiler: measure this machine and write a :class:`~hexhelix.ir.profile.Profile`
(schema ``hexhelix.profile/1``) that the cost model reads.

What is measured (each a median over ``repeats`` after ``warmup`` runs):

* the machine's peak dense GEMM rate (square GEMMs of growing size) and its memory bandwidth
  (a large tensor copy) — on a CPU these *are* the "GPU type" and go to ``gpu_overrides``;
* every compute op of one transformer layer (:func:`hexhelix.ir.opgraph.build_layer_graph`) and
  of the embedding/head at the sizes the plan uses (model, micro-batch, sequence length, each TP
  degree), as the equivalent torch kernel; the efficiency of an op class is the graph's own work
  (FLOPs for GEMM/attention, bytes for norm/elementwise) divided by peak × measured time, summed
  over the class, so the cost model's ``op.flops / (peak × eff)`` reproduces the measured sum;
* the runtime's own stage module (:class:`~hexhelix.runtime.torch_model.StageModule`, collectives
  off) forward+backward with 1 and 3 layers at the same sizes: the per-layer slope over the sum of
  the layer's isolated kernels (autograd bookkeeping, the runtime's RoPE and norms, cold caches)
  is folded into the efficiencies (:func:`calibrate`); the intercept is recorded as a diagnostic;
* the bytes autograd saves per layer of that module, and whether an attention score matrix is
  among them (``attention_scores_saved``);
* the runtime's AdamW step over a 3-layer stage (the ``optimizer`` efficiency);
* collectives and point-to-point messages over gloo/NCCL (:mod:`.profiler_comm`), each
  collective also as a step issues it (after a GEMM, on a fresh tensor), fitted to the
  cost model's α–β form, and the overlap factor (OEF, DHelix Eq. 1) of each compute class with
  each communication class; compute with compute is measured with two CUDA streams, or on a CPU
  with two threads per rank while two ranks run (a rank's device is its core); on a single GPU
  communication is stood in for by a copy on a second stream.

The runtime may not import the solver, so the cost model's ring step count and ring factor reach
:func:`calibrate` as arguments (the CLI passes ``hexhelix.solver.cost``'s functions).
"""

from __future__ import annotations

import logging
import math
import platform
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hexhelix.ir.checks import check_seconds
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import ModelConfig, TrainingConfig
from hexhelix.ir.opgraph import OpClass, build_layer_graph
from hexhelix.ir.profile import Profile

from .profiler_calibrate import COMPUTE_CLASSES, Measurements, StepsFn, calibrate, local_cluster
from .profiler_comm import COLLECTIVES, CommSpec, oef, run_comm_profile
from .profiler_kernels import (
    layer_kernels,
    layer_saved_tensors,
    make_kernel,
    make_layer_step,
    make_optimizer_step,
)

__all__ = ["Measurements", "ProfileOptions", "calibrate", "local_cluster", "measure", "profile_machine",
           "time_fn"]

logger = logging.getLogger(__name__)
Progress = Callable[[str], None]
#: Layer counts of the runtime stage module the profiler times (the per-layer cost is the slope
#: between them). A calibration program, not a fidelity case: no benchmarked stage has 1 or 3
#: layers at micro-batch 1 (benchmarks/fidelity.py).
CALIBRATION_LAYERS = (1, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOptions:
    """What to measure. ``quick`` shrinks sizes and repeats for tests and smoke runs."""

    model: ModelConfig
    training: TrainingConfig
    tp_degrees: tuple[int, ...] = (1, 2)
    nproc: int = 2
    backend: str = "gloo"
    quick: bool = False
    warmup: int = 3
    repeats: int = 9
    threads: int = 1  # torch threads per rank, 1 as torchrun sets (OMP_NUM_THREADS=1); 0: torch's default
    gpu_type: str | None = None
    seed: int = 0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise InvalidInputError(f"must be gloo or nccl, got {self.backend!r}", field="--backend")
        if self.nproc < 1:
            raise InvalidInputError(f"must be at least 1, got {self.nproc}", field="--nproc")
        if self.warmup < 0 or self.repeats < 1:
            raise InvalidInputError("warm-up must be ≥ 0 and repeats ≥ 1", field="--repeats")
        if self.threads < 0:
            raise InvalidInputError(f"must be ≥ 0 (0: torch's default), got {self.threads}", field="--threads")
        check_seconds(self.timeout_s, "--timeout", positive=True)
        if self.gpu_type is not None and not self.gpu_type.strip():
            raise InvalidInputError("must be a non-empty name", field="--gpu-type")
        for t in self.tp_degrees:
            self.model.check_tp(t)

    @property
    def cuda(self) -> bool:
        return self.backend == "nccl"

    @property
    def clock(self) -> Callable[[], float]:
        """Compute kernels on a CPU with one thread are timed by the thread's CPU clock (immune to
        other jobs sharing the cores); everything else by wall time."""
        return time.thread_time if not self.cuda and self.threads == 1 else time.perf_counter

    @property
    def dtype(self) -> str:
        """Compute dtype of the kernels: bf16 on CUDA, fp32 on CPU (what the runtime uses there)."""
        return "bf16" if self.cuda else "fp32"


# ----------------------------------------------------------------------------- timing
def time_fn(fn: Callable[[], Any], *, warmup: int, repeats: int, sync: Callable[[], None] | None = None,
            min_run_s: float = 2e-3, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of one call of ``fn``.

    Calls are batched so one timed run lasts at least ``min_run_s`` (a 5 µs kernel is timed as
    a few hundred back-to-back calls, not against the timer's resolution); ``sync`` (e.g.
    ``torch.cuda.synchronize``) closes every timed run. ``clock`` is wall time by default;
    single-threaded CPU kernels pass ``time.thread_time`` so that other jobs on the cores do not
    inflate the result (the CPU analogue of timing a GPU kernel with CUDA events).
    """
    sync = sync or (lambda: None)
    fn()
    sync()
    t0 = clock()
    fn()
    sync()
    one = max(clock() - t0, 1e-7)
    inner = max(1, min(10_000, math.ceil(min_run_s / one)))
    samples: list[float] = []
    for i in range(warmup + repeats):
        t0 = clock()
        for _ in range(inner):
            fn()
        sync()
        if i >= warmup:
            samples.append((clock() - t0) / inner)
    return float(statistics.median(samples))


# ----------------------------------------------------------------------------- compute side
def _device_names(opts: ProfileOptions) -> tuple[str, str]:
    """(human description, GPU-type name for the cluster file)."""
    import torch

    if opts.cuda:
        if not torch.cuda.is_available():
            raise InvalidInputError("--backend nccl needs a CUDA device; this machine has none "
                                    "(use --backend gloo)", field="--backend")
        name = torch.cuda.get_device_name(0)
        return name, opts.gpu_type or _catalog_name(name)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"CPU {cpu} ({torch.get_num_threads()} torch threads)", opts.gpu_type or "cpu"


def _catalog_name(device_name: str) -> str:
    """Map ``torch.cuda.get_device_name`` (``NVIDIA H200``) to a catalog row when one matches."""
    from hexhelix.ir.catalog import CATALOG, lookup_gpu

    short = device_name.replace("NVIDIA", "").strip()
    hit = lookup_gpu(short) or lookup_gpu(short.replace(" ", "-"))
    if hit:
        return hit.name
    for row in CATALOG:
        if row.split("-")[0] in short.split():
            return row
    return short.replace(" ", "-")


def measure_compute(opts: ProfileOptions, progress: Progress) -> Measurements:
    """Peak GEMM rate, memory bandwidth, every op of the layer at each TP degree, and the ratio of
    one whole layer's forward+backward through autograd to the sum of its isolated kernels."""
    import torch

    if opts.threads > 0:
        torch.set_num_threads(opts.threads)
    desc, gtype = _device_names(opts)
    device = torch.device("cuda", 0) if opts.cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if opts.cuda else None
    m = Measurements(device=desc, gpu_type=gtype, backend=opts.backend)
    w, r = (1, 3) if opts.quick else (opts.warmup, opts.repeats)
    clk = opts.clock
    sizes = ((256, 512) if opts.quick else (512, 1024, 2048)) if not opts.cuda else (
        (2048, 4096) if opts.quick else (4096, 8192))
    for n in sizes:
        progress(f"profile: peak GEMM {n}x{n}x{n} ({opts.dtype})")
        t = time_fn(make_kernel(("gemm", n, n, n, "nn"), device, opts.dtype, seed=opts.seed),
                    warmup=w, repeats=r, sync=sync, clock=clk)
        m.peak_flops = max(m.peak_flops, 2.0 * n**3 / t)
    nbytes = (64 if opts.quick else 256) * 2**20 * (4 if opts.cuda else 1)  # well beyond caches
    progress(f"profile: memory bandwidth (copy of {nbytes / 2**20:.0f} MiB)")
    t = time_fn(make_kernel(("copy", nbytes), device, opts.dtype, seed=opts.seed), warmup=w, repeats=r, sync=sync, clock=clk)
    m.mem_Bps = 2.0 * nbytes / t  # read + write
    overhead: dict[int, float] = {}
    saved: dict[int, int] = {}
    stage_fit: dict[int, dict[str, float]] = {}
    scores: list[bool] = []
    k1, k2 = CALIBRATION_LAYERS
    for tp in opts.tp_degrees:
        kernels = layer_kernels(opts.model, opts.training, tp)
        progress(f"profile: {len(kernels)} compute ops of {opts.model.name} at TP {tp}")
        layer_s, layer_ops = 0.0, {o.name for o in build_layer_graph(opts.model, opts.training, tp).ops}
        for op, spec in kernels:
            t = time_fn(make_kernel(spec, device, opts.dtype, seed=opts.seed), warmup=w, repeats=r, sync=sync, clock=clk)
            m.ops.append({"tp": tp, "name": op.name, "class": op.op_class.value, "flops": op.flops,
                          "mem_bytes": op.mem_bytes, "seconds": t})
            layer_s += t if op.name in layer_ops else 0.0
        progress(f"profile: the runtime's stage module ({k1} and {k2} layers) forward+backward at TP {tp}")
        t1, t2 = (time_fn(make_layer_step(opts.model, opts.training, tp, device, opts.dtype, layers=k,
                                          seed=opts.seed), warmup=w, repeats=r, sync=sync, clock=clk)
                  for k in (k1, k2))
        per_layer = (t2 - t1) / (k2 - k1)
        if per_layer <= 0:  # noise swamped the difference: the longer run's mean per layer
            per_layer = t2 / k2
        overhead[tp] = per_layer / layer_s
        stage_fit[tp] = {"layers": [k1, k2], "seconds": [t1, t2], "per_layer_s": per_layer,
                         "intercept_s": t1 - k1 * per_layer, "kernel_sum_s": layer_s}
        b1, sc1 = layer_saved_tensors(opts.model, opts.training, tp, device, opts.dtype, layers=k1, seed=opts.seed)
        b2, sc2 = layer_saved_tensors(opts.model, opts.training, tp, device, opts.dtype, layers=k2, seed=opts.seed)
        saved[tp] = (b2 - b1) // (k2 - k1)
        scores.append(sc1 or sc2)
    m.meta["layer_overhead"] = overhead
    # The fixed part of a stage's F+B (intercept) is recorded as a diagnostic: on the CPU it is
    # below the timing noise, so the cost model has no per-instruction term.
    m.meta["stage_step_fit"] = stage_fit
    # Bytes autograd saves per layer and micro-batch in the runtime's layer, and whether an
    # attention score matrix was among them (calibrate sets attention_scores_saved from it).
    m.meta["saved_activation_bytes_per_layer"] = saved
    m.meta["attention_scores_saved"] = any(scores)
    progress(f"profile: the runtime's AdamW step over a {k2}-layer stage")
    step, nparams = make_optimizer_step(opts.model, opts.training, min(opts.tp_degrees), device, opts.dtype,
                                        layers=k2, seed=opts.seed)
    t = time_fn(step, warmup=w, repeats=r, sync=sync, clock=clk)
    m.meta["optimizer"] = {"params": nparams, "seconds": t,
                           "state_bytes_per_param": opts.training.state_bytes_per_param}
    # The peak is the best GEMM rate seen, square or at the plan's shapes (so no GEMM efficiency
    # exceeds 1 because the square runs met a busier moment of a shared machine).
    best = max((o["flops"] / o["seconds"] for o in m.ops if o["class"] == "gemm"), default=0.0)
    m.meta["square_gemm_peak_tflops"] = m.peak_flops / 1e12
    m.peak_flops = max(m.peak_flops, best)
    m.meta["compute_dtype"] = opts.dtype
    m.meta["compute_clock"] = "thread CPU time" if clk is time.thread_time else "wall time"
    m.meta["torch_threads"] = torch.get_num_threads()
    return m


def _pick_oef_kernels(opts: ProfileOptions) -> tuple[tuple[str, tuple], ...]:
    """One representative kernel per compute class: its longest op at the largest TP degree."""
    tp = max(opts.tp_degrees)
    best: dict[str, tuple[float, tuple]] = {}
    for op, spec in layer_kernels(opts.model, opts.training, tp):
        cls = op.op_class.value
        work = op.flops if op.op_class in (OpClass.GEMM, OpClass.ATTENTION) else op.mem_bytes
        if cls in COMPUTE_CLASSES and work > best.get(cls, (-1.0, ()))[0]:
            best[cls] = (work, spec)
    classes = ("gemm",) if opts.quick else COMPUTE_CLASSES  # --quick: the pairs that matter most
    return tuple((c, best[c][1]) for c in classes if c in best)


def measure_local_overlap(opts: ProfileOptions, progress: Progress) -> dict[str, dict[str, Any]]:
    """OEF of compute with compute (two threads on CPU, two streams on CUDA) and, on one GPU,
    of compute with a device-to-host copy on a side stream (stand-in for communication)."""
    import torch

    device = torch.device("cuda", 0) if opts.cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if opts.cuda else None
    w, r = (1, 3) if opts.quick else (opts.warmup, opts.repeats)
    picks = _pick_oef_kernels(opts)
    if opts.cuda:
        progress(f"profile: overlap of compute with compute ({len(picks)} classes, two streams)")
    out: dict[str, dict[str, Any]] = {}

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hexhelix-oef")
    target = 2e-3 if opts.quick else 5e-3

    def segment(fn: Callable[[], Any]) -> tuple[Callable[[], None], int]:
        """``fn`` repeated so one call lasts about ``target`` seconds (launch overheads of a
        side thread or stream then stay small against the work that overlaps)."""
        reps = max(1, min(10_000, round(target / time_fn(fn, warmup=1, repeats=3, sync=sync))))

        def run() -> None:
            for _ in range(reps):
                fn()
        return run, reps

    def concurrent(fa: Callable[[], Any], fb: Callable[[], Any]) -> Callable[[], None]:
        if opts.cuda:
            sa, sb = torch.cuda.Stream(), torch.cuda.Stream()

            def run() -> None:
                with torch.cuda.stream(sa):
                    fa()
                with torch.cuda.stream(sb):
                    fb()
            return run

        def run_cpu() -> None:
            fut = pool.submit(fb)
            fa()
            fut.result()
        return run_cpu

    def measure_pair(key: str, fa: Callable[[], Any], fb: Callable[[], Any]) -> None:
        (sa, ra), (sb, rb) = segment(fa), segment(fb)
        ta = time_fn(sa, warmup=w, repeats=r, sync=sync)
        tb = time_fn(sb, warmup=w, repeats=r, sync=sync)
        tab = time_fn(concurrent(sa, sb), warmup=w, repeats=r, sync=sync)
        out[key] = {"oef": oef(ta, tb, tab), "t_a": ta, "t_b": tb, "t_ab": tab, "reps": [ra, rb]}

    # On a CPU compute with compute is measured by the ranks (two threads per rank while the
    # ranks run, OpenMP pinned to 1 thread as torchrun does), not here.
    for i, (ca, sa) in enumerate(picks if opts.cuda else ()):
        for cb, sb in picks[i:]:
            measure_pair(f"{ca}|{cb}", make_kernel(sa, device, opts.dtype, seed=opts.seed),
                         make_kernel(sb, device, opts.dtype, seed=opts.seed + 1))
    if opts.cuda and torch.cuda.device_count() < 2:
        # One GPU: overlap with a copy to pinned host memory on a side stream stands in for a
        # collective (it shares memory bandwidth but not SMs, so it is an optimistic proxy).
        nbytes = opts.training.micro_batch * opts.training.seq_len * opts.model.hidden * 2
        host = torch.empty(nbytes // 2, dtype=torch.bfloat16, pin_memory=True)
        dev = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
        copy = lambda: host.copy_(dev, non_blocking=True)  # noqa: E731
        progress("profile: overlap of compute with a copy stream (one GPU)")
        for ca, sa in picks:
            measure_pair(f"{ca}|send_recv", make_kernel(sa, device, opts.dtype, seed=opts.seed), copy)
            for comm in COLLECTIVES:
                out[f"{ca}|{comm}"] = dict(out[f"{ca}|send_recv"], proxy="copy stream")
            out[f"{ca}|send_recv"]["proxy"] = "copy stream"
    pool.shutdown()
    return out


# ----------------------------------------------------------------------------- driver
def _versions(opts: ProfileOptions) -> dict[str, Any]:
    import sys

    import torch

    v: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                         "platform": platform.platform(), "host": platform.node()}
    try:
        from importlib.metadata import version

        v["hexhelix"] = version("hexhelix")
    except Exception:
        v["hexhelix"] = "unknown"
    if opts.cuda:
        v["cuda"] = torch.version.cuda
        nv = torch.cuda.nccl.version()
        v["nccl"] = ".".join(str(x) for x in nv) if isinstance(nv, tuple) else str(nv)
    else:
        v["gloo"] = "bundled with torch " + torch.__version__
    return v


def _cuda_reserve() -> int:
    """CUDA context and library workspace: device memory in use that the allocator does not own."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(total - free - torch.cuda.memory_reserved())


def measure(opts: ProfileOptions, *, progress: Progress | None = None) -> Measurements:
    """Run every measurement :class:`ProfileOptions` asks for (compute, overlap, communication)."""
    progress = progress or (lambda msg: logger.info(msg))
    t0 = time.perf_counter()
    m = measure_compute(opts, progress)
    m.oef.update(measure_local_overlap(opts, progress))
    if opts.cuda:
        m.reserve_bytes = _cuda_reserve()
    can_comm = opts.nproc >= 2
    if opts.cuda:
        import torch

        can_comm = can_comm and torch.cuda.device_count() >= opts.nproc
    if can_comm:
        tp = max(opts.tp_degrees)
        payload = opts.training.micro_batch * opts.training.seq_len * opts.model.hidden * \
            (2 if opts.dtype != "fp32" else 4)
        sizes = (2**10, 2**20, 2**24) if opts.quick else tuple(4**k for k in range(5, 13))
        spec = CommSpec(nproc=opts.nproc, backend=opts.backend, sizes=sizes, warmup=1 if opts.quick else opts.warmup,
                        repeats=3 if opts.quick else opts.repeats, dtype=opts.dtype, oef_bytes=max(payload, 4096),
                        oef_compute=_pick_oef_kernels(opts), threads=opts.threads, timeout_s=opts.timeout_s,
                        seed=opts.seed)
        raw = run_comm_profile(spec, progress=progress)
        m.comm = {"collectives": raw["collectives"], "send_recv": raw["send_recv"],
                  "collectives_in_step": raw.get("collectives_in_step", [])}
        m.oef.update(raw["oef"])
        if not opts.cuda:
            m.reserve_bytes = int(raw["rss_after_init"])
        m.meta["oef_tp_degree"] = tp
    else:
        m.meta["comm"] = "not measured (fewer than 2 ranks/devices); link fields keep their defaults"
    m.meta.update({"versions": _versions(opts), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "elapsed_s": time.perf_counter() - t0,
                   "options": {"model": opts.model.name, "seq_len": opts.training.seq_len,
                               "micro_batch": opts.training.micro_batch, "dtype_accounting": opts.training.dtype,
                               "tp_degrees": list(opts.tp_degrees), "nproc": opts.nproc, "quick": opts.quick,
                               "warmup": opts.warmup, "repeats": opts.repeats, "seed": opts.seed},
                   "reserve_method": ("CUDA context: total - free - allocator reserved" if opts.cuda else
                                      "RSS of a rank after torch import and process-group init"
                                      if can_comm else "not measured (default kept)")})
    return m


def profile_machine(opts: ProfileOptions, *, steps: StepsFn, factor: StepsFn,
                    progress: Progress | None = None) -> Profile:
    """Measure this machine and return the calibrated Profile (see :func:`calibrate`)."""
    return calibrate(measure(opts, progress=progress), steps=steps, factor=factor)
