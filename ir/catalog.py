"""Built-in GPU catalog: dense bf16/fp16 tensor TFLOPS, memory and default links, one cited row each.

Numbers are vendor-datasheet values (dense, i.e. without 2:4 sparsity). GeForce cards list the
rate with FP32 accumulation, which is what mixed-precision training uses (half the FP16-accumulate
rate). No peak-FLOPS literal appears anywhere else in the code: cost functions read this table or a
user-supplied ``gpu_types`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOG", "SPEC_MAX", "GpuType", "lookup_gpu"]

# no GPU or link figure (TFLOPS, GiB, GB/s, µs) comes near this: a larger one is a typo, and would
# overflow the byte and FLOP counts computed from it
SPEC_MAX = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuType:
    """One GPU model: peak dense tensor throughput, memory and the links it usually comes with."""

    name: str
    tflops: float
    memory_gib: float
    mem_GBps: float = 1000.0
    intra_GBps: float = 16.0
    source: str = "user-defined"

    def __post_init__(self) -> None:
        for field_name in ("tflops", "memory_gib", "mem_GBps", "intra_GBps"):
            value = getattr(self, field_name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= SPEC_MAX:
                raise ValueError(f"{field_name}: must be a positive number up to {SPEC_MAX:g}, got {value!r}")
            # one numeric type, so a catalog row and the same row read back from JSON serialise
            # to the same bytes (80 vs 80.0)
            object.__setattr__(self, field_name, float(value))

    @property
    def peak_flops(self) -> float:
        """Peak dense tensor FLOP/s."""
        return self.tflops * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "tflops": self.tflops,
            "memory_gib": self.memory_gib,
            "mem_GBps": self.mem_GBps,
            "intra_GBps": self.intra_GBps,
            "source": self.source,
        }


def _g(name: str, tflops: float, mem: float, mem_bw: float, intra: float, src: str) -> GpuType:
    return GpuType(name=name, tflops=tflops, memory_gib=mem, mem_GBps=mem_bw, intra_GBps=intra, source=src)


# intra_GBps is the per-direction bandwidth one GPU gets to a peer inside its node: NVLink
# aggregate / 2 for SXM parts, PCIe 4.0 x16 (~25 GB/s achievable of 31.5) or PCIe 3.0 x16
# (~12 GB/s of 15.75) for PCIe parts.
_ROWS = [
    _g("A100-SXM4-80GB", 312.0, 80, 2039, 300, "NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TF dense; NVLink3 600 GB/s bidir."),
    _g("A100-SXM4-40GB", 312.0, 40, 1555, 300, "NVIDIA A100 datasheet (2021): BF16 312 TF dense; 40 GB HBM2"),
    _g("A100-PCIe-80GB", 312.0, 80, 1935, 25, "NVIDIA A100 datasheet (2021): BF16 312 TF dense; PCIe 4.0"),
    _g("A800-SXM4-80GB", 312.0, 80, 2039, 200, "NVIDIA A800 datasheet: BF16 312 TF dense; NVLink 400 GB/s bidir."),
    _g("H100-SXM5-80GB", 989.0, 80, 3350, 450, "NVIDIA H100 datasheet: BF16 989 TF dense (1979 sparse); NVLink4 900 GB/s bidir."),
    _g("H100-PCIe-80GB", 756.0, 80, 2000, 50, "NVIDIA H100 datasheet: BF16 756 TF dense (PCIe card); PCIe 5.0"),
    _g("H200", 989.0, 141, 4800, 450, "NVIDIA H200 datasheet: BF16 989 TF dense; 141 GB HBM3e; NVLink 900 GB/s bidir."),
    _g("A40", 149.7, 48, 696, 25, "NVIDIA A40 datasheet: BF16 149.7 TF dense (299.4 sparse); PCIe 4.0"),
    _g("L40", 181.05, 48, 864, 25, "NVIDIA L40 datasheet: FP16/BF16 181.05 TF dense (362.1 sparse); PCIe 4.0"),
    _g("A10", 125.0, 24, 600, 25, "NVIDIA A10 datasheet: BF16 125 TF dense (250 sparse); PCIe 4.0"),
    _g("L4", 121.0, 24, 300, 25, "NVIDIA L4 datasheet: FP16 121 TF dense (242 sparse); PCIe 4.0"),
    _g("T4", 65.0, 16, 320, 12, "NVIDIA T4 datasheet: FP16 65 TF (mixed precision); PCIe 3.0"),
    _g("V100-SXM2-32GB", 125.0, 32, 900, 150, "NVIDIA V100 datasheet: FP16 tensor 125 TF (no BF16); NVLink2 300 GB/s bidir."),
    _g("RTX3080Ti", 68.2, 12, 912, 12, "NVIDIA Ampere GA102 whitepaper rate (512 FP16-tensor FLOP/clk/SM with FP32 accumulate) x 80 SMs x 1.665 GHz boost; 12 GB GDDR6X"),
    _g("RTX3090", 71.0, 24, 936, 12, "NVIDIA Ampere GA102 whitepaper: FP16 tensor with FP32 accumulate 71 TF dense (142 with FP16 accumulate)"),
    _g("RTX4090", 165.2, 24, 1008, 12, "NVIDIA Ada Lovelace whitepaper: FP16 tensor with FP32 accumulate 165.2 TF dense (330.3 with FP16 accumulate)"),
]

CATALOG: dict[str, GpuType] = {row.name: row for row in _ROWS}

# Short names people type; they resolve to the catalog's canonical rows.
_ALIASES = {
    "A100": "A100-SXM4-80GB",
    "A100-80GB": "A100-SXM4-80GB",
    "A100-PCIe": "A100-PCIe-80GB",
    "A800": "A800-SXM4-80GB",
    "H100": "H100-SXM5-80GB",
    "V100": "V100-SXM2-32GB",
    "3080Ti": "RTX3080Ti",
    "3090": "RTX3090",
    "4090": "RTX4090",
}


def lookup_gpu(name: str, extra: dict[str, GpuType] | None = None) -> GpuType | None:
    """Return the GPU type called ``name`` from ``extra`` (user types) or the catalog, else None."""
    if extra and name in extra:
        return extra[name]
    return CATALOG.get(_ALIASES.get(name, name))
