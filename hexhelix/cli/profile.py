"""``hexhelix profile``: measure this machine and write a profile (schema hexhelix.profile/1).

The profile calibrates the cost model (``--profile profile.json`` on plan, compare, pair and
compile). On a CPU the machine's cores are the "GPU type": the profile records their measured
peak under ``gpu_overrides["cpu"]`` and ``--cluster-out`` writes a one-node cluster file whose
``gpu_types: {cpu: {tflops: <measured>, memory_gib: ...}}`` and intra-node link (the measured
point-to-point α and β) go with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import yaml

from hexhelix.ir.catalog import SPEC_MAX
from hexhelix.ir.checks import finite_number
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.opgraph import OpClass

from .common import add_model_args, emit_json, load_inputs, progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure this machine and write a cost-model profile",
        description="Measure GEMM/attention FLOP rates and norm/elementwise throughput at the model's "
                    "sizes, the runtime's stage module through autograd (framework overhead), its saved "
                    "activations and AdamW step, collective (as a step issues them) and point-to-point "
                    "α/β over 2..N ranks, and compute/communication overlap factors (DHelix OEF); write a "
                    "hexhelix.profile/1 JSON for --profile. On a CPU the measured type is 'cpu'; "
                    "--cluster-out writes the one-node cluster file that refers to it. Progress goes to stderr.")
    add_model_args(p, cluster=False)
    p.set_defaults(model="tiny", seq_len=256)
    for a in p._actions:  # --model is optional here (default: tiny); --profile is the base profile
        if a.dest == "model":
            a.required = False
            a.help = "model whose op sizes to measure (default tiny)"
        if a.dest == "profile":
            a.help = "base profile whose unmeasured fields are kept (default: documented defaults)"
        if a.dest == "seq_len":
            a.help = "sequence length of the measured ops (default 256 here)"
    p.add_argument("--nproc", type=int, default=2, help="ranks for the communication profile (default 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="gloo on CPU (default), nccl on CUDA (one rank per GPU)")
    p.add_argument("--tp", default="1,2", help="TP degrees whose op sizes to measure (default 1,2)")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (seconds, for smoke tests)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up runs per measurement (default 3)")
    p.add_argument("--repeats", type=int, default=9, help="timed runs per measurement; medians (default 9)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per rank (default 1, what torchrun gives each rank; 0: torch's default)")
    p.add_argument("--gpu-type", default=None,
                   help="name of the measured type in the profile (default: cpu, or the catalog GPU)")
    p.add_argument("--timeout", type=float, default=300.0, help="limit for the multi-rank part, s (default 300)")
    p.add_argument("-o", "--output", default=None, help="profile JSON path (default: stdout)")
    p.add_argument("--cluster-out", default=None,
                   help="also write a one-node cluster YAML for this machine (measured type and link)")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="memory per rank in the cluster file (default: RAM / nproc on CPU, the device's on CUDA)")
    p.set_defaults(func=run)


def _tp_list(spec: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise InvalidInputError(f"expected comma-separated integers, got {spec!r}", field="--tp") from None
    if not out or min(out) < 1:
        raise InvalidInputError(f"expected positive TP degrees, got {spec!r}", field="--tp")
    return out


def _memory_gib(args: argparse.Namespace) -> float:
    if args.memory_gib is not None:
        if not finite_number(args.memory_gib) or not 0 < args.memory_gib <= SPEC_MAX:
            raise InvalidInputError(f"must be a positive number of GiB, got {args.memory_gib!r}", field="--memory-gib")
        return float(args.memory_gib)
    if args.backend == "nccl":
        import torch

        return round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return round(ram / 2**30 / max(1, args.nproc), 1)


def run(args: argparse.Namespace) -> int:
    from hexhelix.runtime.profiler import ProfileOptions, calibrate, local_cluster, measure
    from hexhelix.solver import cost

    if args.memory_gib is not None:
        _memory_gib(args)  # checked before minutes of measuring
    _, model, training, base = load_inputs(args)
    # Ops are accounted in the dtype the kernels run in: the torch runtime computes in fp32 on a
    # CPU and bf16 on CUDA; plan and compile with the same dtype for the profile to apply.
    training = dataclasses.replace(training, dtype="bf16" if args.backend == "nccl" else "fp32")
    opts = ProfileOptions(model=model, training=training, tp_degrees=_tp_list(args.tp), nproc=args.nproc,
                          backend=args.backend, quick=args.quick, warmup=args.warmup, repeats=args.repeats,
                          threads=args.threads, gpu_type=args.gpu_type, timeout_s=args.timeout)
    raw = measure(opts, progress=progress)
    prof = calibrate(raw, base=base,
                     steps=lambda c, n: float(cost.collective_steps(OpClass(c), n)),
                     factor=lambda c, n: cost.ring_factor(OpClass(c), n))
    emit_json(prof.to_dict(), args.output)
    gt = prof.meta["gpu_type"]
    eff = prof.per_gpu_efficiency.get(gt, {})
    progress(f"profile: {prof.device}: peak {prof.meta['measured_peak_tflops'] * 1e3:.1f} GFLOP/s, memory "
             f"{prof.meta['measured_mem_GBps']:.1f} GB/s; efficiency "
             + ", ".join(f"{k} {v:.3f}" for k, v in eff.items())
             + (f" -> {args.output}" if args.output else ""))
    progress(f"profile: attention scores saved by autograd: {str(prof.attention_scores_saved).lower()} "
             f"(the activation formula {'keeps' if prof.attention_scores_saved else 'drops'} 5·a·s²·b)")
    if "cluster_link" in prof.meta:
        lk = prof.meta["cluster_link"]
        progress(f"profile: point-to-point link {lk['intra_GBps']:.3f} GB/s, α {lk['intra_latency_us']:.1f} µs")
    if args.cluster_out:
        cl = local_cluster(prof, count=args.nproc, memory_gib=_memory_gib(args))
        header = (f"# Generated by `hexhelix profile` on {prof.device} ({prof.meta['date']}).\n"
                  f"# Use it with the profile it came from: --cluster {args.cluster_out} "
                  f"--profile {args.output or 'profile.json'}\n")
        Path(args.cluster_out).write_text(header + yaml.safe_dump(cl, sort_keys=False))
        progress(f"profile: cluster file -> {args.cluster_out}")
    return 0
