"""Gantt chart (PNG, matplotlib with the Agg backend) of a simulated timeline, for small programs.

One row per rank: the compute stream as a full-height bar (F blue, B green, PAIR purple, OPT
grey, other compute orange), the intra- and inter-node link streams as thin bars under it.
Micro-batch numbers are written on compute bars when they fit.
"""

from __future__ import annotations

from pathlib import Path

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.program import Instr, Op

from .sim_result import SimResult

__all__ = ["MAX_GANTT_RANKS", "MAX_GANTT_SPANS", "write_gantt"]

MAX_GANTT_RANKS = 64
MAX_GANTT_SPANS = 20_000
_COLORS = {Op.F: "#4C72B0", Op.B: "#55A868", Op.BI: "#55A868", Op.BW: "#8FD19E", Op.PAIR: "#8172B2",
           Op.OPT: "#8C8C8C", Op.SEND: "#DD8452", Op.RECV: "#DD8452", Op.COLL: "#C44E52",
           Op.GRAD_SYNC: "#C44E52", Op.LOAD: "#CCB974"}


def write_gantt(result: SimResult, path: str | Path, *, title: str | None = None) -> Path:
    """Draw the timeline of ``result`` into ``path`` (PNG) and return it.

    Raises InvalidInputError when the program is too large to draw legibly
    (more than MAX_GANTT_RANKS ranks or MAX_GANTT_SPANS timed ops): use the Chrome trace then.
    """
    tl = result.timeline
    if tl is None:
        raise InvalidInputError("the simulation ran with record=False; rerun with record=True for a Gantt chart")
    W = len(tl.spans)
    n = sum(len(s) for s in tl.spans)
    if W > MAX_GANTT_RANKS or n > MAX_GANTT_SPANS:
        raise InvalidInputError(f"{W} ranks / {n} timed ops is too large for a Gantt chart (limits "
                                f"{MAX_GANTT_RANKS} ranks, {MAX_GANTT_SPANS} ops); use --trace and Perfetto",
                                field="--gantt")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    prog = tl.program
    scale, unit = (1e3, "ms") if result.makespan_s < 10 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(min(24.0, 6 + n / 40), 1.0 + 0.55 * W))
    for r, spans in enumerate(tl.spans):
        y = W - 1 - r
        for start, end, stream, i in spans:
            if end <= start:
                continue
            ins = prog.programs[r][i]
            x0, w = start * scale, (end - start) * scale
            if stream == 0:
                ax.broken_barh([(x0, w)], (y + 0.05, 0.6), facecolors=_COLORS.get(ins.op, "#DD8452"),
                               edgecolor="white", linewidth=0.4)
                label = _label(ins)
                if label and w > result.makespan_s * scale / 60:
                    ax.text(x0 + w / 2, y + 0.35, label, ha="center", va="center", fontsize=6, color="white")
            else:
                off = -0.12 if stream == 1 else -0.27
                ax.broken_barh([(x0, w)], (y + off + 0.05, 0.12), facecolors=_COLORS.get(ins.op, "#DD8452"),
                               alpha=0.8 if stream == 1 else 0.5)
    ax.set_yticks([W - 1 - r + 0.3 for r in range(W)])
    ax.set_yticklabels([f"rank {r}" for r in range(W)], fontsize=7)
    ax.set_xlim(0, result.makespan_s * scale * 1.01 or 1)
    ax.set_ylim(-0.4, W)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or f"{prog.schedule}: makespan {result.makespan_s * scale:.4g} {unit}, "
                          f"bubble {100 * result.bubble_fraction:.1f} %", fontsize=9)
    handles = [Patch(color=_COLORS[o], label=o.value) for o in (Op.F, Op.B, Op.PAIR, Op.OPT, Op.SEND, Op.GRAD_SYNC)]
    ax.legend(handles=handles, loc="upper right", fontsize=6, ncol=6, frameon=False, bbox_to_anchor=(1, 1.12))
    fig.tight_layout()
    p = Path(path)
    try:
        fig.savefig(p, dpi=120)
    except OSError as err:
        raise InvalidInputError(f"cannot write Gantt chart ({err.strerror})", source=str(p)) from None
    finally:
        plt.close(fig)
    return p


def _label(ins: Instr) -> str:
    if ins.op is Op.PAIR and ins.pair is not None:
        return f"{ins.pair[0].mb}|{ins.pair[1].mb}"
    return str(ins.mb) if ins.mb >= 0 else ""
