"""Entry point: ``torchrun --nproc-per-node N -m hexhelix.runtime program.json [--steps K]
[--seed S] [--check-reference] [--save DIR] [--resume DIR] [--timeout SEC]``.

Bad input (a missing or corrupt program, a world size that differs from the launch, a checkpoint of
another run) fails at start with one line on stderr and exit status 2, before any process group
exists, so nothing waits on a rank that has already left. A failing instruction exits 1 with the
rank, step, program counter and the surrounding grid; a hang exits 3 through the watchdog.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from hexhelix.ir.errors import HexhelixError, InvalidInputError, UnsupportedError
from hexhelix.ir.program import Program

from .checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from .data import DATASETS
from .refcheck import Tolerance, compare_with_reference
from .torch_exec import Executor, RunOptions, check_rank_program
from .torch_groups import RankContext, create_groups, pick_backend
from .torch_model import OptimConfig
from .watchdog import Watchdog

logger = logging.getLogger("hexhelix.runtime")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hexhelix.runtime",
                                description="Replay a compiled hexhelix program with PyTorch (run under torchrun).")
    p.add_argument("program", help="program JSON written by the compiler (hexhelix.program/1)")
    p.add_argument("--steps", type=int, default=1, help="optimizer steps to run (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the data (default 0)")
    p.add_argument("--data", choices=DATASETS, default="text",
                   help="bundled byte-level text (default) or uniform synthetic tokens")
    p.add_argument("--lr", type=float, default=OptimConfig().lr, help=f"AdamW learning rate (default {OptimConfig().lr:g})")
    p.add_argument("--check-reference", action="store_true",
                   help="compare every step's loss and the final parameters with a single-process run")
    p.add_argument("--save", metavar="DIR", help="write every rank's model and optimizer state to DIR at the end")
    p.add_argument("--resume", metavar="DIR", help="start from the state in DIR (written by --save)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds one instruction may take before the watchdog reports a hang (default 300)")
    p.add_argument("--sequential", action="store_true",
                   help="run the two halves of a PAIR one after the other instead of co-executing them")
    p.add_argument("--fault", help=argparse.SUPPRESS)  # testing hook RANK:STEP:PC (that rank dies there)
    return p


def _setup_logging(rank: int, verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr, force=True,
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")


def _load(args: argparse.Namespace, world: int) -> Program:
    if args.steps < 1:
        raise InvalidInputError(f"must be >= 1, got {args.steps}", field="--steps")
    if not args.timeout > 0:
        raise InvalidInputError(f"must be positive, got {args.timeout}", field="--timeout")
    program = Program.load(args.program)
    if program.world_size != world:
        raise InvalidInputError(
            f"the program is compiled for {program.world_size} ranks but {world} were launched; run "
            f"torchrun --nproc-per-node {program.world_size} -m hexhelix.runtime {args.program}",
            source=args.program, field="world_size")
    return program


def _placement_warning(program: Program, rank: int, env: Mapping[str, str]) -> str | None:
    """A line when torchrun's per-machine layout differs from the program's nodes (one machine
    per cluster node, its ranks contiguous; docs/runtime.md "Running on a cluster")."""
    if "LOCAL_WORLD_SIZE" not in env or "LOCAL_RANK" not in env:
        return None
    node = program.ranks[rank].node
    same = [r for r in range(program.world_size) if program.ranks[r].node == node]
    lws, lr = int(env["LOCAL_WORLD_SIZE"]), int(env["LOCAL_RANK"])
    if lws == len(same) and lr == rank - same[0]:
        return None
    return (f"rank {rank} runs as local rank {lr} of {lws} on this machine, but the program puts it at "
            f"position {rank - same[0]} of the {len(same)} ranks of node {node!r}: GPU types and TP groups "
            "may not be where the plan put them (fine for a test on one machine)")


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one rank; returns the process exit status."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    _setup_logging(rank, bool(env.get("HEXHELIX_DEBUG")))
    try:
        program = _load(args, world)
        check_rank_program(program, rank)
        if args.resume and not checkpoint_path(args.resume, rank).is_file():
            raise InvalidInputError("checkpoint file not found", source=str(checkpoint_path(args.resume, rank)))
        fault = None
        if args.fault:
            fr, fs, fp = (int(x) for x in args.fault.split(":"))
            fault = (fr, fs, fp)
        opts = RunOptions(seed=args.seed, dataset=args.data, optim=OptimConfig(lr=args.lr),
                          co_execute=not args.sequential, fault=fault,
                          capture_grads=args.check_reference)
    except (InvalidInputError, UnsupportedError) as err:
        print(f"hexhelix.runtime: error: {err}", file=sys.stderr)
        return 2
    placement = _placement_warning(program, rank, env)
    if placement and env.get("LOCAL_RANK") == "0":
        logger.warning("%s", placement)
    if program.training.dtype != "fp32":
        logger.warning("the program asks for %s; the torch runtime computes in fp32", program.training.dtype)
    backend, device = pick_backend()
    if device.type == "cuda":
        device = torch.device("cuda", int(env.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the reference check needs it
        torch.backends.cudnn.allow_tf32 = False
    # gloo/NCCL give up a little after the watchdog, so a hang is reported with every rank's
    # position first; they remain the backstop for setup and for the final collectives
    timeout = timedelta(seconds=args.timeout + max(5.0, 0.5 * args.timeout))
    if "MASTER_ADDR" in env:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    else:  # a plain `python -m hexhelix.runtime` of a 1-rank program
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    store = dist.distributed_c10d._get_default_store() if "MASTER_ADDR" in env else None
    watchdog = Watchdog(rank, program, args.timeout, store=store).start()
    try:
        ctx = RankContext(rank=rank, program=program, device=device, backend=backend, timeout=timeout)
        create_groups(ctx)  # setup is bounded by the process-group timeout, not the watchdog
        ex = Executor(ctx, opts, watchdog)
        start = 0
        if args.resume:
            start = load_checkpoint(args.resume, rank=rank, program=program, seed=args.seed,
                                    params=ex.params, optimizer=ex.optimizer)
        local = []
        for step in range(start, start + args.steps):
            local.append(ex.run_step(step))
        ex.close()
        watchdog.enter(start + args.steps, len(ex.instrs), "<gather losses>")
        losses_t = torch.tensor(local, dtype=torch.float64, device=device)
        dist.all_reduce(losses_t)  # head TP-rank-0 ranks hold their micro-batch sums; others 0
        losses = (losses_t / program.training.num_micro_batches).tolist()
        if args.save:
            save_checkpoint(args.save, rank=rank, program=program, steps_done=start + args.steps,
                            seed=args.seed, params=ex.params, optimizer=ex.optimizer)
        if rank == 0:
            for i, loss in enumerate(losses):
                print(f"step {start + i}: loss {loss:.6f}", flush=True)
        status = 0
        if args.check_reference:
            watchdog.idle()  # rank 0 trains the reference meanwhile; the others wait for its verdict
            ok, report = compare_with_reference(ex, losses, start=start, tol=Tolerance())
            if rank == 0:
                print(report, flush=True)
            status = 0 if ok else 1
        watchdog.stop()
        dist.destroy_process_group()
        return status
    except (InvalidInputError, UnsupportedError) as err:
        print(f"hexhelix.runtime: rank {rank}: error: {err}", file=sys.stderr, flush=True)
        os._exit(2)  # peers see the closed connection and stop; no teardown handshake to hang in
    except HexhelixError as err:
        print(f"hexhelix.runtime: error: {err}", file=sys.stderr, flush=True)
        os._exit(1)
    except Exception as err:  # a peer's death surfaces as a gloo RuntimeError outside an instruction
        print(f"hexhelix.runtime: rank {rank}: error: {type(err).__name__}: {str(err).splitlines()[0]}",
              file=sys.stderr, flush=True)
        os._exit(1)


if __name__ == "__main__":  # pragma: no cover
    code = main()
    # Leave without interpreter teardown: destructors of gloo's C++ threads at exit occasionally
    # abort the process ("terminate called without an active exception") after a clean run,
    # turning a passed check into exit 1. Everything is flushed and the groups are destroyed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
