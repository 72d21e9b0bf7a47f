"""Paper reproductions: HexiScale (heterogeneous vs homogeneous, vs heterogeneous baselines) and
DHelix (W-shape with pairing vs 1F1B), plus the headline table (benchmarks/summary.py).

Every number is a prediction of hexhelix's one cost model (``solver.evaluate``) or of its simulator
on compiled programs, under the documented default profile; nothing here is a GPU measurement.

    python benchmarks/reproduce.py --part hexiscale --time-limit 45   # exact CP-SAT, 45 s per solve
    python benchmarks/reproduce.py --part dhelix
    python benchmarks/reproduce.py --part all --write-readme          # everything, ~12-15 min on 2 cores
    python benchmarks/reproduce.py --quick                             # smoke run (3 s limits, few rows)

``--write-readme`` replaces the sections between ``<!-- reproduce-*:begin/end -->`` markers in
benchmarks/README.md with the tables and the command that produced them.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Any

from hexhelix.ir.cluster import Cluster, load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.solver.result import SolveResult
from hexhelix.solver.solve import solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dhelix_repro import dhelix_rows, dhelix_section  # sibling script

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"
README = ROOT / "benchmarks" / "README.md"

# (label, het cluster, homo cluster, model, paper het MFU %, paper homo MFU %) — reference/hexiscale.md §5.2
HEXISCALE = [
    ("Het-1", "hexiscale-het1", "homo-for-het1", "llama2-7b", 31.19, 38.58),
    ("Het-1", "hexiscale-het1", "homo-for-het1", "llama2-13b", 27.23, 39.46),
    ("Het-2", "hexiscale-het2", "homo-for-het2", "llama2-7b", 33.47, 38.58),
    ("Het-2", "hexiscale-het2", "homo-for-het2", "llama2-13b", 31.39, 39.46),
    ("Het-3", "hexiscale-het3", "homo-for-het3", "llama-30b", 27.49, 27.79),
]
HET_METHODS = ("cpsat", "hexiscale", "hexiscale-released", "megatron")
HOMO_METHODS = ("cpsat", "megatron")
GLOBAL_BATCH, SEQ_LEN, RECOMPUTE = 64, 4096, "full"
# sensitivity: (inter-node GB/s, GEMM efficiency); the first is the default of the main table
VARIANTS = [(5.0, 0.7), (25.0, 0.7), (5.0, 0.5), (25.0, 0.5)]
SENSITIVITY_ROWS = (2, 4)  # Het-2 7B and Het-3 30B


def _cluster(name: str, inter: float | None = None) -> Cluster:
    cl = load_cluster(CLUSTERS / f"{name}.yaml")
    return cl if inter is None else dataclasses.replace(cl, inter_GBps=inter)


def _profile(gemm: float) -> Profile:
    if gemm == DEFAULT_PROFILE.efficiency["gemm"]:
        return DEFAULT_PROFILE
    return dataclasses.replace(DEFAULT_PROFILE, efficiency={**DEFAULT_PROFILE.efficiency, "gemm": gemm},
                               device=f"defaults with GEMM efficiency {gemm}")


class Runner:
    """Solves (cluster, model, variant, method) once and remembers it (homo clusters repeat)."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.cache: dict[tuple[Any, ...], SolveResult] = {}
        self.solve_s = 0.0

    def get(self, cluster: str, model: str, method: str, inter: float | None = None, gemm: float = 0.7) -> SolveResult:
        cl = _cluster(cluster, inter)
        key = (tuple(sorted((n.gpu, n.count, n.intra_GBps) for n in cl.nodes)), cl.inter_GBps, model, method, gemm)
        if key not in self.cache:
            pb = PlanProblem(cluster=cl, model=PRESETS[model], training=TrainingConfig(
                global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, recompute=RECOMPUTE))
            t0 = time.monotonic()
            self.cache[key] = solve(pb, method, seed=0, profile=_profile(gemm), time_limit=self.limit,
                                    options={"workers": 1, "warm_start": True})
            self.solve_s += time.monotonic() - t0
            r = self.cache[key]
            print(f"  {cluster} {model} inter={cl.inter_GBps:g} gemm={gemm:g} {method}: {r.status.value} "
                  f"{r.iteration_time_s:.3f} s ({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
        return self.cache[key]


def _ok(r: SolveResult) -> bool:
    return r.evaluation is not None and r.evaluation.feasible


def _tput(r: SolveResult) -> float:
    return r.evaluation.throughput_tokens_per_s if r.evaluation else 0.0


def _mfu(r: SolveResult) -> str:
    if r.evaluation is None:
        return "no plan"
    s = f"{100 * r.evaluation.mfu:.1f}"
    return s if r.evaluation.feasible else f"({s}, OOM)"


def _best(rs: list[SolveResult]) -> SolveResult | None:
    ok = [r for r in rs if _ok(r)]
    return max(ok, key=_tput) if ok else None


def _ratio(a: SolveResult | None, b: SolveResult) -> str:
    if a is None or b.evaluation is None:
        return "–"
    x = f"{_tput(a) / _tput(b):.2f}×"
    return x if _ok(b) else f"({x}, base OOM)"


def _status(r: SolveResult) -> str:
    if r.gap is None:
        return r.status.value
    return f"{r.status.value}, gap {100 * r.gap:.1f}%"


def _x(a: SolveResult | None, b: SolveResult | None) -> float | None:
    """Throughput ratio a / b when both plans fit in memory."""
    return _tput(a) / _tput(b) if a is not None and b is not None and _ok(a) and _ok(b) else None


def _span(v: list[float | None]) -> str:
    x = [a for a in v if a is not None]
    return f"{min(x):.2f}–{max(x):.2f}×" if x else "–"


def hexiscale_tables(run: Runner, quick: bool) -> tuple[list[str], dict[str, list[float | None]]]:
    rows = ["| setting | model | GPUs (Σ peak PF) | exact (CP-SAT) MFU % | status | hexiscale (ours) MFU % | "
            "hexiscale-released MFU % | megatron MFU % | homo: best MFU % (megatron) | paper het / homo MFU % |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    ratio_rows = ["| setting | model | best het tokens/s | het / homo throughput (ours) | paper het / homo "
                  "(MFU × peak) | best / hexiscale-released | best / megatron |",
                  "|---|---|---|---|---|---|---|"]
    stats: dict[str, list[float | None]] = {"hh": [], "paper": [], "rel": [], "meg": [], "exact_vs_heur": []}
    for label, het, homo, model, p_het, p_homo in (HEXISCALE[2:3] if quick else HEXISCALE):
        rs = {m: run.get(het, model, m) for m in HET_METHODS}
        hs = {m: run.get(homo, model, m) for m in HOMO_METHODS}
        cl, ch = _cluster(het), _cluster(homo)
        best, hbest = _best(list(rs.values())), _best(list(hs.values()))
        rows.append(
            f"| {label} | {model} | {cl.num_gpus} ({cl.total_peak_flops() / 1e15:.2f}) | {_mfu(rs['cpsat'])} | "
            f"{_status(rs['cpsat'])} | {_mfu(rs['hexiscale'])} | {_mfu(rs['hexiscale-released'])} | "
            f"{_mfu(rs['megatron'])} | {_mfu(hbest) if hbest else '–'} ({_mfu(hs['megatron'])}) | "
            f"{p_het:.2f} / {p_homo:.2f} |")
        paper = p_het * cl.total_peak_flops() / (p_homo * ch.total_peak_flops())
        ratio_rows.append(
            f"| {label} | {model} | {_tput(best):,.0f} | {_ratio(best, hbest) if hbest else '–'} | {paper:.2f}× | "
            f"{_ratio(best, rs['hexiscale-released'])} | {_ratio(best, rs['megatron'])} |")
        print(rows[-1], ratio_rows[-1], sep="\n", flush=True)
        stats["hh"].append(_x(best, hbest))
        stats["paper"].append(paper)
        stats["rel"].append(_x(best, rs["hexiscale-released"]))
        stats["meg"].append(_x(best, rs["megatron"]))
        stats["exact_vs_heur"].append(_x(rs["cpsat"], rs["hexiscale"]))
    return [*rows, "", *ratio_rows], stats


def hexiscale_reading(st: dict[str, list[float | None]]) -> list[str]:
    """Computed summary lines (no number typed by hand)."""
    n_rel = sum(1 for v in st["rel"] if v is None)
    ev = [v for v in st["exact_vs_heur"] if v is not None]
    return [
        f"- het / equal-FLOPS homo throughput: ours {_span(st['hh'])}, the paper's README {_span(st['paper'])}.",
        f"- best / hexiscale-released: {_span(st['rel'])} on the rows where the released plan fits "
        f"({n_rel} row(s) where it does not fit our memory model are left out); best / megatron: "
        f"{_span(st['meg'])}; the paper: 1.5–2.4× over heterogeneous baselines.",
        f"- CP-SAT incumbent / HexiScale heuristic throughput: {_span(ev)}"
        + (" (below 1: the time-limited exact run ended on a worse plan than the heuristic it was warm-started "
           "from)." if ev and min(ev) < 0.999 else
           ": the exact model, warm-started from the heuristics, found nothing better within its limit; its "
           "bound (the gap column) is what it adds — no plan can be faster than that bound."),
    ]


def sensitivity(run: Runner, quick: bool) -> list[str]:
    rows = ["| setting | model | inter-node GB/s | GEMM eff. | best het MFU % | het / homo | best / released | "
            "best / megatron |", "|---|---|---|---|---|---|---|---|"]
    moves: list[str] = []
    for i in ((SENSITIVITY_ROWS[0],) if quick else SENSITIVITY_ROWS):
        label, het, homo, model, _, _ = HEXISCALE[i]
        got: dict[tuple[float, float], tuple[float | None, ...]] = {}
        for inter, gemm in (VARIANTS[:2] if quick else VARIANTS):
            rs = [run.get(het, model, m, inter, gemm) for m in HET_METHODS]
            hs = [run.get(homo, model, m, inter, gemm) for m in HOMO_METHODS]
            best, hbest = _best(rs), _best(hs)
            rows.append(f"| {label} | {model} | {inter:g} | {gemm:g} | {_mfu(best) if best else '–'} | "
                        f"{_ratio(best, hbest) if hbest else '–'} | {_ratio(best, rs[2])} | {_ratio(best, rs[3])} |")
            got[(inter, gemm)] = (_x(best, hbest), _x(best, rs[2]), _x(best, rs[3]))
            print(rows[-1], flush=True)
        base = got[VARIANTS[0]]
        for key, what in ((VARIANTS[1], f"inter-node {VARIANTS[0][0]:g} → {VARIANTS[1][0]:g} GB/s"),
                          (VARIANTS[2], f"GEMM efficiency {VARIANTS[0][1]:g} → {VARIANTS[2][1]:g}")):
            if key in got:
                parts = [f"{name} {_f(a)} → {_f(b)}" for name, a, b in
                         zip(("het / homo", "best / released", "best / megatron"), base, got[key])]
                moves.append(f"- {label} {model}, {what}: " + ", ".join(parts) + ".")
    return [*rows, "", *moves]


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


# ----------------------------------------------------------------------------- README
def _replace(text: str, tag: str, body: list[str]) -> str:
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    block = "\n".join([begin, *body, end])
    if begin in text:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    return text.rstrip("\n") + "\n\n" + block + "\n"


def hexiscale_section(tables: list[str], sens: list[str], cmd: str, wall: float, limit: float,
                      sens_limit: float) -> list[str]:
    return [
        "## HexiScale reproduction: `benchmarks/reproduce.py --part hexiscale`", "",
        f"Command: `{cmd}` (CP-SAT {limit:g} s per solve, 1 worker, seed 0, warm-started from the heuristics; "
        f"whole part {wall:.0f} s on the shared 2-core CPU).", "",
        "Clusters: the HexiScale README's mixes (`examples/clusters/hexiscale-het{1,2,3}.yaml`) and their "
        "equal-FLOPS homogeneous A100-PCIe counterparts (`homo-for-het{1,2,3}.yaml`; Het-1 and Het-2 share "
        "2×8 A100-PCIe). Assumptions (the paper's inputs are not published, reference/hexiscale.md §5.2–5.3): "
        f"global batch {GLOBAL_BATCH} sequences of {SEQ_LEN} tokens, micro-batch 1, bf16, full activation "
        "recompute (as the paper), 1F1B; default profile: GEMM 70 %, attention 50 % of datasheet peak, links "
        "80 % of nominal; GeForce nodes PCIe 12 GB/s inside a node, A100-SXM NVLink 300 GB/s, A100-PCIe 25 GB/s; "
        "5 GB/s (~40 Gb/s Ethernet) and 20 µs between nodes (the released planner's default; the paper's "
        "homogeneous baseline ran over TCP). Peaks from our catalog (RTX cards with FP32 accumulate), so Σ peak "
        "differs slightly from the paper's table.", "",
        "*MFU* = model FLOPs (no recompute) / iteration time / Σ peak. The paper's MFU counts recompute FLOPs "
        "(its code's α = 96 instead of 72, reference/hexiscale.md §2.7), so with full recompute its numbers are "
        "4/3 of an MFU on our definition: compare ratios, not raw MFU. *OOM* = the plan does not fit in memory "
        "under our memory model (hexiscale-released's memory model is cruder); its MFU is shown in parentheses "
        "and ratios against it are marked. *exact* is the CP-SAT incumbent: `timeout` means not proven optimal, "
        "the gap to its proven bound is shown. *homo best* = the better of CP-SAT and the Megatron baseline on "
        "the homogeneous cluster (the paper used Megatron-LM there).", "",
        *tables, "",
        "Paper claims: (i) parity with the homogeneous cluster of equal peak (its own README numbers, converted "
        "to a throughput ratio in the column *paper het / homo*, fall short of parity too); (ii) 1.5–2.4× over heterogeneous baselines (v3; which "
        "baselines is not retrieved). Our *best* is the fastest plan that fits in memory among the four methods. "
        "Het-3 as listed in the HexiScale README (1×8 3090 + 2×4 4090 + 4×8 4090 + 1×8 A100) has 56 GPUs, not "
        "the 48 its table says; its summed peak (ours 9.67 PF, the paper's 9.74 PF) matches the 56.", "",
        "### How the ratios move with the assumptions", "",
        "Same problems, with the inter-node bandwidth of both clusters at 5 or 25 GB/s and the GEMM efficiency of "
        f"every GPU at 0.7 or 0.5 (the other efficiencies unchanged); CP-SAT {sens_limit:g} s per solve here "
        "(the first row of each setting repeats the main table's problem, solved with the main limit).", "",
        *sens, "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["hexiscale", "dhelix", "headline", "all"], default="all")
    ap.add_argument("--time-limit", type=float, default=45.0, help="seconds per CP-SAT solve (default 45)")
    ap.add_argument("--sens-time-limit", type=float, default=20.0,
                    help="seconds per CP-SAT solve in the sensitivity sweep (default 20)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s limits, a few rows")
    ap.add_argument("--write-readme", action="store_true", help="write the sections into benchmarks/README.md")
    args = ap.parse_args()
    limit = 3.0 if args.quick else args.time_limit
    cmd = "python benchmarks/reproduce.py " + " ".join(a for a in sys.argv[1:])
    sections: dict[str, list[str]] = {}
    if args.part in ("hexiscale", "all"):
        t0 = time.monotonic()
        run = Runner(limit)
        tables, stats = hexiscale_tables(run, args.quick)
        tables += ["", *hexiscale_reading(stats)]
        run.limit = 3.0 if args.quick else args.sens_time_limit
        sens = sensitivity(run, args.quick)
        sections["reproduce-hexiscale"] = hexiscale_section(tables, sens, cmd, time.monotonic() - t0, limit,
                                                            run.limit)
    if args.part in ("dhelix", "all"):
        t0 = time.monotonic()
        rows, dstats = dhelix_rows(args.quick)
        sections["reproduce-dhelix"] = dhelix_section(rows, dstats, cmd, time.monotonic() - t0)
    # re-read right before writing: other benchmarks may have written their sections meanwhile
    text = README.read_text()
    for tag, body in sections.items():
        text = _replace(text, tag, body)
    if args.part in ("headline", "all"):
        from summary import headline_section

        sections["reproduce-headline"] = headline_section(text, cmd)
        text = _replace(text, "reproduce-headline", sections["reproduce-headline"])
    if args.write_readme:
        if args.quick:
            raise SystemExit("--write-readme needs a real run (no --quick)")
        README.write_text(text)
        print(f"wrote {README}")
    else:
        for body in sections.values():
            print("\n".join(body))


if __name__ == "__main__":
    main()
