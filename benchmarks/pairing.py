"""Segment pairing benchmark: sequential vs DP vs lattice MILP vs barrier-free CP-SAT.

For A40 (PCIe ~25 GB/s), A800 (NVLink 200 GB/s) and H100 (NVLink 450 GB/s) nodes, TP 2/4/8 with
sequence parallelism, sequence 4k-32k, Llama-2 13B/70B layers: predicted layer-pair time of each
method (cost model + overlap model defaults), solve times, the fraction of communication hidden,
and the paper's hand-written 17-block plan scored by the same model.

    python benchmarks/pairing.py                 # reduced grid (shared CPU), prints the table
    python benchmarks/pairing.py --full          # 3 GPUs x 3 TP x 4 seq x 2 models = 72 rows
    python benchmarks/pairing.py --write-readme  # also replace the section in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from hexhelix.ir.catalog import CATALOG
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.pairing import dhelix_default_plan
from hexhelix.solver.cost import Link
from hexhelix.solver.pairing import (
    lower_bound_s,
    score_pairing_plan,
    solve_pairing,
    solve_pairing_all,
)
from hexhelix.solver.pairing_costs import build_pairing_problem
from readme_section import write_section

README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- pairing:begin -->", "<!-- pairing:end -->"
NODES = {  # catalog GPU, intra-node link (GB/s), latency 5 us
    "A40": ("A40", 25.0),
    "A800": ("A800-SXM4-80GB", 200.0),
    "H100": ("H100-SXM5-80GB", 450.0),
}
FULL = [(g, m, tp, s) for g in NODES for m in ("llama2-13b", "llama2-70b") for tp in (2, 4, 8)
        for s in (4096, 8192, 16384, 32768)]
REDUCED = [(g, "llama2-13b", tp, s) for g in NODES for tp in (2, 4, 8) for s in (4096, 16384)] + \
          [(g, "llama2-70b", 8, s) for g in NODES for s in (4096, 32768)]


def run_row(gpu_key: str, model: str, tp: int, seq: int, time_limit: float, workers: int) -> dict:
    gpu_name, gbps = NODES[gpu_key]
    p = build_pairing_problem(PRESETS[model], TrainingConfig(seq_len=seq, micro_batch=1), tp, CATALOG[gpu_name],
                              Link(gbps * 1e9, 5e-6))
    opts = {"time_limit": time_limit, "workers": workers, "seed": 0}
    res = {r.solver: r for r in solve_pairing_all(p, opts)}
    res["dp-all"] = solve_pairing(p, "dp", {"segments": "all"})
    res["paper"] = score_pairing_plan(p, dhelix_default_plan())
    comm = sum(o.duration_s for o in p.ops if o.is_comm)
    return {"gpu": gpu_key, "model": model, "tp": tp, "seq": seq, "lb": lower_bound_s(p),
            "comm_share": comm / res["sequential"].makespan_s, "res": res}


def fmt_table(rows: list[dict]) -> str:
    head = ("| GPU | model | TP | seq | comm share | sequential ms | paper plan ms | dp ms | lattice ms "
            "| dp(all) ms | cpsat ms | cpsat bound ms | LB ms | barrier cost | hidden dp / cpsat / paper "
            "| g (dp) | solve s dp / lat-cbc / lat-highs / cpsat |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        x = r["res"]
        seq = x["sequential"].makespan_s
        dp, cp = x["dp"].makespan_s, x["cpsat"].makespan_s
        lines.append(
            f"| {r['gpu']} | {r['model']} | {r['tp']} | {r['seq'] // 1024}k | {r['comm_share']:.0%} "
            f"| {seq * 1e3:.2f} | {x['paper'].makespan_s * 1e3:.2f} | {dp * 1e3:.2f} | {x['lattice'].makespan_s * 1e3:.2f} "
            f"| {x['dp-all'].makespan_s * 1e3:.2f} | {cp * 1e3:.2f}{'' if x['cpsat'].status.value == 'optimal' else '*'} "
            f"| {x['cpsat'].bound_s * 1e3:.2f} | {r['lb'] * 1e3:.2f} | {(dp - cp) / dp:.1%} "
            f"| {x['dp'].hidden_comm_fraction:.0%} / {x['cpsat'].hidden_comm_fraction:.0%} / "
            f"{x['paper'].hidden_comm_fraction:.0%} | {1 - dp / seq:.3f} "
            f"| {x['dp'].solve_time_s:.2f} / {x['lattice'].solve_time_s:.2f} / {x['lattice-highs'].solve_time_s:.2f} "
            f"/ {x['cpsat'].solve_time_s:.1f} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> list[str]:
    def mx(name: str) -> float:
        return max(r["res"][name].solve_time_s for r in rows)

    eq = all(math.isclose(r["res"]["dp"].makespan_s, r["res"]["lattice"].makespan_s, rel_tol=1e-12)
             and math.isclose(r["res"]["dp"].makespan_s, r["res"]["lattice-highs"].makespan_s, rel_tol=1e-12)
             for r in rows)
    le = sum(r["res"]["cpsat"].makespan_s <= r["res"]["dp"].makespan_s for r in rows)
    strict = sum(r["res"]["cpsat"].makespan_s < r["res"]["dp"].makespan_s * (1 - 1e-6) for r in rows)
    opt = sum(r["res"]["cpsat"].status.value == "optimal" for r in rows)
    a40 = [r for r in rows if r["gpu"] == "A40"]
    out = [
        f"- dp == lattice (CBC) == lattice (HiGHS) on every row: {eq}",
        f"- cpsat <= dp on {le}/{len(rows)} rows, strictly better (> 1e-6 relative) on {strict}; "
        f"cpsat proved optimal on {opt}/{len(rows)} (others: time limit, `*`, bound shown)",
        f"- slowest solve: dp {mx('dp'):.2f} s, lattice CBC {mx('lattice'):.2f} s, lattice HiGHS "
        f"{mx('lattice-highs'):.2f} s, cpsat {mx('cpsat'):.1f} s",
    ]
    if a40:
        out.append("- hidden communication on A40 (paper: ~83 %): dp "
                   f"{min(r['res']['dp'].hidden_comm_fraction for r in a40):.0%}-"
                   f"{max(r['res']['dp'].hidden_comm_fraction for r in a40):.0%}, cpsat "
                   f"{min(r['res']['cpsat'].hidden_comm_fraction for r in a40):.0%}-"
                   f"{max(r['res']['cpsat'].hidden_comm_fraction for r in a40):.0%}, the paper's 17-block plan "
                   f"{min(r['res']['paper'].hidden_comm_fraction for r in a40):.0%}-"
                   f"{max(r['res']['paper'].hidden_comm_fraction for r in a40):.0%}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the full 72-row grid")
    ap.add_argument("--time-limit", type=float, default=None, help="CP-SAT / MILP seconds (default 5, full 9)")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    ap.add_argument("--write-readme", action="store_true", help="replace the pairing section of benchmarks/README.md")
    args = ap.parse_args(argv)
    tl = args.time_limit or (9.0 if args.full else 5.0)
    grid = FULL if args.full else REDUCED
    rows = []
    t0 = time.perf_counter()
    for k, cfg in enumerate(grid):
        rows.append(run_row(*cfg, time_limit=tl, workers=args.workers))
        print(f"[{k + 1}/{len(grid)}] {cfg} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    table, summ = fmt_table(rows), summary(rows)
    cmd = "python benchmarks/pairing.py" + (" --full" if args.full else "") + \
          (f" --time-limit {args.time_limit:g}" if args.time_limit else "") + \
          (f" --workers {args.workers}" if args.workers != 2 else "") + " --write-readme"
    print(table)
    print("\n".join(summ))
    if args.write_readme:
        _write_readme(cmd, table, summ, tl, args.workers, time.perf_counter() - t0, args.full)
    return 0


def _write_readme(cmd: str, table: str, summ: list[str], tl: float, workers: int, wall: float, full: bool) -> None:
    body = f"""{BEGIN}
## Segment pairing (DHelix): `benchmarks/pairing.py`

Command: `{cmd}` ({'full' if full else 'reduced'} grid, CP-SAT {tl:g} s limit with {workers} workers, seed 0;
whole run {wall:.0f} s on the shared 2-core CPU, other engineers' jobs running — solve times are
indicative, the layer-pair times are deterministic model predictions).

One layer pair = forward of one strand ∥ backward of the other, micro-batch 1, bf16, SP on, default
profile (no measurement: GEMM 70 %, attention 50 % of peak, links 80 % of nominal, OEF
GEMM∥collective 0.9, attention∥collective 0.75, memory-bound∥collective 0.5). Intra-node links:
A40 PCIe 25 GB/s, A800 NVLink 200 GB/s, H100 NVLink 450 GB/s, 5 µs latency. Columns:
*comm share* = TP communication / sequential time; *paper plan* = DHelix's hand-written 17-block
plan scored by our block cost; *dp* = Eq. 2 over refinements of the paper's base groups; *lattice*
= the same model as a MILP (equal by construction, an oracle); *dp(all)* = every contiguous segment;
*cpsat* = barrier-free schedule (`*` = time limit, not proven); *barrier cost* = (dp − cpsat)/dp;
*hidden* = 1 − (time − compute)/comm; *g* = 1 − dp/sequential, the W-shape saving.

{table}

{chr(10).join(summ)}

Reading the table: the DP (paper's segment set) can never lose to the paper's hand-written
17-block plan, because that plan lies inside the DP's segment set and the DP is optimal there; the
lattice MILP returns the same time on every row (the oracle). Barriers cost most where
communication is a large share and segments are coarse (A40 TP 8 long sequences, where `dp(all)`
already recovers part of it). Where the link time exceeds the compute time (LB = link), no
schedule can hide more than compute/comm of the communication, so the hidden fraction drops below
the paper's ~83 % there by necessity, not by solver weakness. CP-SAT rarely *proves* optimality
within the limit: its bound is the part that is hard (deciding that an overlap's penalty is
unavoidable), and the gap to the bound is printed instead of a claim.
{END}"""
    write_section(BEGIN, END, body, README)


if __name__ == "__main__":
    sys.exit(main())
