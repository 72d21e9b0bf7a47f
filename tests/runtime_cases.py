"""Programs for the torch-runtime tests and benchmark: small plans of the ``tiny`` model on a
synthetic one-node cluster, compiled with :func:`hexhelix.solver.compile.compile_plan`.

Each case is ``name -> (stages per pipeline as [(gpus, (lo, hi)), ...], micro-batches per
pipeline)``; the global batch is the sum of the micro-batches (micro-batch size 1).
"""

from __future__ import annotations

from pathlib import Path

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.model import PRESETS
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.program import Program

SEQ_LEN = 32

CASES: dict[str, tuple[list[list[tuple[tuple[int, ...], tuple[int, int]]]], list[int], str]] = {
    # one rank, whole model (the benchmark's 1-rank row)
    "single": ([[((0,), (0, 8))]], [4], "1f1b"),
    # 1F1B over 2 and 4 stages
    "1f1b-2": ([[((0,), (0, 4)), ((1,), (4, 8))]], [4], "1f1b"),
    "1f1b-4": ([[((0,), (0, 2)), ((1,), (2, 4)), ((2,), (4, 6)), ((3,), (6, 8))]], [6], "1f1b"),
    # two pipelines of different shapes and micro-batch counts: two TP-1 stages | one TP-2 stage
    "two-pipes": ([[((0,), (0, 5)), ((1,), (5, 8))], [((2, 3), (0, 8))]], [3, 1], "1f1b"),
    # TP 1 → TP 2 → TP 1 inside one pipeline (fan-out and fan-in at the boundaries)
    "mixed-tp": ([[((0,), (0, 3)), ((1, 2), (3, 6)), ((3,), (6, 8))]], [4], "1f1b"),
    # DHelix W-shape, two strands: 2 physical TP-1 stages, and 2 physical TP-2 stages
    "wshape-2": ([[((0,), (0, 4)), ((1,), (4, 8))]], [6], "wshape"),
    "wshape-tp2": ([[((0, 1), (0, 4)), ((2, 3), (4, 8))]], [4], "wshape"),
    # two one-rank pipelines with 3 and 1 micro-batches (batch shares 3/4 and 1/4)
    "dp-2": ([[((0,), (0, 8))], [((1,), (0, 8))]], [3, 1], "1f1b"),
}


def cluster(n: int = 8) -> Cluster:
    return Cluster.from_dict({"name": "cpu-test", "inter_GBps": 12.5,
                              "nodes": [{"name": "n0", "gpu": "A100-SXM4-80GB", "count": n, "intra_GBps": 300}]})


def build_program(name: str, *, sequence_parallel: bool = False, micro_batch: int = 1) -> Program:
    from hexhelix.ir.model import TrainingConfig
    from hexhelix.solver.compile import compile_plan

    stages, mbs, schedule = CASES[name]
    training = TrainingConfig(global_batch=sum(mbs) * micro_batch, micro_batch=micro_batch, seq_len=SEQ_LEN,
                              dtype="fp32", sequence_parallel=sequence_parallel)
    problem = PlanProblem(cluster=cluster(), model=PRESETS["tiny"], training=training, schedule=schedule)
    pipes = tuple(PipelinePlan(stages=tuple(StagePlan(node=0, gpus=g, layers=lay) for g, lay in pipe),
                               micro_batches=m) for pipe, m in zip(stages, mbs))
    return compile_plan(Plan(problem=problem, pipelines=pipes))


def write_program(name: str, directory: Path, **kw: object) -> Path:
    path = Path(directory) / f"{name}.json"
    path.write_text(build_program(name, **kw).to_json())  # type: ignore[arg-type]
    return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nprocs: int, args: list[str], *, timeout: float = 90.0) -> list[tuple[int, str, str]]:
    """Start ``nprocs`` ranks of ``python -m hexhelix.runtime ARGS`` with torchrun's environment
    contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) on a free port; returns per rank
    (exit status, stdout, stderr). Ranks still running after ``timeout`` seconds are killed and
    report status None."""
    import os
    import subprocess
    import sys
    import time

    port = free_port()
    procs = []
    for r in range(nprocs):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, "-m", "hexhelix.runtime", *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            out.append((p.returncode, o, e))
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            out.append((None, o, e))  # type: ignore[arg-type]
    return out
