"""Gradient-sync slices across pipelines whose TP degrees differ (reference/schedule_ir.md §8.4).

Each parameter unit (a layer's TP-sharded weights, the embedding, the head) is held by every
pipeline, split among the GPUs of the stage that holds it: GPU i of a TP-t stage owns the fraction
[i/t, (i+1)/t). Cutting the unit at the union of all pipelines' shard boundaries gives pieces; each
piece is held by exactly one GPU per pipeline, and those GPUs all-reduce it together.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from .plan import Plan

__all__ = ["SlicePiece", "cut_unit", "slice_pieces", "unit_holders"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlicePiece:
    """Fraction [lo, hi) of parameter unit ``unit`` and the GPU of each pipeline holding it."""

    unit: str            # "layer.<i>", "embedding" or "head"
    lo: Fraction
    hi: Fraction
    gpus: tuple[int, ...]  # one per pipeline, in pipeline order


def unit_holders(plan: Plan) -> dict[str, list[tuple[int, ...]]]:
    """Per unit, per pipeline the GPUs (in TP-rank order) of the stage holding it. Under W-shape
    folding the head sits on stage 0 and each stage holds a down-leg and an up-leg layer range."""
    from .schedules import fold_layers

    folded = plan.problem.schedule == "wshape"
    nlayers = plan.problem.model.layers
    out: dict[str, list[tuple[int, ...]]] = {"embedding": [], **{f"layer.{i}": [] for i in range(nlayers)},
                                             "head": []}
    for pipe in plan.pipelines:
        at: list[tuple[int, ...] | None] = [None] * nlayers
        if folded:
            legs = fold_layers([s.num_layers for s in pipe.stages], nlayers)
            ranges = [(s.gpus, r) for s, (d, u) in zip(pipe.stages, legs) for r in (d, u)]
        else:
            ranges = [(s.gpus, s.layers) for s in pipe.stages]
        for gpus, (lo, hi) in ranges:  # the first stage holding a layer keeps it
            for layer in range(max(0, lo), min(hi, nlayers)):
                if at[layer] is None:
                    at[layer] = gpus
        out["embedding"].append(pipe.stages[0].gpus)
        out["head"].append(pipe.stages[0 if folded else -1].gpus)
        for layer, gpus in enumerate(at):
            if gpus is None:
                raise ValueError(f"no stage of a pipeline holds layer {layer}")
            out[f"layer.{layer}"].append(gpus)
    return out


def slice_pieces(plan: Plan) -> list[SlicePiece]:
    """All pieces of all parameter units, in unit order then fraction order.

    >>> # two pipelines, TP 2 and TP 1: each layer is cut in halves, each half all-reduced by 2 GPUs
    """
    pieces: list[SlicePiece] = []
    for unit, holders in unit_holders(plan).items():
        pieces += cut_unit(unit, holders)
    return pieces


def cut_unit(unit: str, holders: list[tuple[int, ...]]) -> list[SlicePiece]:
    """Cut ``unit`` at the union of the shard boundaries i/t of its holders (one TP group per
    pipeline, GPUs in TP-rank order); each piece lists the one GPU per pipeline that holds it."""
    return [SlicePiece(unit=unit, lo=lo, hi=hi, gpus=tuple(g[i] for g, i in zip(holders, ranks)))
            for lo, hi, ranks in _cut_pattern(tuple(len(g) for g in holders))]


@lru_cache(maxsize=4096)
def _cut_pattern(degrees: tuple[int, ...]) -> tuple[tuple[Fraction, Fraction, tuple[int, ...]], ...]:
    """The pieces of a unit whose holders have these TP degrees: (lo, hi, TP rank per holder). Only
    the degrees matter, and a planner's search meets the same few patterns for every layer of
    thousands of candidate plans (exact Fractions: computed once per pattern)."""
    cuts = sorted({Fraction(i, t) for t in degrees for i in range(t + 1)})
    return tuple((lo, hi, tuple(int(lo * t) for t in degrees)) for lo, hi in itertools.pairwise(cuts))
