"""Per-pipeline compute orders: GPipe, 1F1B and DHelix's W-shaped (folded, two-strand) schedule.

A schedule says, for one pipeline with ``P`` physical stages and ``m`` micro-batches, which compute
operations each physical stage runs and in which order. It knows nothing about ranks, TP or
communication; :mod:`hexhelix.ir.lower` turns the orders into per-rank programs. Every pipeline of
a plan gets its own order from its own ``P`` and ``m``.

Orders are lists of :class:`Tick`: one compute op, or two co-executed ops of different strands
(W-shape steady state). Virtual stages are addressed by their *position* in the pipeline's data
flow (0 = the embedding stage, last = the head stage):

* ``gpipe`` / ``1f1b``: one virtual stage per physical stage, position = physical index.
* ``wshape``: physical stage k holds the down-leg chunk (position k) and the up-leg chunk
  (position 2P−1−k) — DHelix model folding (shared/reference/dhelix.md §3.1).

Requirements: m ≥ 1 and P ≥ 1 for every schedule; ``wshape`` also needs at least two layers on
every physical stage (one per leg), checked by :func:`fold_layers`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidInputError, UnsupportedError
from .program import Op

__all__ = [
    "SCHEDULE_NAMES",
    "ComputeOp",
    "Tick",
    "fold_layers",
    "num_strands",
    "pipeline_order",
    "stage_positions",
    "wshape_strand",
]

SCHEDULE_NAMES = ("gpipe", "1f1b", "wshape")


@dataclass(frozen=True, slots=True, order=True)
class ComputeOp:
    """Forward (``Op.F``) or full backward (``Op.B``) of the virtual stage at data-flow position
    ``pos`` on micro-batch ``mb``, labelled with the micro-batch's strand."""

    op: Op
    pos: int
    mb: int
    strand: int = 0


@dataclass(frozen=True, slots=True)
class Tick:
    """One step of a stage's order: a single op, or two ops of different strands co-executed."""

    ops: tuple[ComputeOp, ...]


def num_strands(schedule: str) -> int:
    """1 for gpipe/1f1b, 2 for wshape (forward and backward strands interleave, DHelix §3.3)."""
    _check_name(schedule)
    return 2 if schedule == "wshape" else 1


def wshape_strand(mb: int, num_stages: int) -> int:
    """Strand of micro-batch ``mb`` under W-shape: ⌊mb/P⌋ mod 2, so F(t) and B(t−P) differ."""
    return (mb // num_stages) % 2


def _check_name(schedule: str) -> None:
    if schedule not in SCHEDULE_NAMES:
        raise InvalidInputError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULE_NAMES)}",
                                field="schedule")


def _check_sizes(num_stages: int, micro_batches: int) -> None:
    if num_stages < 1:
        raise UnsupportedError(f"a pipeline needs at least one stage, got {num_stages}")
    if micro_batches < 1:
        raise UnsupportedError(f"a pipeline needs at least one micro-batch, got {micro_batches}")


def fold_layers(layer_counts: list[int], num_layers: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Down- and up-leg layer ranges of each physical stage under W-shape folding.

    Stage k with n_k layers gets d_k = ⌈n_k/2⌉ down-leg and u_k = ⌊n_k/2⌋ up-leg layers:
    down_k = [D_k, D_k + d_k) and up_k = [L − U_k − u_k, L − U_k) with D_k, U_k the prefix sums.
    For equal stages (n_k = 2c) this is DHelix's U-shape: down_k = [kc, (k+1)c),
    up_k = [L−(k+1)c, L−kc) (shared/reference/dhelix.md §3.1).

    Raises
    ------
    UnsupportedError
        if a stage has fewer than two layers (a leg would be empty) or the counts miss layers.
    """
    if sum(layer_counts) != num_layers:
        raise InvalidInputError(f"stages hold {sum(layer_counts)} layers, the model has {num_layers}",
                                field="stages")
    out = []
    down, up = 0, 0
    for k, n in enumerate(layer_counts):
        if n < 2:
            raise UnsupportedError(
                f"wshape folds every stage into a down-leg and an up-leg chunk and needs at least 2 layers "
                f"per stage; stage {k} has {n}. Use 1f1b/gpipe or give every stage >= 2 layers")
        d, u = (n + 1) // 2, n // 2
        out.append(((down, down + d), (num_layers - up - u, num_layers - up)))
        down += d
        up += u
    return out


def stage_positions(schedule: str, num_stages: int) -> list[tuple[int, ...]]:
    """Per physical stage, the data-flow positions of the virtual stages it holds."""
    _check_name(schedule)
    if schedule == "wshape":
        return [(k, 2 * num_stages - 1 - k) for k in range(num_stages)]
    return [(k,) for k in range(num_stages)]


def _single(op: Op, pos: int, mb: int) -> Tick:
    return Tick((ComputeOp(op, pos, mb),))


def _gpipe(num_stages: int, m: int, k: int) -> list[Tick]:
    return [_single(Op.F, k, i) for i in range(m)] + [_single(Op.B, k, i) for i in range(m)]


def _one_f_one_b(num_stages: int, m: int, k: int) -> list[Tick]:
    """Warm-up min(P−k−1, m) forwards, then F/B alternation, then the remaining backwards."""
    warm = min(num_stages - k - 1, m)
    order = [_single(Op.F, k, i) for i in range(warm)]
    nb = 0
    for i in range(warm, m):
        order.append(_single(Op.F, k, i))
        order.append(_single(Op.B, k, nb))
        nb += 1
    order += [_single(Op.B, k, j) for j in range(nb, m)]
    return order


def _wshape(num_stages: int, m: int, k: int) -> list[Tick]:
    """DHelix tick order for physical stage k (shared/reference/dhelix.md §3.2–3.3).

    Over virtual micro-batches t = 0 … m+P−1: warm-up P−k−1 down-ticks, then alternate down-tick
    w+i and up-tick i, then the remaining up-ticks. Down-tick t = F(down_k, t) ∥ B(up_k, t−P);
    up-tick t = F(up_k, t) ∥ B(down_k, t−P). Halves whose micro-batch is outside [0, m) are dropped
    (warm-up and cool-down run single-strand); empty ticks disappear.
    """
    P = num_stages
    down, up = k, 2 * P - 1 - k
    total = m + P
    warm = P - k - 1
    seq: list[tuple[str, int]] = [("down", t) for t in range(min(warm, total))]
    for i in range(total - min(warm, total)):
        seq.append(("down", warm + i))
        seq.append(("up", i))
    seq += [("up", t) for t in range(total - min(warm, total), total)]
    order = []
    for direction, t in seq:
        fpos, bpos = (down, up) if direction == "down" else (up, down)
        ops = []
        if t < m:
            ops.append(ComputeOp(Op.F, fpos, t, wshape_strand(t, P)))
        if 0 <= t - P < m:
            ops.append(ComputeOp(Op.B, bpos, t - P, wshape_strand(t - P, P)))
        if ops:
            order.append(Tick(tuple(ops)))
    return order


def pipeline_order(schedule: str, num_stages: int, micro_batches: int) -> list[list[Tick]]:
    """The compute order of every physical stage of one pipeline.

    Parameters
    ----------
    schedule
        ``gpipe``, ``1f1b`` or ``wshape``.
    num_stages
        physical stages P of this pipeline (each pipeline of a plan uses its own).
    micro_batches
        micro-batches m of this pipeline (fewer than P is allowed).

    Returns
    -------
    list of ``P`` tick lists; every (position, micro-batch) gets exactly one F and one B on the
    physical stage holding that position.
    """
    _check_name(schedule)
    _check_sizes(num_stages, micro_batches)
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "wshape": _wshape}[schedule]
    return [build(num_stages, micro_batches, k) for k in range(num_stages)]
