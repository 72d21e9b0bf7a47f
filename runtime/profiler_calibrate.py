"""Calibration: turn the profiler's raw measurements into the cost model's
:class:`~hexhelix.ir.profile.Profile`, and the one-node cluster file that goes with a CPU profile.

Efficiencies are relative to the catalog's datasheet peak for a known GPU and to the measured peak
and bandwidth otherwise (a CPU); collective α and β are fitted in the cost model's own form (its
step count and ring factor arrive as arguments: the runtime may not import the solver).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.profile import Profile

from .profiler_comm import COLLECTIVES, fit_alpha_beta, group_fit_rows

__all__ = ["COMPUTE_CLASSES", "Measurements", "StepsFn", "calibrate", "local_cluster"]

logger = logging.getLogger(__name__)
COMPUTE_CLASSES = ("gemm", "attention", "norm", "elementwise")


@dataclass(slots=True)
class Measurements:
    """Raw measurements; :func:`calibrate` turns them into a Profile."""

    device: str
    gpu_type: str
    backend: str
    peak_flops: float = 0.0
    mem_Bps: float = 0.0
    ops: list[dict[str, Any]] = field(default_factory=list)
    comm: dict[str, Any] = field(default_factory=dict)
    oef: dict[str, dict[str, float]] = field(default_factory=dict)
    reserve_bytes: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


StepsFn = Callable[[str, int], float]


def _reference_peaks(m: Measurements) -> tuple[float, float, bool]:
    """(peak FLOP/s, memory B/s, override?) the efficiencies are relative to: the catalog's
    datasheet numbers for a known GPU, else the measured peak and bandwidth (CPU, unknown GPU)."""
    from hexhelix.ir.catalog import lookup_gpu

    row = lookup_gpu(m.gpu_type) if m.backend == "nccl" else None
    if row is not None:
        return row.peak_flops, row.mem_GBps * 1e9, False
    return m.peak_flops, m.mem_Bps, True


def calibrate(m: Measurements, *, steps: StepsFn, factor: StepsFn,
              base: Profile | None = None, fold_overhead: bool = True) -> Profile:
    """Turn raw measurements into the cost model's Profile.

    Parameters
    ----------
    m : what :func:`measure` returned.
    steps, factor : ``steps(op_class, n)`` and ``factor(op_class, n)`` of the cost model's
        collective formula T = steps·α + factor·S/β (``hexhelix.solver.cost.collective_steps``
        and ``ring_factor``); the fitted α, β are therefore in the cost model's own units.
    base : profile whose unmeasured fields are kept (default: the documented defaults).
    fold_overhead : divide every compute efficiency by the measured ratio of a layer of the
        runtime's stage module through autograd to the sum of its isolated kernels (mean over the
        TP degrees of ``meta["layer_overhead"]``), so framework overhead is part of the calibrated
        op times; the kernel-only values stay in ``meta["kernel_efficiency"]``. The
        ``optimizer`` class is never folded.

    Returns
    -------
    Profile with ``per_gpu_efficiency[gpu_type]`` (the compute classes, and ``optimizer`` from the
    timed AdamW step in ``meta["optimizer"]``), ``attention_scores_saved`` (from
    ``meta["attention_scores_saved"]``, else the base's), ``gpu_overrides[gpu_type]`` (CPU or a GPU not
    in the catalog), ``links`` (per collective class: ``bw_factor``/``alpha_factor`` relative to
    the measured point-to-point link, whose α and β go to the cluster file, see
    :func:`local_cluster`), ``link_efficiency`` 1.0 when links were measured, measured OEF
    entries, ``runtime_reserve_bytes`` and ``meta`` with every raw table.
    """
    base = base or Profile()
    peak, mem, override = _reference_peaks(m)
    eff: dict[str, float] = {}
    for cls in COMPUTE_CLASSES:
        rows = [o for o in m.ops if o["class"] == cls]
        if not rows:
            continue
        flop_bound = cls in ("gemm", "attention")
        work = sum(o["flops"] if flop_bound else o["mem_bytes"] for o in rows)
        secs = sum(o["seconds"] for o in rows)
        e = work / ((peak if flop_bound else mem) * secs)
        eff[cls] = e
    meta: dict[str, Any] = dict(m.meta)
    meta["kernel_efficiency"] = dict(eff)
    ratios = list(m.meta.get("layer_overhead", {}).values())
    if fold_overhead and ratios:
        # A layer run through autograd takes R x the sum of its isolated kernels (bookkeeping,
        # launches, cold caches); dividing every class's efficiency by R makes the cost model's
        # layer time equal the measured layer time.
        r = statistics.fmean(ratios)
        eff = {k: v / r for k, v in eff.items()}
        meta["overhead_folded"] = r
    for cls, e in eff.items():
        if not 1e-4 <= e <= 1.5:
            logger.warning("measured %s efficiency %.4g clamped to [1e-4, 1.5]", cls, e)
        eff[cls] = min(1.5, max(1e-4, e))
    opt = m.meta.get("optimizer")
    if opt and opt.get("seconds", 0) > 0:
        # The cost model's AdamW time is 2·P·B_state / (mem × eff): solve it for eff on the
        # measured step (not folded: the optimizer runs outside autograd).
        e = 2.0 * opt["params"] * opt["state_bytes_per_param"] / (mem * opt["seconds"])
        eff["optimizer"] = min(1.5, max(1e-4, e))
    overrides = dict(base.gpu_overrides)
    if override:
        overrides[m.gpu_type] = {"tflops": m.peak_flops / 1e12, "mem_GBps": m.mem_Bps / 1e9}
    meta.update({"backend": m.backend, "gpu_type": m.gpu_type, "measured_peak_tflops": m.peak_flops / 1e12,
                 "measured_mem_GBps": m.mem_Bps / 1e9, "ops": m.ops})
    links, link_eff = dict(base.links), base.link_efficiency
    if m.comm:
        meta["comm_samples"] = m.comm["collectives"] + m.comm["send_recv"]
        if m.comm.get("collectives_in_step"):
            meta["comm_samples_in_step"] = m.comm["collectives_in_step"]
        fits, failed = _fit_links(m.comm, steps, factor)
        p2p = fits.get("send_recv")
        if p2p is None:
            logger.warning("point-to-point fit failed (%s); link fields keep their defaults", failed["send_recv"])
        else:
            a_ref = max(p2p.alpha_s, 1e-7)  # a 0.1 µs floor keeps the latency factors finite
            for c, f in fits.items():
                links[c] = {"bw_factor": f.beta_Bps / p2p.beta_Bps, "alpha_factor": f.alpha_s / a_ref}
            link_eff = 1.0
            meta["cluster_link"] = {"intra_GBps": p2p.beta_Bps / 1e9, "intra_latency_us": a_ref * 1e6}
        meta["link_fit"] = {c: f.to_dict() for c, f in fits.items()} | {c: {"error": e} for c, e in failed.items()}
    oef_table = dict(base.oef)
    for key, row in m.oef.items():
        # OEF lies in [-1, 1] by construction up to noise (an op that slows the other by more
        # than its own length reads below -1 only under outside load); the raw value stays in meta.
        if not -1.0 <= row["oef"] <= 1.0:
            logger.warning("measured OEF %s = %.3f clamped to [-1, 1] (noisy machine?)", key, row["oef"])
        oef_table[key] = min(1.0, max(-1.0, row["oef"]))
    meta["oef_measured"] = m.oef
    return Profile(device=m.device, efficiency=dict(base.efficiency),
                   per_gpu_efficiency={**base.per_gpu_efficiency, m.gpu_type: eff}, gpu_overrides=overrides,
                   link_efficiency=link_eff, links=links, oef=oef_table,
                   runtime_reserve_bytes=m.reserve_bytes if m.reserve_bytes is not None else base.runtime_reserve_bytes,
                   attention_scores_saved=bool(m.meta.get("attention_scores_saved", base.attention_scores_saved)),
                   meta=meta)


def _fit_links(comm: dict[str, Any], steps: StepsFn, factor: StepsFn) -> tuple[dict[str, Any], dict[str, str]]:
    """α–β fit per communication class in the cost model's form; classes whose data cannot be
    fitted (noise with no bandwidth trend) are reported, not fatal."""
    series = {"send_recv": (comm["send_recv"], lambda n: 1.0, lambda n: 1.0)}
    in_step = comm.get("collectives_in_step") or []
    for c in COLLECTIVES:
        # Collectives as a step issues them (after compute, see profiler_comm._collectives_in_step)
        # when measured; back-to-back calls otherwise (older measurements, or no GEMM to interleave).
        rows = [s for s in in_step if s["op"] == c] or [s for s in comm["collectives"] if s["op"] == c]
        series[c] = (rows, lambda n, c=c: steps(c, n), lambda n, c=c: factor(c, n))
    fits, failed = {}, {}
    for c, (samples, st, fa) in series.items():
        try:
            fits[c] = fit_alpha_beta(group_fit_rows(samples, st, fa))
        except InvalidInputError as err:
            failed[c] = err.message
            logger.warning("%s: no α–β fit (%s); the class keeps the default factors", c, err.message)
    return fits, failed


def local_cluster(profile: Profile, *, count: int, memory_gib: float, name: str = "local") -> dict[str, Any]:
    """A one-node cluster mapping for this machine: its measured "GPU type" (the CPU, or a GPU
    not in the catalog) under ``gpu_types`` and the measured point-to-point link as the
    intra-node link. With it and the profile, the cost model predicts runs on this machine."""
    gtype = profile.meta.get("gpu_type", "cpu")
    link = profile.meta.get("cluster_link", {})
    over = profile.gpu_overrides.get(gtype)
    out: dict[str, Any] = {"name": name}
    if over:
        out["gpu_types"] = {gtype: {"tflops": round(over["tflops"], 6), "memory_gib": memory_gib,
                                    "mem_GBps": round(over["mem_GBps"], 3),
                                    "source": f"measured by hexhelix profile on {profile.device}"}}
    node: dict[str, Any] = {"name": name, "gpu": gtype, "count": count}
    if link:
        node["intra_GBps"] = round(link["intra_GBps"], 4)
        node["intra_latency_us"] = round(link["intra_latency_us"], 3)
    out["nodes"] = [node]
    return out
