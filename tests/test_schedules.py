"""Per-pipeline compute orders (ir/schedules.py): completeness, dependencies, W-shape folding."""

from __future__ import annotations

import itertools

import pytest
from hexhelix.ir.errors import InvalidInputError, UnsupportedError
from hexhelix.ir.program import Op
from hexhelix.ir.schedules import (
    fold_layers,
    num_strands,
    pipeline_order,
    stage_positions,
    wshape_strand,
)


def _ops(order):
    return [op for tick in order for op in tick.ops]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "wshape"])
@pytest.mark.parametrize("P,m", [(1, 1), (1, 5), (2, 1), (3, 2), (4, 4), (4, 9), (8, 3), (8, 16)])
def test_every_position_and_microbatch_once(schedule, P, m):
    orders = pipeline_order(schedule, P, m)
    assert len(orders) == P
    for k, order in enumerate(orders):
        ops = _ops(order)
        for pos in stage_positions(schedule, P)[k]:
            for i in range(m):
                assert sum(1 for o in ops if (o.op, o.pos, o.mb) == (Op.F, pos, i)) == 1
                assert sum(1 for o in ops if (o.op, o.pos, o.mb) == (Op.B, pos, i)) == 1
                assert ops.index(next(o for o in ops if (o.op, o.pos, o.mb) == (Op.F, pos, i))) < \
                    ops.index(next(o for o in ops if (o.op, o.pos, o.mb) == (Op.B, pos, i)))
        assert len(ops) == 2 * m * len(stage_positions(schedule, P)[k])


@pytest.mark.parametrize("P,m", [(1, 3), (3, 2), (4, 8), (6, 13)])
def test_one_f_one_b_bounds_inflight_microbatches(P, m):
    for k, order in enumerate(pipeline_order("1f1b", P, m)):
        live = peak = 0
        for tick in order:
            live += 1 if tick.ops[0].op is Op.F else -1
            peak = max(peak, live)
        assert peak == min(P - k, m)


def test_gpipe_runs_all_forwards_first():
    order = _ops(pipeline_order("gpipe", 3, 4)[1])
    assert [o.op for o in order] == [Op.F] * 4 + [Op.B] * 4


def test_wshape_matches_dhelix_tick_order_example():
    """shared/reference/dhelix.md §3.3, P = 4, m = 6: stage 3 alternates down/up ticks from the start;
    stage 0 warms up with three down-ticks."""
    P, m = 4, 6
    orders = pipeline_order("wshape", P, m)

    def label(tick):
        return "|".join(f"{o.op.value}{o.pos}.{o.mb}" for o in tick.ops)

    s3 = [label(t) for t in orders[3]]
    assert s3[:4] == ["F3.0", "F4.0", "F3.1", "F4.1"]          # down_3 = pos 3, up_3 = pos 4
    assert "F3.4|B4.0" in s3 and "F4.4|B3.0" in s3
    s0 = [label(t) for t in orders[0]]
    assert s0[:6] == ["F0.0", "F0.1", "F0.2", "F0.3", "F7.0", "F0.4|B7.0"]
    # strands of paired ops differ, strand = floor(t / P) mod 2
    for tick in itertools.chain.from_iterable(orders):
        if len(tick.ops) == 2:
            assert tick.ops[0].strand != tick.ops[1].strand
        for o in tick.ops:
            assert o.strand == wshape_strand(o.mb, P)


def test_wshape_pairs_only_in_steady_state():
    # m <= P: no tick is co-executed (dhelix.md §3.4 edge case m = P)
    assert all(len(t.ops) == 1 for order in pipeline_order("wshape", 4, 4) for t in order)
    assert any(len(t.ops) == 2 for order in pipeline_order("wshape", 4, 5) for t in order)


def test_fold_layers_equal_stages_is_dhelix_u_shape():
    # L = 32, P = 4: GPU0 {0-3, 28-31}, GPU1 {4-7, 24-27}, ... (dhelix.md §3.1)
    assert fold_layers([8, 8, 8, 8], 32) == [((0, 4), (28, 32)), ((4, 8), (24, 28)), ((8, 12), (20, 24)),
                                             ((12, 16), (16, 20))]


def test_fold_layers_unequal_stages_cover_every_layer_once():
    folded = fold_layers([3, 5, 2, 6], 16)
    layers = sorted(i for down, up in folded for lo, hi in (down, up) for i in range(lo, hi))
    assert layers == list(range(16))
    assert [(d[1] - d[0], u[1] - u[0]) for d, u in folded] == [(2, 1), (3, 2), (1, 1), (3, 3)]


def test_wshape_needs_two_layers_per_stage():
    with pytest.raises(UnsupportedError, match="at least 2 layers per stage; stage 1 has 1"):
        fold_layers([3, 1, 4], 8)


def test_bad_arguments():
    with pytest.raises(InvalidInputError, match="unknown schedule"):
        pipeline_order("zb", 2, 2)
    with pytest.raises(UnsupportedError, match="at least one micro-batch"):
        pipeline_order("1f1b", 2, 0)
    assert num_strands("wshape") == 2 and num_strands("1f1b") == 1
