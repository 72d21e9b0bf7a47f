"""Export to PyTorch pipelining's ``compute_comms`` CSV (torch.distributed.pipelining.schedules).

One row per rank, one action per cell, tokens ``<stage><TYPE><mb>``: ``0F1``, ``0B1``, ``0I1``,
``0W1``, ``0SEND_F1``, ``1RECV_F1``, ``1SEND_B1``, ``0RECV_B1`` (shared/reference/schedule_ir.md
§1.3). PyTorch infers peers from stage ± 1 and a stage → rank map, so only programs that fit its
model export: one pipeline, one strand, TP degree 1 on every stage (one stage per rank). LOAD,
GRAD_SYNC, SYNC and OPT have no torch counterpart and are left out. The format is private to
torch and has changed between releases; tests pin the behaviour on the installed torch (2.13).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .errors import UnsupportedError
from .program import Instr, Kind, Op, Program

__all__ = ["to_torch_csv", "torch_actions", "write_torch_csv"]

_COMPUTE = {Op.F: "F", Op.B: "B", Op.BI: "I", Op.BW: "W"}


def _token(ins: Instr) -> str | None:
    if ins.op in _COMPUTE:
        return f"{ins.stage}{_COMPUTE[ins.op]}{ins.mb}"
    if ins.op in (Op.SEND, Op.RECV):
        direction = "F" if ins.kind is Kind.ACT else "B"
        return f"{ins.stage}{ins.op.value}_{direction}{ins.mb}"
    return None


def torch_actions(program: Program) -> list[list[str]]:
    """Per rank, the torch action tokens of ``program``.

    Raises
    ------
    UnsupportedError
        for two strands, several pipelines or a stage with TP > 1 (torch's CSV cannot say them).
    """
    if program.strands != 1:
        raise UnsupportedError("the torch CSV export needs a single-strand program (gpipe or 1f1b), "
                               f"got {program.schedule} with {program.strands} strands")
    if len(program.pipes) != 1:
        raise UnsupportedError(f"the torch CSV export needs one pipeline, the plan has {len(program.pipes)}")
    wide = [s.id for s in program.stages if len(s.ranks) != 1]
    if wide:
        raise UnsupportedError(f"the torch CSV export needs one GPU per stage (TP 1); stage {wide[0]} has "
                               f"{len(program.stages[wide[0]].ranks)}")
    rows = []
    for prog in program.programs:
        rows.append([t for t in (_token(i) for i in prog) if t is not None])
    return rows


def to_torch_csv(program: Program) -> str:
    """The ``compute_comms`` CSV text (no header row)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in torch_actions(program):
        writer.writerow(row)
    return buf.getvalue()


def write_torch_csv(program: Program, path: str | Path) -> None:
    """Write :func:`to_torch_csv` to ``path``."""
    Path(path).write_text(to_torch_csv(program))
