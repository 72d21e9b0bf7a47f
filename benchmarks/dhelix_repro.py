"""DHelix reproduction (run through ``benchmarks/reproduce.py --part dhelix``): the W-shaped schedule
with segment pairing against 1F1B, per cluster type (A40, A800, H100) and the TP / sequence settings
of the paper's figures (shared/reference/dhelix.md §5), scored by the evaluator and by the simulator
on compiled programs, the paper's reported gain beside ours.

g (the saving of one co-executed layer pair) comes from the pairing DP (``solver.pairing``); a second
g charges each pairing block the paper's "launch interval" (kernel launch + barrier between paired
blocks, 10–20 % of the communication time, paper Table 7) to show how much of the gain that eats.
"""

from __future__ import annotations

import time

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.pairing import dhelix_default_plan
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.runtime.sim import SimOptions, simulate
from hexhelix.solver import cost
from hexhelix.solver.compile import compile_plan
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.pairing import pair_saving, results_to_dict, score_pairing_plan, solve_pairing
from hexhelix.solver.pairing_costs import build_pairing_problem

# cluster type → (catalog GPU, nodes of 8, intra-node GB/s, inter-node GB/s); paper §5.3 [S]: A40 PCIe +
# 100 Gb/s IB, A800 NVLink + 200 Gb/s IB, H100 4×8 (NVLink; IB speed not given, 400 Gb/s assumed)
CLUSTERS = {"A40": ("A40", 8, 25.0, 12.5), "A800": ("A800-SXM4-80GB", 8, 200.0, 25.0),
            "H100": ("H100-SXM5-80GB", 4, 450.0, 50.0)}

# (cluster, our model, paper model and layout, DP, TP, PP, seq, global batch, paper gain vs Megatron).
# Paper CP runs (no CP here) are modelled with the CP ranks folded into TP (TP·CP ≤ 8, inside a node),
# the same sequence length and GPU count. GPT rows use Llama-shaped stand-ins; the 30B/39B rows use
# llama2-13b because llama-30b's 52 heads do not divide TP 8 (and llama2-70b does not fit 48 GB at PP 2).
SETTINGS = [
    ("A40", "llama2-7b", "Llama-8B (16,4,1)", 16, 4, 1, 4096, 128, "1.31×"),
    ("A40", "llama2-13b", "Llama-25B (8,8,1)", 8, 8, 1, 4096, 64, "1.40×"),
    ("A40", "llama2-13b", "Llama-39B (4,8,2)", 4, 8, 2, 4096, 64, "1.27×"),
    ("A40", "gpt-6.7b", "GPT-6.7B (16,4,1)", 16, 4, 1, 4096, 128, "1.26×"),
    ("A40", "llama2-13b", "GPT-18B (8,8,1)", 8, 8, 1, 4096, 64, "1.40×"),
    ("A40", "llama2-13b", "GPT-30B (4,8,2)", 4, 8, 2, 4096, 64, "1.36×"),
    ("A40", "llama2-7b", "Llama-8B long-seq (8,4,CP2,1)", 8, 8, 1, 16384, 32, "1.30×"),
    ("A40", "llama2-13b", "Llama-25B long-seq (4,8,CP2,1)", 8, 8, 1, 16384, 32, "1.30×"),
    ("A40", "gpt-6.7b", "GPT-6.7B long-seq (8,4,CP2,1)", 8, 8, 1, 16384, 32, "1.31×"),
    ("A800", "llama2-13b", "no paper point; A800 range 1.02–1.29×", 8, 8, 1, 4096, 64, "—"),
    ("A800", "llama2-70b", "Llama-66B seq 16k (2,8,CP2,2)", 2, 8, 4, 16384, 16, "1.07×"),
    ("A800", "llama2-70b", "Llama-66B seq 32k (1,8,CP4,2)", 1, 8, 8, 32768, 16, "1.24×"),
    ("H100", "llama2-13b", "no paper point; paper: gain shrinks on H100", 4, 8, 1, 4096, 64, "—"),
    ("H100", "llama2-70b", "no paper point", 1, 8, 4, 4096, 32, "—"),
]
LAUNCH_SHARE = 0.15  # launch interval per layer pair as a share of its TP communication (paper: 10–20 %)


def cluster(kind: str) -> Cluster:
    gpu, nodes, intra, inter = CLUSTERS[kind]
    return Cluster.from_dict({"name": f"{nodes * 8}x{kind}", "inter_GBps": inter, "latency_us": 10,
                              "nodes": [{"name": f"{kind.lower()}-{i}", "gpu": gpu, "count": 8, "intra_GBps": intra}
                                        for i in range(nodes)]})


def megatron_plan(cl: Cluster, model: str, seq: int, gb: int, dp: int, tp: int, pp: int, recompute: str,
                  schedule: str) -> Plan:
    """DP identical pipelines of PP stages of TP consecutive GPUs inside a node, layers split evenly."""
    mc = PRESETS[model]
    problem = PlanProblem(cluster=cl, model=mc, schedule=schedule,
                          training=TrainingConfig(global_batch=gb, seq_len=seq, recompute=recompute))
    per = mc.layers // pp
    pipes = []
    for q in range(dp):
        stages = []
        for k in range(pp):
            gpus = tuple(range((q * pp + k) * tp, (q * pp + k + 1) * tp))
            stages.append(StagePlan(node=gpus[0] // 8, gpus=gpus,
                                    layers=(k * per, mc.layers if k == pp - 1 else (k + 1) * per)))
        pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=gb // dp))
    return Plan(problem=problem, pipelines=tuple(pipes))


def _g_with_launch(problem_args: tuple, link: cost.Link) -> tuple[float, float]:
    """(g of the paper's 17-block plan, g of the DP when every block costs the launch interval)."""
    pp = build_pairing_problem(*problem_args, link)
    seq = sum(o.duration_s for o in pp.ops)
    comm = sum(o.duration_s for o in pp.ops if o.is_comm)
    paper = score_pairing_plan(pp, dhelix_default_plan(), "paper")
    g_paper = 1.0 - paper.makespan_s / seq
    per_block = LAUNCH_SHARE * comm / len(dhelix_default_plan().blocks)
    pl = build_pairing_problem(*problem_args, link, block_overhead_s=per_block)
    d = results_to_dict(pl, [solve_pairing(pl, "dp")])
    return g_paper, max(0.0, d["results"][0]["saving_g"] or 0.0)


def dhelix_rows(quick: bool = False) -> tuple[list[str], list[dict[str, float | str]]]:
    rows = ["| GPUs | our model (paper model, layout) | DP,TP,PP | seq | m/pipe | g dp | g paper plan | "
            "g dp + launch | W gain evaluator | W gain sim | W gain, launch | paper gain | peak GiB W (cap) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    stats: list[dict[str, float | str]] = []
    for kind, model, paper_model, dp, tp, pp, seq, gb, paper in (SETTINGS[:2] + SETTINGS[-1:] if quick else SETTINGS):
        t0 = time.monotonic()
        cl = cluster(kind)
        recompute = "full" if seq >= 32768 else "selective"
        one = megatron_plan(cl, model, seq, gb, dp, tp, pp, recompute, "1f1b")
        w = megatron_plan(cl, model, seq, gb, dp, tp, pp, recompute, "wshape")
        tr, gpu, link = one.problem.training, cl.gpu_of_node(0), cost.cluster_link(cl, 0, 0)
        g = pair_saving(PRESETS[model], tr, tp, gpu, link)
        g_paper, g_launch = _g_with_launch((PRESETS[model], tr, tp, gpu), link)
        ev1 = evaluate(one).iteration_time_s
        evw = evaluate(w, pair_savings={tp: g}).iteration_time_s
        evl = evaluate(w, pair_savings={tp: g_launch}).iteration_time_s
        s1 = simulate(compile_plan(one), SimOptions(record=False))
        sw = simulate(compile_plan(w, pairing={tp: g}), SimOptions(record=False))
        gib = 2.0**30
        rows.append(
            f"| {cl.num_gpus}×{kind} | {model} ({paper_model}) | {dp},{tp},{pp} | {seq // 1024}k | {gb // dp} | "
            f"{g:.3f} | {g_paper:.3f} | {g_launch:.3f} | {ev1 / evw:.2f}× | {s1.makespan_s / sw.makespan_s:.2f}× | "
            f"{ev1 / evl:.2f}× | {paper} | {max(sw.peak_memory_bytes) / gib:.1f} "
            f"({sw.ranks[0].capacity_bytes / gib:.0f}){' OOM' if sw.over_capacity_ranks else ''} |")
        print(rows[-1], f"({time.monotonic() - t0:.1f} s)", flush=True)
        stats.append({"kind": kind, "ev": ev1 / evw, "sim": s1.makespan_s / sw.makespan_s, "launch": ev1 / evl,
                      "paper": paper})
    return rows, stats


def dhelix_reading(stats: list[dict[str, float | str]]) -> list[str]:
    """Computed summary lines per cluster type (no number typed by hand)."""
    out = []
    for kind in CLUSTERS:
        st = [x for x in stats if x["kind"] == kind]
        if not st:
            continue

        def rng(key: str, rows: list[dict[str, float | str]] = st) -> str:
            v = [float(x[key]) for x in rows]
            return f"{min(v):.2f}–{max(v):.2f}×"

        papers = [float(str(x["paper"]).rstrip("×")) for x in st if str(x["paper"]).rstrip("×")
                  .replace(".", "", 1).isdigit()]
        paper = f"{min(papers):.2f}–{max(papers):.2f}× on the same rows" if papers else "no per-setting number"
        out.append(f"- {kind}: W gain {rng('ev')} (evaluator), {rng('sim')} (simulator), {rng('launch')} with the "
                   f"launch interval; paper {paper}.")
    return out


def dhelix_section(rows: list[str], stats: list[dict[str, float | str]], cmd: str, wall: float) -> list[str]:
    return [
        "## DHelix reproduction: `benchmarks/reproduce.py --part dhelix`", "",
        f"Command: `{cmd}` (this part {wall:.0f} s on the shared 2-core CPU).", "",
        "Megatron layout (DP identical pipelines, TP inside a node, layers split evenly, SP on), micro-batch 1, "
        "bf16, selective recompute (full at 32k), default profile (GEMM 70 %, attention 50 %, links 80 %, OEF "
        "table of `ir/profile.py`). Clusters: A40 8×8, PCIe 25 GB/s, 100 Gb/s IB; A800 8×8, NVLink 200 GB/s, "
        "200 Gb/s IB; H100 4×8, NVLink 450 GB/s, 400 Gb/s IB assumed. Our presets stand in for the paper's "
        "models (no 8B/25B/39B/66B or GPT presets: same-size Llama shapes), and hexhelix has no context "
        "parallelism: the paper's CP runs are modelled with TP·CP as the TP degree (≤ 8, inside a node) at the "
        "same sequence length and GPU count. Cross-node TP (the paper's H100 TP 8→32 point, +17 %) is outside "
        "the model: TP groups stay inside a node.", "",
        "*g dp* = saving of one co-executed layer pair from the pairing DP (`solver.pairing.pair_saving`); "
        "*g paper plan* = the paper's hand-written 17-block plan scored by the same block cost; *g dp + launch* = "
        f"the DP when each block also costs a launch interval ({100 * LAUNCH_SHARE:.0f} % of the pair's TP "
        "communication spread over 17 blocks; the paper measures 10–20 %). *W gain* = 1F1B iteration time / "
        "W-shape iteration time (gradient sync and optimizer included, identical in both) from the evaluator "
        "(`solver.evaluate`, closed-form W makespan (f+b)(P+(m−1)(1−g))) and from the simulator on compiled "
        "programs (`compile_plan(..., pairing={tp: g})`). 1F1B is Megatron with no TP-communication overlap; "
        "the paper's baseline Megatron-LM overlaps some, so our gains are upper-side.", "",
        *rows, "",
        *dhelix_reading(stats), "",
        "Reading: the gain follows g, i.e. the share of TP communication in a layer the pairing can hide (PCIe "
        "A40 highest; NVLink A800 lowest, lower still at long sequences where attention compute grows as s²), "
        "and co-executed ticks need m > P micro-batches per pipeline. The A800 32k row misses the paper's 1.24× "
        "because its gain came from overlapping context-parallel rings, which hexhelix does not model (we run "
        "TP 8 with full recompute there). On H100 the model predicts *larger* gains than on A800 — its compute "
        "is 3.2× an A800's while NVLink 4 is 2.25× NVLink 3, so communication is a larger share — whereas the "
        "paper reports the gain shrinking on H100: with one default efficiency and overlap table for every GPU "
        "the model cannot show that; a measured H100 profile (`hexhelix profile --backend nccl`) would. The "
        "paper's own 17-block plan scores below the DP's plan on every row (*g paper plan* < *g dp*), and the "
        "launch interval costs a few points of gain. All of it is cost-model prediction, not measurement.",
    ]
