"""The built-in GPU catalog: every type the issue names, datasheet numbers with a source, GeForce rows
at the FP32-accumulate rate, and no peak-TFLOPS literal anywhere else in the library code."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest
from hexhelix.ir.catalog import CATALOG, GpuType, lookup_gpu

ROOT = Path(__file__).resolve().parents[1]

# Dense bf16/fp16 tensor TFLOPS and memory (GB) transcribed from shared/reference/planners.md §4.1
# (vendor datasheets). Kept here, independent of ir/catalog.py, so a typo in either shows up.
DATASHEET = {
    "A100-SXM4-80GB": (312.0, 80),
    "A100-PCIe-80GB": (312.0, 80),
    "A800-SXM4-80GB": (312.0, 80),
    "H100-SXM5-80GB": (989.0, 80),
    "H200": (989.0, 141),
    "A40": (149.7, 48),
    "L40": (181.05, 48),
    "A10": (125.0, 24),
    "L4": (121.0, 24),
    "T4": (65.0, 16),
    "V100-SXM2-32GB": (125.0, 32),
    "RTX3080Ti": (68.2, 12),
    "RTX3090": (71.0, 24),
    "RTX4090": (165.2, 24),
}

# GeForce: the datasheet's FP16-accumulate tensor rate; training accumulates in FP32 at half of it.
GEFORCE_FP16_ACCUMULATE = {"RTX3090": 142.0, "RTX4090": 330.3, "RTX3080Ti": 136.4}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_issue_gpu_is_in_catalog_with_datasheet_numbers_and_a_source(name: str) -> None:
    gpu = CATALOG[name]
    tflops, mem = DATASHEET[name]
    assert gpu.tflops == pytest.approx(tflops, rel=1e-3)
    assert gpu.memory_gib == mem
    assert gpu.peak_flops == pytest.approx(tflops * 1e12, rel=1e-3)
    assert len(gpu.source) > 20 and gpu.source != "user-defined"
    assert re.search(r"datasheet|whitepaper", gpu.source, re.IGNORECASE)


@pytest.mark.parametrize("name", sorted(GEFORCE_FP16_ACCUMULATE))
def test_geforce_rows_use_the_fp32_accumulate_rate(name: str) -> None:
    gpu = CATALOG[name]
    assert gpu.tflops == pytest.approx(GEFORCE_FP16_ACCUMULATE[name] / 2, rel=0.01)
    assert "FP32 accumulate" in gpu.source


def test_rtx3080ti_rate_follows_from_sm_count_and_clock() -> None:
    # GA102 GeForce: 512 FP16-tensor FLOP per clock per SM with FP32 accumulate; 3080 Ti has 80 SMs
    # at 1.665 GHz boost (the derivation quoted in its source line).
    assert CATALOG["RTX3080Ti"].tflops == pytest.approx(512 * 80 * 1.665e9 / 1e12, rel=1e-3)


def test_aliases_and_user_types_resolve() -> None:
    assert lookup_gpu("A100") is CATALOG["A100-SXM4-80GB"]
    assert lookup_gpu("4090") is CATALOG["RTX4090"]
    assert lookup_gpu("NoSuchCard") is None
    mine = GpuType(name="MyCard", tflops=100.0, memory_gib=24)
    assert lookup_gpu("MyCard", {"MyCard": mine}) is mine
    # a user type may shadow a catalog name on purpose
    shadow = GpuType(name="T4", tflops=1.0, memory_gib=1)
    assert lookup_gpu("T4", {"T4": shadow}) is shadow


@pytest.mark.parametrize("bad", [0, -1.0, True, "100"])
def test_gpu_type_rejects_non_positive_numbers(bad: object) -> None:
    with pytest.raises(ValueError, match="tflops"):
        GpuType(name="x", tflops=bad, memory_gib=24)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- no literals elsewhere
# Distinctive catalog rates are flagged as bare numbers (312, 989.0) and scaled (312e12, 312e3 GF);
# rates that are also everyday numbers (65, 71, 121, 125) only when scaled to FLOP/s, where they
# cannot be anything but a peak. Comments and docstrings may quote datasheets; code may not.
_DISTINCTIVE = {312.0, 989.0, 756.0, 149.7, 181.05, 165.2, 68.2}
_EVERYDAY = {g.tflops for g in CATALOG.values()} - _DISTINCTIVE
LIBRARY_DIRS = ("ir", "solver", "runtime", "hexhelix")


def peak_literals(source: str) -> list[tuple[int, str]]:
    """(line, token) of every numeric literal in Python ``source`` that is a catalog peak rate."""
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.NUMBER or tok.string.endswith(("j", "J")):
            continue
        value = float(tok.string.replace("_", "")) if not tok.string.startswith("0x") else 0.0
        for v in _DISTINCTIVE:
            if any(value == pytest.approx(v * scale, rel=1e-9) for scale in (1, 1e3, 1e12)):
                hits.append((tok.start[0], tok.string))
        for v in _EVERYDAY:
            if value == pytest.approx(v * 1e12, rel=1e-9):
                hits.append((tok.start[0], tok.string))
    return hits


def test_scanner_catches_a_planted_peak_literal() -> None:
    planted = 'PEAK = 312e12  # A100\nx = 65\ny = 125_000_000_000_000.0\nz = 989\n"""312 in a docstring"""\n'
    assert [line for line, _ in peak_literals(planted)] == [1, 3, 4]
    # and on real code: the catalog itself is where every rate lives
    found = {float(tok) for _, tok in peak_literals((ROOT / "ir" / "catalog.py").read_text())}
    assert _DISTINCTIVE <= found


def test_no_peak_tflops_literal_outside_the_catalog() -> None:
    offenders = []
    for folder in LIBRARY_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "ir" / "catalog.py":
                continue
            for line, tok in peak_literals(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {tok}")
    assert not offenders, "peak-FLOPS literals outside ir/catalog.py (read the catalog instead): " + \
        ", ".join(offenders)
