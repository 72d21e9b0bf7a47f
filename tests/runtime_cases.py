"""Programs for the torch-runtime tests and benchmark: small plans of the ``tiny`` model on a
synthetic one-node cluster, compiled with :func:`hexhelix.solver.compile.compile_plan`.

Each case is ``name -> (stages per pipeline as [(gpus, (lo, hi)), ...], micro-batches per
pipeline)``; the global batch is the sum of the micro-batches (micro-batch size 1).
"""

from __future__ import annotations

import json
import sys
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


def launch(nprocs: int, args: list[str], *, timeout: float = 90.0) -> list[tuple[int | None, str, str]]:
    """Run ``nprocs`` ranks of ``python -m hexhelix.runtime ARGS`` under torchrun's environment
    contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; a free port) and return per rank
    (exit status, stdout, stderr). Status None: the rank was still running after ``timeout`` s.

    One launcher process imports torch once and forks the ranks (before any torch computation or
    thread exists in it), which saves a torch import per rank — seconds each on a busy machine.
    """
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--fork-ranks", str(nprocs), str(port), tmp, *args]
        env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, text=True)
        try:
            codes = json.loads(proc.communicate(timeout=timeout)[0] or "null")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            codes = None
        out = []
        for r in range(nprocs):
            o = Path(tmp, f"{r}.out").read_text() if Path(tmp, f"{r}.out").exists() else ""
            e = Path(tmp, f"{r}.err").read_text() if Path(tmp, f"{r}.err").exists() else ""
            out.append((codes[r] if codes else None, o, e))
        return out


def _fork_ranks(nprocs: int, port: int, tmp: str, args: list[str]) -> None:
    import os

    from hexhelix.runtime.__main__ import main  # imports torch once, before forking

    pids = {}
    for r in range(nprocs):
        pid = os.fork()
        if pid == 0:
            for fd, name in ((1, f"{r}.out"), (2, f"{r}.err")):
                f = os.open(os.path.join(tmp, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(f, fd)
            os.environ.update(RANK=str(r), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(r),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            code = 1
            try:
                code = main(args)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[pid] = r
    codes = [None] * nprocs
    for _ in range(nprocs):
        pid, status = os.wait()
        codes[pids[pid]] = os.waitstatus_to_exitcode(status)
    print(json.dumps(codes))


if __name__ == "__main__" and len(sys.argv) > 4 and sys.argv[1] == "--fork-ranks":
    _fork_ranks(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])
