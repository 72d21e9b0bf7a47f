"""Cost-model calibration: efficiencies, link overrides and overlap factors (schema hexhelix.profile/1).

Without a measured profile, :data:`DEFAULT_PROFILE` applies. Its numbers are documented
assumptions, not measurements:

* GEMM at 70 % of the datasheet peak, attention at 50 % (large-shape cuBLAS/FlashAttention on
  A100/H100 reach 70-80 % and 50-70 %), memory-bound ops (norms, elementwise) at 70 % of HBM
  bandwidth;
* links deliver 80 % of their nominal bandwidth (NCCL bus bandwidth vs link rate);
* overlap effectiveness (OEF, DHelix Eq. 1) by op-class pair: compute with compute 0 (no gain),
  GEMM with a collective 0.9, attention with a collective 0.75, memory-bound compute with a
  collective 0.5, collectives on different links 1.0 (independent); two collectives on the same
  link are illegal to pair;
* 1 GiB per GPU reserved for the CUDA context, NCCL buffers and allocator slack;
* the attention score matrix (5·a·s²·b bytes per layer, Korthikanti et al.) is kept for the
  backward (``attention_scores_saved``), as an unfused attention does.

Two fields are written by ``hexhelix profile`` from measurements and default to the behaviour
above when absent (so a profile/1 file without them reads as before):

* the efficiency class ``optimizer`` (in ``efficiency`` or ``per_gpu_efficiency``): the AdamW step
  as a fraction of memory bandwidth, measured on the runtime's own optimizer; a profile without it
  uses the ``elementwise`` efficiency (see :meth:`Profile.eff`'s ``fallback``);
* ``attention_scores_saved``: false when the profiler saw that autograd keeps no (…, s, s)
  score tensor in the runtime's layer (fused SDPA recomputes it); the cost model then drops the
  5·a·s²·b term of the activation formula.

``links`` maps a communication class (``all_reduce``, ``all_gather``, ``reduce_scatter``,
``send_recv``) to ``{"bw_factor": b, "alpha_factor": a}``: the measured β and α of that class,
fitted to the cost model's ring form, relative to the link the cluster file gives (``hexhelix
profile`` writes the measured point-to-point link into the generated cluster file and sets
``link_efficiency`` to 1). The cost model multiplies the link's bandwidth by ``b`` and its latency
by ``a``; a class not listed uses 1 and 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import finite_number
from .errors import InvalidInputError
from .files import read_json

__all__ = ["DEFAULT_PROFILE", "PROFILE_SCHEMA", "Profile", "load_profile"]

PROFILE_SCHEMA = "hexhelix.profile/1"
_COMPUTE = ("gemm", "attention", "norm", "elementwise")
_COMM = ("all_gather", "reduce_scatter", "all_reduce", "send_recv")


def _default_oef() -> dict[str, float]:
    table: dict[str, float] = {}
    for a in _COMPUTE:
        for b in _COMPUTE:
            table[f"{a}|{b}"] = 0.0
        for c in _COMM:
            table[f"{a}|{c}"] = {"gemm": 0.9, "attention": 0.75}.get(a, 0.5)
    for c in _COMM:
        for d in _COMM:
            table[f"{c}|{d}"] = 1.0  # only ever used for collectives on different links
    return table


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """Measured or assumed factors the cost model multiplies datasheet numbers by."""

    device: str = "defaults (documented assumptions, not measured)"
    efficiency: dict[str, float] = field(default_factory=lambda: {
        "gemm": 0.70, "attention": 0.50, "norm": 0.70, "elementwise": 0.70})
    per_gpu_efficiency: dict[str, dict[str, float]] = field(default_factory=dict)
    gpu_overrides: dict[str, dict[str, float]] = field(default_factory=dict)
    link_efficiency: float = 0.80
    links: dict[str, dict[str, float]] = field(default_factory=dict)
    oef: dict[str, float] = field(default_factory=_default_oef)
    runtime_reserve_bytes: int = 2**30
    attention_scores_saved: bool = True
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        _check_shapes(self)
        for k, v in self.efficiency.items():
            if not 0 < v <= 1.5:
                raise InvalidInputError(f"efficiency must be in (0, 1.5], got {v}", field=f"efficiency.{k}")
        if not 0 < self.link_efficiency <= 1.5:
            raise InvalidInputError("must be in (0, 1.5]", field="link_efficiency")
        for cls, spec in self.links.items():
            if cls not in _COMM or not isinstance(spec, dict):
                raise InvalidInputError(f"expected one of {', '.join(_COMM)} mapping to "
                                        "{bw_factor, alpha_factor}", field=f"links.{cls}")
            for key, v in spec.items():
                if key not in ("bw_factor", "alpha_factor") or isinstance(v, bool) \
                        or not isinstance(v, int | float) or v < 0 or (key == "bw_factor" and v == 0):
                    raise InvalidInputError(f"expected bw_factor > 0 and alpha_factor >= 0, got {key}={v!r}",
                                            field=f"links.{cls}.{key}")

    def eff(self, gpu: str, op_class: str, fallback: str | None = None) -> float:
        """Fraction of peak (compute ops) or of memory bandwidth (memory-bound ops) achieved.

        A class that neither ``per_gpu_efficiency[gpu]`` nor ``efficiency`` names takes the
        ``fallback`` class's value when one is given (e.g. ``optimizer`` falls back to
        ``elementwise``), else 0.5."""
        per = self.per_gpu_efficiency.get(gpu, {})
        if fallback is not None and op_class not in per and op_class not in self.efficiency:
            return self.eff(gpu, fallback)
        return per.get(op_class, self.efficiency.get(op_class, 0.5))

    def link_factors(self, op_class: str) -> tuple[float, float]:
        """(bandwidth factor, latency factor) of communication class ``op_class`` (see ``links``)."""
        spec = self.links.get(op_class, {})
        return float(spec.get("bw_factor", 1.0)), float(spec.get("alpha_factor", 1.0))

    def overlap(self, a: str, b: str) -> float:
        """OEF of co-executing an op of class ``a`` with one of class ``b`` (symmetric)."""
        return self.oef.get(f"{a}|{b}", self.oef.get(f"{b}|{a}", 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROFILE_SCHEMA, "device": self.device, "efficiency": self.efficiency,
                "per_gpu_efficiency": self.per_gpu_efficiency, "gpu_overrides": self.gpu_overrides,
                "link_efficiency": self.link_efficiency, "links": self.links, "oef": self.oef,
                "runtime_reserve_bytes": self.runtime_reserve_bytes,
                "attention_scores_saved": self.attention_scores_saved, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> Profile:
        try:
            if not isinstance(d, dict):
                raise InvalidInputError("expected a JSON object")
            if d.get("schema") != PROFILE_SCHEMA:
                raise InvalidInputError(f"expected schema {PROFILE_SCHEMA!r}, got {d.get('schema')!r}",
                                        field="schema")
            kwargs = {k: v for k, v in d.items() if k != "schema"}
            unknown = set(kwargs) - set(cls.__dataclass_fields__)
            if unknown:
                raise InvalidInputError("unknown field", field=sorted(unknown)[0])
            oef = kwargs.get("oef") or {}
            if not isinstance(oef, dict):
                raise InvalidInputError("must be a mapping of 'class|class' to a factor", field="oef")
            base = _default_oef()
            base.update(oef)
            kwargs["oef"] = base
            return cls(**kwargs)
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None


def _check_shapes(p: Profile) -> None:
    """Types of every field, so a hand-edited profile fails with its field named, not a TypeError."""
    for name in ("efficiency", "per_gpu_efficiency", "gpu_overrides", "links", "oef", "meta"):
        if not isinstance(getattr(p, name), dict):
            raise InvalidInputError("must be a mapping", field=name)
    for name in ("per_gpu_efficiency", "gpu_overrides"):
        for gpu, table in getattr(p, name).items():
            if not isinstance(table, dict):
                raise InvalidInputError("must be a mapping", field=f"{name}.{gpu}")
            for k, v in table.items():
                if not finite_number(v) or v <= 0:
                    raise InvalidInputError(f"must be a positive number, got {v!r}", field=f"{name}.{gpu}.{k}")
    for name, table in (("efficiency", p.efficiency), ("oef", p.oef)):
        for k, v in table.items():
            if not finite_number(v):
                raise InvalidInputError(f"must be a number, got {v!r}", field=f"{name}.{k}")
    if not finite_number(p.link_efficiency):
        raise InvalidInputError(f"must be a number, got {p.link_efficiency!r}", field="link_efficiency")
    if not isinstance(p.attention_scores_saved, bool):
        raise InvalidInputError(f"must be true or false, got {p.attention_scores_saved!r}",
                                field="attention_scores_saved")
    if not finite_number(p.runtime_reserve_bytes) or p.runtime_reserve_bytes < 0:
        raise InvalidInputError(f"must be a non-negative number of bytes, got {p.runtime_reserve_bytes!r}",
                                field="runtime_reserve_bytes")


DEFAULT_PROFILE = Profile()


def load_profile(path: str | Path | None) -> Profile:
    """Load a profile JSON, or return the documented defaults when ``path`` is None."""
    if path is None:
        return DEFAULT_PROFILE
    return Profile.from_dict(read_json(path), source=str(path))
