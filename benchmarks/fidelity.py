"""Fidelity of the cost model: the simulator's prediction (with a profile measured on this machine)
against the torch runtime's measured step time and peak memory, for small programs on gloo.

Usage::

    python benchmarks/fidelity.py                    # profile this machine, then measure all cases
    python benchmarks/fidelity.py --profile P.json   # reuse a profile measured at the same sizes
    python benchmarks/fidelity.py --quick            # 2 cases, few repeats (smoke test)
    python benchmarks/fidelity.py --readme           # also write the tables into benchmarks/README.md

Every case runs the same training job (model ``fid-small``, global batch 8 sequences of 128
tokens, fp32) under a different plan, so ranking the plans by predicted time is a real question.

Definitions
-----------
* predicted time: :func:`hexhelix.runtime.sim.simulate` makespan of the program compiled with the
  profile; PAIR ticks use the profile's measured compute-with-compute OEF (the runtime co-executes
  a PAIR's halves on two threads).
* measured time: per step, the slowest rank's wall time of ``Executor.run_step`` started after a
  barrier; median over the timed steps (after warm-up); spread = min..max over those steps.
* busy vs CPU time (per rank): the simulator's compute-stream busy time against the rank's process
  CPU time in the step (median). CPU time barely moves when other jobs share the cores, so this
  column checks the compute estimates even when wall times are disturbed (it also counts the CPU
  that communication and the runtime's Python take).
* predicted memory (per rank): model states (16 B/param ÷ TP: fp32 weights, grads, Adam m and v)
  + the simulator's peak of live activations and receive buffers — the cost model's terms without
  the runtime reserve.
* measured memory (per rank): peak resident set size during a timed step (``VmHWM``, reset
  before the step through ``/proc/self/clear_refs``) minus the resident bytes that are not
  tensors, taken just before the step as RSS minus the exact bytes of the live state tensors
  (weights, grads, Adam state). glibc is told to serve every allocation ≥ 64 KiB with its own
  mapping (``MALLOC_MMAP_THRESHOLD_``) so freed tensors leave the resident set at once. What
  remains is the tensor memory of the step: states, saved activations, autograd and optimizer
  temporaries, communication buffers. Memory is measured in a second launch of the program (1
  warm-up + 2 steps): the per-tensor mappings cost page faults that slow a step several-fold.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL_SPEC = dict(name="fid-small", layers=8, hidden=256, heads=8, kv_heads=8, ffn=704, vocab=256)
SEQ, GLOBAL_BATCH = 128, 8
OVERSUBSCRIBED = "ranks > cores"

# name -> (pipelines as [[(gpus, (lo, hi)), ...], ...], micro-batches per pipeline, schedule, micro-batch size)
CASES: dict[str, tuple[list[list[tuple[tuple[int, ...], tuple[int, int]]]], list[int], str, int]] = {
    "single-m8": ([[((0,), (0, 8))]], [8], "1f1b", 1),
    "gpipe-2x4/4-m8": ([[((0,), (0, 4)), ((1,), (4, 8))]], [8], "gpipe", 1),
    "1f1b-2x4/4-m8": ([[((0,), (0, 4)), ((1,), (4, 8))]], [8], "1f1b", 1),
    "1f1b-2x6/2-m8": ([[((0,), (0, 6)), ((1,), (6, 8))]], [8], "1f1b", 1),
    "1f1b-2x4/4-m4-b2": ([[((0,), (0, 4)), ((1,), (4, 8))]], [4], "1f1b", 2),
    "gpipe-2x5/3-m4-b2": ([[((0,), (0, 5)), ((1,), (5, 8))]], [4], "gpipe", 2),
    "tp2-m8": ([[((0, 1), (0, 8))]], [8], "1f1b", 1),
    "dp2-4+4": ([[((0,), (0, 8))], [((1,), (0, 8))]], [4, 4], "1f1b", 1),
    "dp2-6+2": ([[((0,), (0, 8))], [((1,), (0, 8))]], [6, 2], "1f1b", 1),
    "wshape-2-m8": ([[((0,), (0, 4)), ((1,), (4, 8))]], [8], "wshape", 1),
    "1f1b-4x2-m8": ([[((0,), (0, 2)), ((1,), (2, 4)), ((2,), (4, 6)), ((3,), (6, 8))]], [8], "1f1b", 1),
    "1f1b-2xtp2-m8": ([[((0, 1), (0, 4)), ((2, 3), (4, 8))]], [8], "1f1b", 1),
    "two-pipes-3r": ([[((0,), (0, 4)), ((1,), (4, 8))], [((2,), (0, 8))]], [5, 3], "1f1b", 1),
}
QUICK = ("1f1b-2x4/4-m8", "dp2-4+4")
MEMORY_STEPS = 2


# ----------------------------------------------------------------------------- planning side
def _model():
    from hexhelix.ir.model import ModelConfig

    return ModelConfig(**MODEL_SPEC)


def _training(micro_batch: int):
    from hexhelix.ir.model import TrainingConfig

    return TrainingConfig(global_batch=GLOBAL_BATCH, micro_batch=micro_batch, seq_len=SEQ, dtype="fp32",
                          sequence_parallel=False)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def get_profile(path: str | None, nproc: int, quick: bool, out: Path):
    """Load ``path`` or profile this machine at the benchmark's sizes (TP 1 and 2)."""
    from hexhelix.ir.opgraph import OpClass
    from hexhelix.ir.profile import load_profile
    from hexhelix.runtime.profiler import ProfileOptions, calibrate, measure
    from hexhelix.solver import cost

    if path:
        return load_profile(path), path
    opts = ProfileOptions(model=_model(), training=_training(1), tp_degrees=(1, 2), nproc=nproc, quick=quick)
    raw = measure(opts, progress=_progress)
    prof = calibrate(raw, steps=lambda c, n: float(cost.collective_steps(OpClass(c), n)),
                     factor=lambda c, n: cost.ring_factor(OpClass(c), n))
    out.write_text(json.dumps(prof.to_dict(), indent=1) + "\n")
    return prof, str(out)


def build_program(name: str, profile, cluster):
    from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
    from hexhelix.solver.compile import compile_plan

    pipes, mbs, schedule, b = CASES[name]
    problem = PlanProblem(cluster=cluster, model=_model(), training=_training(b), schedule=schedule)
    plan = Plan(problem=problem, pipelines=tuple(
        PipelinePlan(stages=tuple(StagePlan(node=0, gpus=g, layers=lay) for g, lay in pipe), micro_batches=m)
        for pipe, m in zip(pipes, mbs)))
    return compile_plan(plan, profile=profile)


def predict(program, profile) -> dict[str, Any]:
    from hexhelix.runtime.sim import SimOptions, simulate

    res = simulate(program, SimOptions(record=False, reserve_bytes=0,
                                       pair_oef=profile.overlap("gemm", "gemm")))
    return {"time_s": res.makespan_s, "busy_s": [r.busy_s for r in res.ranks],
            "mem_bytes": [r.state_bytes + r.peak_activation_bytes for r in res.ranks]}


# ----------------------------------------------------------------------------- measuring side
def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def _state_bytes(ex: Any) -> int:
    """Bytes of the tensors a rank keeps between steps: weights, grads and optimizer state."""
    import torch

    n = sum(p.numel() * p.element_size() + (p.grad.numel() * p.grad.element_size() if p.grad is not None else 0)
            for p in ex.params.values())
    for st in ex.optimizer.state.values():
        n += sum(v.numel() * v.element_size() for v in st.values() if isinstance(v, torch.Tensor))
    return n


def _rank_main(rank: int, world: int, port: int, prog_path: str, warmup: int, steps: int, out: str,
               mode: str) -> None:
    """One rank: ``mode`` "time" runs timed steps (wall and CPU time); "memory" runs steps under
    per-tensor mappings (set through the environment by the parent) and records peak memory."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from hexhelix.ir.program import Program
    from hexhelix.runtime.torch_exec import Executor, RunOptions
    from hexhelix.runtime.torch_groups import RankContext, create_groups

    torch.set_num_threads(1)  # what torchrun gives each rank
    program = Program.load(prog_path)
    timeout = timedelta(seconds=120)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timeout)
    ctx = RankContext(rank=rank, program=program, device=torch.device("cpu"), backend="gloo", timeout=timeout)
    create_groups(ctx)
    dist.barrier()
    ex = Executor(ctx, RunOptions(seed=0, dataset="synthetic"))
    times, cpu, peaks = [], [], []
    for step in range(warmup + steps):
        dist.barrier()
        # Resident bytes that are not tensors (code pages faulted in by the first steps, the
        # Python heap, gloo buffers): RSS between steps minus the live state tensors.
        overhead = _status("VmRSS:") - _state_bytes(ex)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        c0, t0 = time.process_time(), time.perf_counter()
        ex.run_step(step)
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if step >= warmup:
            times.append(t)
            cpu.append(c)
            peaks.append(_status("VmHWM:") - overhead)
    ex.close()
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    result = {"times": t.tolist(), "cpu": statistics.median(cpu)} if mode == "time" else {"peak": max(peaks)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    # Leave without interpreter teardown (as runtime/__main__.py does): gloo's C++ thread
    # destructors at exit occasionally abort a rank after a clean run ("terminate called without
    # an active exception"). The result is written and the group destroyed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _launch(program, warmup: int, steps: int, mode: str, timeout_s: float) -> list[dict[str, Any]]:
    """Spawn the program's ranks once; retry once if a rank dies before writing its result."""
    import torch.multiprocessing as mp
    from hexhelix.runtime.profiler_comm import free_port, patched_environ

    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # as torchrun sets them
    if mode == "memory":  # glibc reads it at start: every allocation >= 64 KiB gets its own mapping
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    with patched_environ(env, remove=() if mode == "memory" else ("MALLOC_MMAP_THRESHOLD_",)):
        for attempt in range(2):
            with tempfile.TemporaryDirectory(prefix="hexhelix-fid-") as tmp:
                prog = Path(tmp, "program.json")
                prog.write_text(program.to_json())
                ctx = mp.start_processes(_rank_main, nprocs=program.world_size, start_method="spawn", join=False,
                                         args=(program.world_size, free_port(), str(prog), warmup, steps, tmp, mode))
                deadline = time.monotonic() + timeout_s
                try:
                    while not ctx.join(timeout=1.0):
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"no result within {timeout_s:.0f} s")
                except (mp.ProcessRaisedException, mp.ProcessExitedException, TimeoutError) as err:
                    # A rank that dies in teardown after writing its result still measured the step.
                    print(f"  rank failure (attempt {attempt + 1}): {str(err).strip().splitlines()[-1]}",
                          file=sys.stderr, flush=True)
                finally:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                files = [Path(tmp, f"rank{r}.json") for r in range(program.world_size)]
                if all(f.exists() for f in files):
                    return [json.loads(f.read_text()) for f in files]
        raise RuntimeError("the runtime failed twice on this program")


def measure_program(program, warmup: int, steps: int, timeout_s: float = 300.0,
                    memory: list[int] | None = None) -> dict[str, Any]:
    """Timed steps in one launch, memory steps in another (per-tensor mappings cost page faults
    that would slow the timed steps several-fold); ``memory`` reuses an earlier round's peaks."""
    timed = _launch(program, warmup, steps, "time", timeout_s)
    if memory is None:
        memory = [r["peak"] for r in _launch(program, 1, MEMORY_STEPS, "memory", timeout_s)]
    times = timed[0]["times"]
    return {"time_s": statistics.median(times), "time_min": min(times), "time_max": max(times),
            "mem_bytes": memory, "cpu_s": [r["cpu"] for r in timed]}


# ----------------------------------------------------------------------------- statistics
def ranks_of(xs: list[float]) -> list[float]:
    """Average ranks (1-based; ties share the mean rank)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation: Pearson correlation of the average ranks.

    >>> spearman([1, 2, 3], [10, 20, 30]), spearman([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
    """
    rx, ry = ranks_of(list(xs)), ranks_of(list(ys))
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def ape(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE of time and memory, Spearman of the plans by time, and whether the best predicted plan
    is the best measured one (among the rows given)."""
    pt, mt = [r["pred"]["time_s"] for r in rows], [r["meas"]["time_s"] for r in rows]
    mem = [ape(p, m) for r in rows for p, m in zip(r["pred"]["mem_bytes"], r["meas"]["mem_bytes"])]
    best_p = min(range(len(rows)), key=lambda i: pt[i])
    best_m = min(range(len(rows)), key=lambda i: mt[i])
    busy = [ape(p, m) for r in rows for p, m in zip(r["pred"]["busy_s"], r["meas"]["cpu_s"])]
    return {"n": len(rows), "time_mape": statistics.fmean(ape(p, m) for p, m in zip(pt, mt)),
            "busy_mape": statistics.fmean(busy),
            "time_spearman": spearman(pt, mt), "best_pred": rows[best_p]["name"],
            "best_meas": rows[best_m]["name"], "mem_mape": statistics.fmean(mem)}


# ----------------------------------------------------------------------------- report
def render(rows: list[dict[str, Any]], rounds: list[dict[str, Any]], profile, profile_path: str, cmd: str,
           cores: int) -> str:
    loads = [x for rd in rounds for r in rd["rows"] for x in r["meas"]["load"]]
    earlier = {r["name"]: [rd["rows"][i]["meas"]["time_s"] for rd in rounds[:-1]] for i, r in enumerate(rows)}
    lines = [f"Command: `{cmd}` — profile `{profile_path}`; {cores} CPU cores; model fid-small "
             f"(8 layers, h 256, 8 heads, ffn 704), global batch {GLOBAL_BATCH} x {SEQ} tokens, fp32, gloo; "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 1-minute load average during the cases "
             f"{min(loads):.1f}..{max(loads):.1f} (other jobs shared the cores).", "",
             f"Per-plan rows are the last of {len(rounds)} round(s); *earlier rounds* lists the other rounds' "
             "measured medians.", "",
             "| plan | ranks | pred. step | measured step (min..max) | earlier rounds | time err | pred. busy/rank | "
             "CPU time/rank | pred. mem/rank MiB | measured mem/rank MiB | mem err |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, m = r["pred"], r["meas"]
        pm = "/".join(f"{x / 2**20:.1f}" for x in p["mem_bytes"])
        mm = "/".join(f"{x / 2**20:.1f}" for x in m["mem_bytes"])
        me = statistics.fmean(ape(a, b) for a, b in zip(p["mem_bytes"], m["mem_bytes"]))
        flag = f" ({OVERSUBSCRIBED})" if r["world"] > cores else ""
        pb = "/".join(f"{x * 1e3:.0f}" for x in p["busy_s"])
        mb = "/".join(f"{x * 1e3:.0f}" for x in m["cpu_s"])
        lines.append(f"| {r['name']}{flag} | {r['world']} | {p['time_s'] * 1e3:.1f} ms | {m['time_s'] * 1e3:.1f} ms "
                     f"({m['time_min'] * 1e3:.1f}..{m['time_max'] * 1e3:.1f}) | "
                     f"{' / '.join(f'{x * 1e3:.1f}' for x in earlier[r['name']]) or '—'} | {ape(p['time_s'], m['time_s']):.1%} "
                     f"| {pb} ms | {mb} ms | {pm} | {mm} | {me:.1%} |")
    lines += ["", "| subset | plans | time MAPE | Spearman (time) | best predicted | best measured | busy vs CPU MAPE "
              "| memory MAPE |", "|---|---|---|---|---|---|---|---|"]
    for rd in rounds:
        for label, s in rd["summaries"].items():
            lines.append(f"| round {rd['round']}: {label} | {s['n']} | {s['time_mape']:.1%} | {s['time_spearman']:.2f} "
                         f"| {s['best_pred']} | {s['best_meas']} | {s['busy_mape']:.1%} | {s['mem_mape']:.1%} |")
    lines += ["", activation_note(profile)]
    return "\n".join(lines) + "\n"


def activation_note(profile) -> str:
    """The cost model's activation bytes per layer and micro-batch (with this profile) against what
    autograd saved in the profiler's run of the runtime's stage module (the profile's meta)."""
    from hexhelix.solver.cost import activation_bytes_per_layer

    saved = profile.meta.get("saved_activation_bytes_per_layer", {})
    parts = [f"TP {tp}: formula {activation_bytes_per_layer(_model(), _training(1), int(tp), profile) / 2**20:.2f}"
             f" MiB, autograd saved {b / 2**20:.2f} MiB" for tp, b in sorted(saved.items())]
    kept = ("keeps" if profile.attention_scores_saved else "drops")
    return ("Activation bytes per layer and micro-batch (b 1): " + "; ".join(parts) + ". The profile says "
            f"attention_scores_saved = {str(profile.attention_scores_saved).lower()} (whether autograd kept an "
            f"(…, s, s) score tensor in the runtime's layer), so the formula {kept} the 5·a·s²·b term "
            "(Korthikanti et al.).") if parts else ""


def write_readme(text: str) -> None:
    readme = ROOT / "benchmarks" / "README.md"
    start, end = "<!-- fidelity:start -->", "<!-- fidelity:end -->"
    body = readme.read_text()
    block = f"{start}\n{text}{end}"
    if start in body and end in body:
        body = body[:body.index(start)] + block + body[body.index(end) + len(end):]
    else:
        body = body.rstrip() + "\n\n## Fidelity: predicted vs measured (issue 8)\n\n" + block + "\n"
    readme.write_text(body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="profile JSON measured at these sizes (default: measure now)")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--quick", action="store_true", help=f"cases {', '.join(QUICK)}; 1 warm-up, 3 steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=7, help="timed steps per case (median)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep to show its spread")
    ap.add_argument("--readme", action="store_true", help="write the tables into benchmarks/README.md")
    ap.add_argument("--json", help="also write every row as JSON here")
    args = ap.parse_args(argv)
    from hexhelix.ir.cluster import Cluster
    from hexhelix.runtime.profiler import local_cluster

    names = QUICK if args.quick else tuple(args.cases.split(",") if args.cases else CASES)
    warmup, steps = (1, 3) if args.quick else (args.warmup, args.steps)
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    profile, ppath = get_profile(args.profile, 2, args.quick, out_dir / "fidelity-profile.json")
    cores = os.cpu_count() or 1
    cluster = Cluster.from_dict(local_cluster(profile, count=4, memory_gib=8.0))
    programs = {n: build_program(n, profile, cluster) for n in names}
    rounds: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for rd in range(args.rounds):
        rows = []
        for n in names:
            prog = programs[n]
            pred = predict(prog, profile)
            print(f"fidelity: round {rd}: {n} on {prog.world_size} ranks ...", file=sys.stderr, flush=True)
            load0 = os.getloadavg()[0]
            mem = rounds[0]["rows"][len(rows)]["meas"]["mem_bytes"] if rounds else None  # deterministic
            meas = measure_program(prog, warmup, steps, memory=mem)
            meas["load"] = (load0, os.getloadavg()[0])
            rows.append({"name": n, "world": prog.world_size, "pred": pred, "meas": meas})
            print(f"  predicted {pred['time_s'] * 1e3:.1f} ms, measured {meas['time_s'] * 1e3:.1f} ms "
                  f"({meas['time_min'] * 1e3:.1f}..{meas['time_max'] * 1e3:.1f})", file=sys.stderr, flush=True)
        fit = [r for r in rows if r["world"] <= cores]
        summaries = {"all plans": summarize(rows)}
        if fit and len(fit) < len(rows):
            summaries[f"plans with ranks <= {cores} cores"] = summarize(fit)
        rounds.append({"round": rd, "rows": rows, "summaries": summaries})
    cmd = "python benchmarks/fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(rows, rounds, profile, os.path.relpath(ppath, ROOT), cmd.strip(), cores)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x
                                               for x in rounds], indent=1))
    if args.readme:
        write_readme(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
