"""Per-rank checkpoints: ``DIR/rank<r>.pt`` holds the rank's parameters (canonical names, local
shards), its AdamW state and the number of completed steps, tagged with a fingerprint of the
program so a checkpoint is never resumed under another layout.

Data is addressed by (seed, step, micro-batch) and the optimizer state is restored exactly, so a
run stopped after step k and resumed gives the same parameters as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.program import Program

__all__ = ["CHECKPOINT_SCHEMA", "checkpoint_path", "load_checkpoint", "program_fingerprint", "save_checkpoint"]

logger = logging.getLogger(__name__)

CHECKPOINT_SCHEMA = "hexhelix.checkpoint/1"


def program_fingerprint(program: Program) -> str:
    """SHA-256 of the program's canonical JSON without ``meta`` (which may carry timings)."""
    d = program.to_dict()
    d.pop("meta", None)
    import json

    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_path(directory: str | Path, rank: int) -> Path:
    """``DIR/rank<r>.pt``."""
    return Path(directory) / f"rank{rank}.pt"


def save_checkpoint(directory: str | Path, *, rank: int, program: Program, steps_done: int, seed: int,
                    params: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> Path:
    """Write this rank's state (atomically: a temporary file renamed into place)."""
    path = checkpoint_path(directory, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"schema": CHECKPOINT_SCHEMA, "fingerprint": program_fingerprint(program), "rank": rank,
             "world_size": program.world_size, "steps_done": steps_done, "seed": seed,
             "params": {n: p.detach().cpu().clone() for n, p in params.items()},
             "optimizer": optimizer.state_dict()}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)
    logger.info("rank %d: saved checkpoint after %d steps to %s", rank, steps_done, path)
    return path


def load_checkpoint(directory: str | Path, *, rank: int, program: Program, seed: int,
                    params: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> int:
    """Restore this rank's parameters and optimizer state in place; returns the steps done.

    Raises InvalidInputError (naming the file) when it is missing, unreadable, or was written by
    another program, rank or seed.
    """
    path = checkpoint_path(directory, rank)
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InvalidInputError("checkpoint file not found", source=str(path)) from None
    except Exception as err:
        raise InvalidInputError(f"cannot read checkpoint ({type(err).__name__})", source=str(path)) from None
    if not isinstance(state, dict) or state.get("schema") != CHECKPOINT_SCHEMA:
        raise InvalidInputError(f"not a {CHECKPOINT_SCHEMA} file", source=str(path))
    for key, want in (("fingerprint", program_fingerprint(program)), ("rank", rank), ("seed", seed)):
        if state.get(key) != want:
            raise InvalidInputError(f"{key} {state.get(key)!r} does not match this run ({want!r}); resume with "
                                    "the program, rank layout and --seed that wrote it", source=str(path))
    saved = state["params"]
    if set(saved) != set(params):
        raise InvalidInputError("parameter names differ from this rank's stage", source=str(path))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(saved[name].to(p.device))
    optimizer.load_state_dict(state["optimizer"])
    return int(state["steps_done"])
