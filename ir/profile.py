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
* 1 GiB per GPU reserved for the CUDA context, NCCL buffers and allocator slack.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidInputError

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
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for k, v in self.efficiency.items():
            if not 0 < v <= 1.5:
                raise InvalidInputError(f"efficiency must be in (0, 1.5], got {v}", field=f"efficiency.{k}")
        if not 0 < self.link_efficiency <= 1.5:
            raise InvalidInputError("must be in (0, 1.5]", field="link_efficiency")

    def eff(self, gpu: str, op_class: str) -> float:
        """Fraction of peak (compute ops) or of memory bandwidth (memory-bound ops) achieved."""
        per = self.per_gpu_efficiency.get(gpu, {})
        return per.get(op_class, self.efficiency.get(op_class, 0.5))

    def overlap(self, a: str, b: str) -> float:
        """OEF of co-executing an op of class ``a`` with one of class ``b`` (symmetric)."""
        return self.oef.get(f"{a}|{b}", self.oef.get(f"{b}|{a}", 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROFILE_SCHEMA, "device": self.device, "efficiency": self.efficiency,
                "per_gpu_efficiency": self.per_gpu_efficiency, "gpu_overrides": self.gpu_overrides,
                "link_efficiency": self.link_efficiency, "links": self.links, "oef": self.oef,
                "runtime_reserve_bytes": self.runtime_reserve_bytes, "meta": self.meta}

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
            base = _default_oef()
            base.update(kwargs.get("oef") or {})
            kwargs["oef"] = base
            return cls(**kwargs)
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None


DEFAULT_PROFILE = Profile()


def load_profile(path: str | Path | None) -> Profile:
    """Load a profile JSON, or return the documented defaults when ``path`` is None."""
    if path is None:
        return DEFAULT_PROFILE
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InvalidInputError("file not found", source=str(p)) from None
    except json.JSONDecodeError as err:
        raise InvalidInputError(f"invalid JSON at line {err.lineno}: {err.msg}", source=str(p)) from None
    return Profile.from_dict(data, source=str(p))
