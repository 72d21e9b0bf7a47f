"""Torch runtime overhead: a replayed program against a plain hand-written PyTorch loop doing the
same work, and sequential against co-executed strands (W-shape PAIR), measured side by side.

    python benchmarks/runtime.py                 # print the tables
    python benchmarks/runtime.py --write-readme  # also replace the section in benchmarks/README.md

Model ``bench``: 4 layers, hidden 256, 8 heads, ffn 704, vocab 256; fp32; micro-batch 2 × 128 tokens;
gloo on CPU, one torch thread per rank. Every case runs in the same processes: each repeat times
one step of each variant (order alternating between repeats), after a barrier, as the slowest
rank's wall time; the table gives medians.

* 1 rank: ``Executor.run_step`` of a 1-stage program (4 micro-batches) vs a loop of forward /
  backward(loss/4) per micro-batch and one AdamW step on the same module shapes.
* 2-stage pipeline: the compiled 1F1B program vs a hand-written 1F1B (warm-up, steady, cool-down)
  with ``dist.isend``/``dist.irecv`` of the boundary tensors, 8 micro-batches.
* strands: the W-shape program (2 stages, 8 micro-batches; and with TP-2 stages on 4 ranks) with
  PAIR halves co-executed on two threads vs run one after the other (``--sequential``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from readme_section import write_section

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- runtime:begin -->", "<!-- runtime:end -->"
SEQ, MB = 128, 2


def _model():
    from hexhelix.ir.model import ModelConfig

    return ModelConfig(name="bench", layers=4, hidden=256, heads=8, kv_heads=8, ffn=704, vocab=256)


def build_program(stages: list[tuple[tuple[int, ...], tuple[int, int]]], m: int, schedule: str):
    from hexhelix.ir.cluster import Cluster
    from hexhelix.ir.model import TrainingConfig
    from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
    from hexhelix.solver.compile import compile_plan

    cl = Cluster.from_dict({"name": "cpu", "inter_GBps": 12.5,
                            "nodes": [{"name": "n0", "gpu": "A100-SXM4-80GB", "count": 8, "intra_GBps": 300}]})
    tr = TrainingConfig(global_batch=m * MB, micro_batch=MB, seq_len=SEQ, dtype="fp32", sequence_parallel=False)
    pipe = PipelinePlan(stages=tuple(StagePlan(node=0, gpus=g, layers=lay) for g, lay in stages), micro_batches=m)
    return compile_plan(Plan(problem=PlanProblem(cluster=cl, model=_model(), training=tr, schedule=schedule),
                             pipelines=(pipe,)))


CASES = {
    "1 rank": ([((0,), (0, 4))], 4, "1f1b"),
    "2-stage 1F1B": ([((0,), (0, 2)), ((1,), (2, 4))], 8, "1f1b"),
    "W-shape, 2 stages": ([((0,), (0, 2)), ((1,), (2, 4))], 8, "wshape"),
    "W-shape, 2 stages of TP 2": ([((0, 1), (0, 2)), ((2, 3), (2, 4))], 8, "wshape"),
}


# ----------------------------------------------------------------------------- hand-written loops
class Plain:
    """The same work as the program of a 1F1B pipeline, written directly: this rank's stage module,
    AdamW, blocking-free isend/irecv of the boundary tensors, loss scaled by 1/m."""

    def __init__(self, program, rank: int):
        import torch
        from hexhelix.runtime.data import DataSource
        from hexhelix.runtime.torch_model import OptimConfig, StageModule
        from hexhelix.runtime.torch_tp import TPComm

        st = next(s for s in program.stages if rank in s.ranks)
        self.k, self.K = st.phys, len(program.stages)
        self.m = program.pipes[0].micro_batches
        self.rank = rank
        self.net = StageModule(program.model, range(*st.layers), embed=st.embed, head=st.head)
        self.opt = OptimConfig().build(self.net.parameters())
        self.comm = TPComm(group=None)
        self.data = DataSource(seed=0, micro_batch=MB, seq_len=SEQ, vocab=256, dataset="synthetic")
        self.shape = (MB, SEQ, program.model.hidden)
        self.torch = torch

    def step(self, step: int) -> None:
        import torch.distributed as dist

        torch = self.torch
        stash, sends = {}, []
        k, K, m = self.k, self.K, self.m

        def fwd(i: int) -> None:
            tok, tgt = self.data.micro_batch_at(step, i)
            if k == 0:
                x, inp = None, tok
            else:
                x = torch.empty(self.shape)
                dist.irecv(x, src=self.rank - 1, tag=0).wait()
                x.requires_grad_(True)
                inp = x
            if k == K - 1:
                out = self.net(inp, self.comm, tgt) / m
            else:
                out = self.net(inp, self.comm)
                t = out.detach()
                sends.append((dist.isend(t, dst=self.rank + 1, tag=0), t))
            stash[i] = (out, x)

        def bwd(i: int) -> None:
            out, x = stash.pop(i)
            if k == K - 1:
                out.backward()
            else:
                g = torch.empty(self.shape)
                dist.irecv(g, src=self.rank + 1, tag=1).wait()
                out.backward(g)
            if x is not None:
                sends.append((dist.isend(x.grad, dst=self.rank - 1, tag=1), x.grad))

        warm = min(K - k - 1, m)
        for i in range(warm):
            fwd(i)
        for i in range(m - warm):
            fwd(warm + i)
            bwd(i)
        for i in range(m - warm, m):
            bwd(i)
        for w, _ in sends:
            w.wait()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- workers
def _worker(rank: int, world: int, port: int, case: str, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist
    from hexhelix.runtime.torch_exec import Executor, RunOptions
    from hexhelix.runtime.torch_groups import RankContext, create_groups

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = timedelta(seconds=300)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    stages, m, schedule = CASES[case]
    program = build_program(stages, m, schedule)
    ctx = RankContext(rank=rank, program=program, device=torch.device("cpu"), backend="gloo", timeout=timeout)
    create_groups(ctx)
    replay = Executor(ctx, RunOptions(dataset="synthetic"))
    if schedule == "wshape":
        seq = Executor(ctx, RunOptions(dataset="synthetic", co_execute=False))
        variants = {"co-executed": replay.run_step, "sequential": seq.run_step}
    else:
        plain = Plain(program, rank)
        variants = {"replayed program": replay.run_step, "hand-written loop": plain.step}
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(repeats + 1):  # repeat 0 warms up
        for name in (names if rep % 2 else names[::-1]):
            dist.barrier()
            t = time.perf_counter()
            variants[name](rep)
            dt = torch.tensor([time.perf_counter() - t])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if rep:
                times[name].append(float(dt))
    if rank == 0:
        queue.put((case, times))
    dist.destroy_process_group()


def run_case(case: str, repeats: int, port: int) -> dict[str, list[float]]:
    """Spawn the case's ranks; rank 0 returns every variant's per-repeat step times."""
    import torch.multiprocessing as mp

    world = len({r for g, _ in CASES[case][0] for r in g})
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, case, repeats, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    _, times = queue.get(timeout=900)
    for p in procs:
        p.join(timeout=60)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    from runtime_cases import free_port

    t0 = time.time()
    rows_over, rows_strand = [], []
    for case in CASES:
        times = run_case(case, args.repeats, free_port())
        med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
        names = list(med)
        ratio = med[names[0]] / med[names[1]]
        row = f"| {case} | {med[names[0]]:.1f} | {med[names[1]]:.1f} | {100 * (ratio - 1):+.1f} % |"
        (rows_strand if "W-shape" in case else rows_over).append(row)
        print(row, flush=True)
    wall = time.time() - t0
    text = "\n".join([
        BEGIN,
        "## Torch runtime (issue 7): `benchmarks/runtime.py`",
        "",
        f"Command: `python benchmarks/runtime.py --repeats {args.repeats} --write-readme` (whole run {wall:.0f} s "
        "on the shared 2-core CPU while other engineers' jobs ran — absolute times are noisy; each "
        "ratio compares the two variants measured alternately in the same processes; medians of "
        f"{args.repeats} steps after one warm-up).",
        "",
        "Model: 4 layers, hidden 256, 8 heads, ffn 704, vocab 256, fp32, micro-batch 2 × 128 tokens, "
        "gloo, one torch thread per rank. Step time = slowest rank's wall time of one optimizer step.",
        "",
        "| case | replayed program ms | hand-written loop ms | overhead |",
        "|---|---|---|---|",
        *rows_over,
        "",
        "| case (W-shape, PAIR halves) | co-executed ms | sequential ms | co-executed vs sequential |",
        "|---|---|---|---|",
        *rows_strand,
        "",
        "Reading: the replay's own work per step is a dictionary dispatch and a watchdog position update "
        "per instruction, the GRAD_SYNC weight multiply (a one-rank group still scales) and the loss "
        "bookkeeping; against a step of a few hundred ms that is below the run-to-run noise of this "
        "shared machine (differences of a few per cent either way are noise; the goal is ≤ 5 %). "
        "Co-execution runs a PAIR's halves on two threads: it can only win by hiding a wait of one "
        "strand (its RECV, or a TP all-reduce waiting for the TP peer) behind the other strand's "
        "compute. With TP-1 stages there is little to hide; with TP-2 stages on more ranks than cores "
        "the TP peers wait for each other often and co-execution fills those waits. This is a CPU "
        "measurement of the mechanism, not of DHelix's GPU speed-up (one CUDA stream per process here: "
        "on GPU both halves would also need their own streams to overlap kernels).",
        END,
    ])
    print(text)
    if args.write_readme:
        write_section(BEGIN, END, text, README)
    return 0


if __name__ == "__main__":
    sys.exit(main())
