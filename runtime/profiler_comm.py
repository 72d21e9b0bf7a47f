"""Communication half of the profiler: collective and point-to-point timings across message sizes
and group sizes, the overlap of compute with concurrent communication (DHelix Eq. 1), and the
least-squares α–β fit.

Ranks are spawned with :mod:`torch.multiprocessing` and joined by gloo over loopback (CPU) or
NCCL (one process per CUDA device). Every timing is a median over ``repeats`` runs after
``warmup`` runs; one run of a collective is timed on every member between a group barrier and the
end of the op, and the run's time is the slowest member's (an all-reduce MAX once per series),
because a collective is over when its last member is done.

References
----------
DHelix (arXiv 2411.15871) §3 Eq. 1 and its ``micro_benchmark/overlap.py``: OEF(a, b) =
(T_a + T_b − T_ab) / min(T_a, T_b), with the two ops launched together on different streams;
shared/reference/dhelix.md §2.1–2.2.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hexhelix.ir.errors import HexhelixError, InvalidInputError

__all__ = [
    "COLLECTIVES",
    "CommSpec",
    "FitResult",
    "fit_alpha_beta",
    "free_port",
    "oef",
    "run_comm_profile",
]

logger = logging.getLogger(__name__)

#: Collective classes measured on every group size; ``send_recv`` is measured between two ranks.
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter")


# ----------------------------------------------------------------------------- pure helpers
def oef(t_a: float, t_b: float, t_ab: float) -> float:
    """Overlap effectiveness factor of co-executing ops ``a`` and ``b`` (DHelix Eq. 1).

    ``1`` means the shorter op is fully hidden (T_ab = max), ``0`` no gain (T_ab = T_a + T_b),
    negative values mean co-execution is slower than running the two one after the other.

    >>> oef(2.0, 1.0, 2.0), oef(2.0, 1.0, 3.0), oef(2.0, 1.0, 3.5)
    (1.0, 0.0, -0.5)
    """
    if min(t_a, t_b) <= 0:
        raise ValueError(f"solo times must be positive, got {t_a}, {t_b}")
    return (t_a + t_b - t_ab) / min(t_a, t_b)


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """α (seconds per step) and β (bytes/s) of T = steps·α + bytes/β, and the fit's quality."""

    alpha_s: float
    beta_Bps: float
    rel_rms: float
    points: int

    def to_dict(self) -> dict[str, float]:
        return {"alpha_us": self.alpha_s * 1e6, "GBps": self.beta_Bps / 1e9,
                "rel_rms": self.rel_rms, "points": self.points}


def fit_alpha_beta(rows: Sequence[tuple[float, float, float]]) -> FitResult:
    """Least-squares fit of T_i = steps_i·α + bytes_i/β over rows ``(steps_i, bytes_i, T_i)``.

    Residuals are relative (each row divided by T_i), so a 1 KiB message and a 16 MiB one weigh
    the same; α is clamped at 0 (a negative latency is noise on a bandwidth-bound series) and β
    refitted alone in that case.

    Parameters
    ----------
    rows : (steps, bytes, seconds) per measurement; ``bytes`` is what the model divides by β
        (the ring factor already applied by the caller), ``steps`` the α multiplier.

    Returns
    -------
    FitResult with α in seconds, β in bytes/s and the relative RMS residual.

    Raises
    ------
    InvalidInputError
        Fewer than two rows, non-positive times, or data with no bandwidth term.

    Examples
    --------
    >>> r = fit_alpha_beta([(1, s, 10e-6 + s / 2e9) for s in (1e3, 1e5, 1e7)])
    >>> round(r.alpha_s * 1e6, 3), round(r.beta_Bps / 1e9, 3)
    (10.0, 2.0)
    """
    if len(rows) < 2:
        raise InvalidInputError(f"need at least 2 measurements to fit α and β, got {len(rows)}",
                                field="rows")
    a = np.array([[s, b] for s, b, _ in rows], dtype=float)
    t = np.array([r[2] for r in rows], dtype=float)
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise InvalidInputError("every measured time must be positive and finite", field="rows")
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    alpha, inv_beta = float(coef[0]), float(coef[1])
    if alpha < 0:
        alpha = 0.0
        b = a[:, 1] * w
        inv_beta = float(np.dot(b, t * w) / np.dot(b, b)) if np.dot(b, b) > 0 else 0.0
    if inv_beta <= 0:
        raise InvalidInputError("the measurements show no bandwidth term (time does not grow with "
                                "bytes); measure larger messages", field="rows")
    pred = a[:, 0] * alpha + a[:, 1] * inv_beta
    rel = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return FitResult(alpha_s=alpha, beta_Bps=1.0 / inv_beta, rel_rms=rel, points=len(rows))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- worker side
@dataclass(frozen=True, slots=True, kw_only=True)
class CommSpec:
    """What the ranks measure (picklable: it travels to spawned processes)."""

    nproc: int
    backend: str
    sizes: tuple[int, ...]
    warmup: int
    repeats: int
    dtype: str
    oef_bytes: int
    oef_compute: tuple[tuple[str, Any], ...]  # (class, kernel spec for profiler.make_kernel)
    threads: int
    timeout_s: float
    seed: int


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


class _Rank:
    """One rank's measuring context (process group handles, device, sync)."""

    def __init__(self, rank: int, spec: CommSpec, port: int):
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.spec, self.rank = torch, dist, spec, rank
        if spec.threads > 0:
            torch.set_num_threads(spec.threads)
        self.cuda = spec.backend == "nccl"
        if self.cuda:
            torch.cuda.set_device(rank)
            self.device = torch.device("cuda", rank)
        else:
            self.device = torch.device("cpu")
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[spec.dtype]
        dist.init_process_group(spec.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=spec.nproc, timeout=timedelta(seconds=spec.timeout_s))
        # Sub-groups 0..n-1 for n = 2..N, created in the same order on every rank.
        self.groups = {n: dist.new_group(list(range(n))) for n in range(2, spec.nproc + 1)}

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def coll(self, name: str, n: int, nbytes: int, *, async_op: bool = False,
             fresh: bool = False) -> Callable[[], Any]:
        """A closure running collective ``name`` of ``nbytes`` payload (full tensor) on group n;
        ``fresh``: an all-reduce runs on a new copy each call, as the runtime's TP operators do."""
        torch, dist = self.torch, self.dist
        g = self.groups[n]
        el = max(n, (nbytes // torch.tensor([], dtype=self.dtype).element_size()) // n * n)
        full = torch.ones(el, dtype=self.dtype, device=self.device)
        part = torch.empty(el // n, dtype=self.dtype, device=self.device)
        if name == "all_reduce" and fresh:
            return lambda: dist.all_reduce(full.clone(), group=g, async_op=async_op)
        if name == "all_reduce":
            return lambda: dist.all_reduce(full, group=g, async_op=async_op)
        if name == "all_gather":
            ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: ag(full, part, group=g, async_op=async_op)
        if name == "reduce_scatter":
            rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: rs(part, full, group=g, async_op=async_op)
        raise ValueError(name)

    def p2p(self, nbytes: int, *, async_op: bool = False, pingpong: bool = False) -> Callable[[], Any]:
        """A message of ``nbytes`` from rank 0 to rank 1 (ranks ≥ 2 do nothing); with
        ``pingpong`` rank 1 sends it back, so a timed call is a round trip (two messages)."""
        torch, dist = self.torch, self.dist
        buf = torch.ones(max(1, nbytes // torch.tensor([], dtype=self.dtype).element_size()),
                         dtype=self.dtype, device=self.device)

        def run() -> Any:
            if self.rank > 1:
                return None
            me, peer = self.rank, 1 - self.rank
            w = dist.isend(buf, peer, tag=7) if me == 0 else dist.irecv(buf, peer, tag=7)
            if pingpong:
                w.wait()
                w = dist.irecv(buf, peer, tag=8) if me == 0 else dist.isend(buf, peer, tag=8)
            return w if async_op else w.wait()
        return run

    def time_series(self, fn: Callable[[], Any], members: int, *, min_run_s: float = 4e-3) -> float:
        """Median over repeats of the slowest member's time of one call of ``fn``.

        A timed run is ``inner`` back-to-back calls after a group barrier (``inner`` chosen so
        a run lasts ``min_run_s``, the same on every member), which amortises the barrier's exit
        skew over many calls."""
        torch, dist = self.torch, self.dist
        g = self.groups[members]

        def run(inner: int) -> float:
            self.sync()
            dist.barrier(group=g)
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            self.sync()
            return (time.perf_counter() - t0) / inner

        def slowest(xs: list[float]) -> list[float]:
            t = torch.tensor(xs, dtype=torch.float64)
            t = t.to(self.device) if self.cuda else t
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
            return t.cpu().tolist()

        one = slowest([run(1)])[0]
        inner = int(min(1000, max(1, math.ceil(min_run_s / max(one, 1e-7)))))
        times = [run(inner) for _ in range(self.spec.warmup + self.spec.repeats)][self.spec.warmup:]
        return _median(slowest(times))


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _report(rank: int, progress: Callable[[str], None] | None, msg: str) -> None:
    if rank == 0 and progress is not None:
        progress(msg)


def _worker(rank: int, spec: CommSpec, port: int, out: str,
            progress: Callable[[str], None] | None) -> None:
    from .profiler_kernels import make_kernel

    ctx = _Rank(rank, spec, port)
    dist = ctx.dist
    results: dict[str, Any] = {"collectives": [], "send_recv": [], "oef": {}}
    dist.all_reduce(ctx.torch.ones(16, device=ctx.device))  # warm the transport before reading RSS
    results["rss_after_init"] = _rss_bytes()
    for n, g in ctx.groups.items():
        for name in COLLECTIVES:
            _report(rank, progress, f"profile: {name} over {n} ranks, {len(spec.sizes)} sizes")
            for size in spec.sizes:
                if rank < n:
                    t = ctx.time_series(ctx.coll(name, n, size), n)
                    results["collectives"].append({"op": name, "n": n, "bytes": size, "seconds": t})
            dist.barrier()
        del g
    _collectives_in_step(ctx, spec, results, progress)
    _report(rank, progress, f"profile: send/recv between 2 ranks, {len(spec.sizes)} sizes")
    if rank < 2:
        for size in spec.sizes:
            t = ctx.time_series(ctx.p2p(size, pingpong=True), 2) / 2.0
            results["send_recv"].append({"op": "send_recv", "n": 2, "bytes": size, "seconds": t})
    dist.barrier()

    # Overlap of one compute class with one communication class on two ranks (DHelix Eq. 1).
    _report(rank, progress, f"profile: overlap of compute with communication ({len(spec.oef_compute)}"
                            f" x {len(COLLECTIVES) + 1} pairs)")
    if rank < 2:
        for cls, kspec in spec.oef_compute:
            kernel = make_kernel(kspec, ctx.device, ctx.dtype, seed=spec.seed)
            for comm in (*COLLECTIVES, "send_recv"):
                solo_comm = ctx.coll(comm, 2, spec.oef_bytes) if comm != "send_recv" else ctx.p2p(spec.oef_bytes)
                async_comm = (ctx.coll(comm, 2, spec.oef_bytes, async_op=True) if comm != "send_recv"
                              else ctx.p2p(spec.oef_bytes, async_op=True))
                t_b = ctx.time_series(solo_comm, 2)
                t_k = ctx.time_series(kernel, 2)
                reps = int(min(1000, max(1, round(t_b / max(t_k, 1e-9)))))  # make T_a ≈ T_b

                def seg(k: Callable[[], Any] = kernel, r: int = reps) -> None:
                    for _ in range(r):
                        k()

                def both(k: Callable[[], None] = seg, c: Callable[[], Any] = async_comm) -> None:
                    w = c()
                    k()
                    if w is not None:
                        w.wait()
                t_a = ctx.time_series(seg, 2)
                t_ab = ctx.time_series(both, 2)
                results["oef"][f"{cls}|{comm}"] = {
                    "oef": oef(t_a, t_b, t_ab), "t_a": t_a, "t_b": t_b, "t_ab": t_ab, "reps": reps}
    if spec.backend == "gloo" and rank < 2:
        _compute_pairs_all_busy(ctx, spec, results["oef"])
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()
    # Leave without interpreter teardown, as the runtime's entry point does: gloo's C++ thread
    # destructors at exit occasionally abort a process ("terminate called without an active
    # exception") after a clean run. The results are written and the group is destroyed.
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _collectives_in_step(ctx: _Rank, spec: CommSpec, results: dict[str, Any],
                         progress: Callable[[str], None] | None) -> None:
    """Each collective as a training step issues it: after a compute kernel (the layer's largest
    GEMM), on a fresh copy of the tensor (the runtime's TP operators clone before an in-place
    all-reduce). A call's time is T(kernel + collective) − T(kernel), the slowest member's.

    Back-to-back calls in a loop measure a different thing on a CPU: the members arrive together
    and the transport's threads stay hot, while in a step every collective follows compute that
    kept the core busy; on the 2-core machine of benchmarks/fidelity.py the in-step all-reduce of
    one b·s·h activation cost about 3x the back-to-back fit. :func:`calibrate` fits α and β from
    these samples when they exist (``results["collectives_in_step"]``)."""
    from .profiler_kernels import make_kernel

    picks = dict(spec.oef_compute)
    if "gemm" not in picks:
        return
    kernel = make_kernel(picks["gemm"], ctx.device, ctx.dtype, seed=spec.seed)
    rows: list[dict[str, Any]] = []
    for n in ctx.groups:
        for name in COLLECTIVES:
            _report(ctx.rank, progress, f"profile: {name} over {n} ranks after compute, {len(spec.sizes)} sizes")
            for size in spec.sizes:
                if ctx.rank < n:
                    coll = ctx.coll(name, n, size, fresh=True)
                    t_k = ctx.time_series(kernel, n, min_run_s=2e-2)
                    t_both = ctx.time_series(lambda c=coll: (kernel(), c()), n, min_run_s=2e-2)
                    rows.append({"op": name, "n": n, "bytes": size, "seconds": max(t_both - t_k, 1e-7),
                                 "t_kernel": t_k, "t_both": t_both})
            ctx.dist.barrier()
    results["collectives_in_step"] = rows


def _compute_pairs_all_busy(ctx: _Rank, spec: CommSpec, out: dict[str, Any]) -> None:
    """OEF of compute with compute (two threads per rank) measured on two ranks at once.

    On a CPU a rank's "device" is its core: a second thread only gains by borrowing a core that
    another rank would use, so the factor that matters for a run is the one measured while every
    rank co-executes, not the single-process one (which overrides it for gloo)."""
    from concurrent.futures import ThreadPoolExecutor

    from .profiler_kernels import make_kernel

    pool = ThreadPoolExecutor(max_workers=1)
    kernels = {c: make_kernel(k, ctx.device, ctx.dtype, seed=spec.seed) for c, k in spec.oef_compute}
    solo = {c: ctx.time_series(k, 2) for c, k in kernels.items()}
    target = max(solo.values()) * 4
    names = list(kernels)
    for i, ca in enumerate(names):
        for cb in names[i:]:
            def seg(c: str) -> Callable[[], None]:
                reps, k = max(1, round(target / max(solo[c], 1e-9))), kernels[c]
                return lambda: [k() for _ in range(reps)]
            fa, fb = seg(ca), seg(cb)

            def both(fa: Callable[[], Any] = fa, fb: Callable[[], Any] = fb) -> None:
                fut = pool.submit(fb)
                fa()
                fut.result()
            t_a, t_b, t_ab = ctx.time_series(fa, 2), ctx.time_series(fb, 2), ctx.time_series(both, 2)
            out[f"{ca}|{cb}"] = {"oef": oef(t_a, t_b, t_ab), "t_a": t_a, "t_b": t_b, "t_ab": t_ab,
                                 "method": "two threads per rank, 2 ranks busy"}
    pool.shutdown()


@contextlib.contextmanager
def patched_environ(updates: dict[str, str], remove: tuple[str, ...] = ()) -> Iterator[None]:
    """Set ``updates`` and unset ``remove`` in the environment that spawned processes inherit,
    restoring every touched variable (present or absent) on exit."""
    saved = {k: os.environ.get(k) for k in (*updates, *remove)}
    for k in remove:
        os.environ.pop(k, None)
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _thread_env(threads: int) -> contextlib.AbstractContextManager[None]:
    """Spawned ranks start with OMP_NUM_THREADS/MKL_NUM_THREADS = ``threads``, as torchrun sets
    them. ``torch.set_num_threads`` alone is not enough: a second Python thread (a co-executed
    strand) would run its kernels with an OpenMP team of the core count, and two spinning teams
    on shared cores slow both by an order of magnitude."""
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return patched_environ({k: str(threads) for k in keys} if threads > 0 else {})


def run_comm_profile(spec: CommSpec, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Spawn ``spec.nproc`` ranks, measure, and return the raw tables rank 0 collected.

    Raises
    ------
    InvalidInputError
        Fewer than 2 ranks, or NCCL requested with fewer CUDA devices than ranks.
    HexhelixError
        A rank failed or the run exceeded ``spec.timeout_s`` (the ranks are terminated).
    """
    import tempfile

    import torch.multiprocessing as mp

    if spec.nproc < 2:
        raise InvalidInputError(f"communication needs at least 2 ranks, got {spec.nproc}", field="--nproc")
    if spec.backend == "nccl":
        import torch

        if torch.cuda.device_count() < spec.nproc:
            raise InvalidInputError(f"--backend nccl with {spec.nproc} ranks needs {spec.nproc} CUDA devices, "
                                    f"found {torch.cuda.device_count()}", field="--nproc")
    try:  # rank 0 reports progress itself when the callback can travel to it
        pickle.dumps(progress)
    except (pickle.PicklingError, AttributeError, TypeError):
        progress = None
    with tempfile.TemporaryDirectory(prefix="hexhelix-profile-") as tmp, _thread_env(spec.threads):
        out = os.path.join(tmp, "comm.json")
        ctx = mp.start_processes(_worker, args=(spec, free_port(), out, progress), nprocs=spec.nproc,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + spec.timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise HexhelixError(f"communication profile exceeded {spec.timeout_s:.0f} s; "
                                        "rerun with --quick or fewer ranks")
        except mp.ProcessRaisedException as err:
            raise HexhelixError(f"a profiling rank failed: {str(err).strip().splitlines()[-1]}") from None
        except mp.ProcessExitedException as err:
            raise HexhelixError(f"a profiling rank exited abnormally: {err}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        return json.loads(Path(out).read_text())


def group_fit_rows(samples: list[dict[str, Any]], steps: Callable[[int], float],
                   factor: Callable[[int], float]) -> list[tuple[float, float, float]]:
    """Rows (steps(n), factor(n)·bytes, seconds) of :func:`fit_alpha_beta` for one op class."""
    return [(steps(s["n"]), factor(s["n"]) * s["bytes"], s["seconds"]) for s in samples
            if math.isfinite(s["seconds"]) and s["seconds"] > 0]
