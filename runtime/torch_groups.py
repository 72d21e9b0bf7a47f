"""Process-group setup for one rank: the :class:`RankContext` every executor function receives.

docs/program.md §3: every rank creates every header group, in header order, including groups it is
not a member of (``new_group`` is collective over the default group). With two strands, each TP
group also gets a strand-1 clone, created afterwards in header order, so the TP collectives of the
two co-executed strands never interleave on one communicator (shared/reference/schedule_ir.md §7.4,
§8.8). Groups of one rank are not created: their collectives are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from hexhelix.ir.program import Program

__all__ = ["RankContext", "create_groups", "pick_backend"]

logger = logging.getLogger(__name__)


def pick_backend() -> tuple[str, torch.device]:
    """gloo on CPU; NCCL (one GPU per local rank) where CUDA is present."""
    if torch.cuda.is_available():
        return "nccl", torch.device("cuda")
    return "gloo", torch.device("cpu")


@dataclass(slots=True, kw_only=True)
class RankContext:
    """Everything that is per-rank and fixed for a run: rank, program, device, groups.

    ``groups[name]`` is the group object (None when this rank is not a member or the group has one
    rank); ``strand_groups[(name, strand)]`` is the clone a strand uses for its TP collectives.
    """

    rank: int
    program: Program
    device: torch.device
    backend: str
    timeout: timedelta
    groups: dict[str, Any] = field(default_factory=dict)
    strand_groups: dict[tuple[str, int], Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.program.world_size

    def group_for(self, name: str, strand: int = 0) -> Any:
        """The communicator ``strand`` uses for group ``name``."""
        if strand and (name, strand) in self.strand_groups:
            return self.strand_groups[(name, strand)]
        return self.groups[name]


def create_groups(ctx: RankContext) -> None:
    """Create every header group (and the strand-1 TP clones) in one fixed order on every rank."""
    prog = ctx.program
    for g in prog.groups:
        ctx.groups[g.name] = _new_group(g.ranks, ctx)
    if prog.strands > 1:
        tp_names = [s.tp_group for s in prog.stages]
        for g in prog.groups:
            if g.name in tp_names:
                for strand in range(1, prog.strands):
                    ctx.strand_groups[(g.name, strand)] = _new_group(g.ranks, ctx)
    logger.debug("rank %d: created %d groups (+%d strand clones)", ctx.rank, len(ctx.groups),
                 len(ctx.strand_groups))


def _new_group(ranks: tuple[int, ...], ctx: RankContext) -> Any:
    if len(ranks) == 1:
        return None  # nothing to communicate; not a collective call, so every rank skips it alike
    group = dist.new_group(list(ranks), timeout=ctx.timeout, backend=ctx.backend)
    return group if ctx.rank in ranks else None
