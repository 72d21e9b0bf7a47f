"""Validator and dry run (ir/validate.py, ir/dryrun.py): every mutation of a valid program is
rejected with the finding that names it, and deadlocks come back as wait-for cycles."""

from __future__ import annotations

from dataclasses import replace

import pytest
from compile_cases import make_plan
from hexhelix.ir.dryrun import check_deadlock, dry_run
from hexhelix.ir.errors import ScheduleError
from hexhelix.ir.program import Kind, Op, Program
from hexhelix.ir.validate import format_finding, validate
from hexhelix.solver.compile import compile_plan


def _with_rank(prog: Program, rank: int, instrs: list) -> Program:
    progs = list(prog.programs)
    progs[rank] = tuple(instrs)
    return replace(prog, programs=tuple(progs))


def _first(prog: Program) -> str:
    findings = validate(prog)
    assert findings, "mutation was not rejected"
    return format_finding(findings[0])


def _index(prog: Program, rank: int, pred) -> int:
    return next(i for i, ins in enumerate(prog.programs[rank]) if pred(ins))


@pytest.fixture(scope="module")
def p1f1b() -> Program:
    return compile_plan(make_plan([(3, 4, (1, 2)), (1, 2, (2,))], "1f1b"))


@pytest.fixture(scope="module")
def pw() -> Program:
    return compile_plan(make_plan([(2, 5, (1,))], "wshape"))


def test_compiled_programs_are_valid(p1f1b, pw):
    for prog in (p1f1b, pw):
        assert validate(prog, stop_early=False) == []
        assert dry_run(prog).finished


def test_drop_a_recv(p1f1b):
    r = p1f1b.stages[1].ranks[0]
    i = _index(p1f1b, r, lambda x: x.op is Op.RECV and x.kind is Kind.ACT and x.mb == 2)
    instrs = list(p1f1b.programs[r])
    del instrs[i]
    f = next(k for k, x in enumerate(instrs) if x.op is Op.F and x.mb == 2)  # its consumer, now unfed
    assert f > i  # the RECV was pre-posted, not necessarily adjacent to its consumer
    msg = _first(_with_rank(p1f1b, r, instrs))
    assert msg.startswith(f"[order] rank {r}, position {f} (F1.2)")
    assert "runs before its activation RECV (RA1.2)" in msg


@pytest.mark.parametrize("case", [([(3, 4, (1, 2)), (1, 2, (2,))], "1f1b"), ([(4, 6, (1,))], "gpipe"),
                                  ([(2, 5, (1,))], "wshape"), ([(3, 3, (1, 2, 1))], "wshape")])
@pytest.mark.parametrize("ahead", [0, 1, 2, 5])
def test_preposted_receives_validate_and_dry_run(case, ahead):
    """Any pre-posting depth gives a valid program that dry-runs to completion (RECV posts, its
    consumer waits), with the same instructions and the same RECV order as ``recv_ahead=0``."""
    plan = make_plan(*case)
    base = compile_plan(plan, recv_ahead=0)
    prog = compile_plan(plan, recv_ahead=ahead)
    assert validate(prog, stop_early=False) == []
    assert dry_run(prog).finished
    for a, b in zip(base.programs, prog.programs):
        assert sorted(map(str, a)) == sorted(map(str, b))
        assert [str(x) for x in a if x.op is Op.RECV] == [str(x) for x in b if x.op is Op.RECV]
        assert [str(x) for x in a if x.op is not Op.RECV] == [str(x) for x in b if x.op is not Op.RECV]


def test_recv_moved_after_its_consumer_is_rejected(p1f1b):
    """Pre-posting may move a RECV earlier, never past its consumer: the order check names the
    consumer that now runs before its data."""
    r = p1f1b.stages[1].ranks[0]
    instrs = list(p1f1b.programs[r])
    i = _index(p1f1b, r, lambda x: x.op is Op.RECV and x.kind is Kind.GRAD and x.mb == 1)
    b = next(k for k, x in enumerate(instrs) if x.op is Op.B and x.mb == 1)
    recv = instrs.pop(i)
    instrs.insert(b, recv)  # now right after B1.1
    msg = _first(_with_rank(p1f1b, r, instrs))
    assert msg.startswith(f"[order] rank {r}, position {b - 1} (B1.1)")
    assert "runs before its gradient RECV (RG1.1)" in msg


def test_swap_two_ops_across_a_dependency(p1f1b):
    r = p1f1b.stages[0].ranks[0]
    i = _index(p1f1b, r, lambda x: x.op is Op.F and x.mb == 1)
    instrs = list(p1f1b.programs[r])
    assert instrs[i + 1].op is Op.SEND
    instrs[i], instrs[i + 1] = instrs[i + 1], instrs[i]
    msg = _first(_with_rank(p1f1b, r, instrs))
    assert f"rank {r}, position {i} (SA0.1>" in msg and "sends before the op that produces it (F0.1)" in msg


def test_change_a_peer(p1f1b):
    s1 = p1f1b.stages[1]
    r = s1.ranks[1]  # TP rank 1 of a TP-2 stage receives from the TP-1 stage's only rank
    i = _index(p1f1b, r, lambda x: x.op is Op.RECV and x.kind is Kind.ACT)
    instrs = list(p1f1b.programs[r])
    instrs[i] = replace(instrs[i], peer=s1.ranks[0])
    msg = _first(_with_rank(p1f1b, r, instrs))
    assert msg.startswith(f"[edges] rank {r}, position {i}")
    assert f"waits for rank {s1.ranks[0]}" in msg and f"sends it from rank {p1f1b.stages[0].ranks[0]}" in msg


def test_change_a_channel(p1f1b):
    r = p1f1b.stages[0].ranks[0]
    i = _index(p1f1b, r, lambda x: x.op is Op.SEND)
    instrs = list(p1f1b.programs[r])
    instrs[i] = replace(instrs[i], ch=instrs[i].ch + 7)
    msg = _first(_with_rank(p1f1b, r, instrs))
    assert msg.startswith(f"[edges] rank {r}, position {i}") and "the edge's channel is" in msg


def test_fifo_order_swap_is_rejected(p1f1b):
    """Two activations sent in the other order: locally fine, but the k-th message on the channel
    is not what the receiver expects."""
    r = p1f1b.stages[0].ranks[0]
    instrs = list(p1f1b.programs[r])
    a = _index(p1f1b, r, lambda x: x.op is Op.SEND and x.mb == 1)
    b = _index(p1f1b, r, lambda x: x.op is Op.SEND and x.mb == 2 and x.peer == instrs[a].peer)
    sa, sb = instrs[a], instrs[b]
    instrs[a], instrs[b] = replace(sa, mb=sb.mb), replace(sb, mb=sa.mb)
    # keep order check happy: message mb labels swapped, sends stay after their F
    findings = validate(_with_rank(p1f1b, r, instrs), stop_early=False)
    assert any(f.check in ("order", "fifo") for f in findings)


def test_drop_a_sync(pw):
    r = 1
    i = _index(pw, r, lambda x: x.op is Op.SYNC and x.sync == 4)
    instrs = list(pw.programs[r])
    del instrs[i]
    msg = _first(_with_rank(pw, r, instrs))
    assert msg.startswith(f"[strands] rank {r}")
    assert "is not closed by a SYNC" in msg


def test_sync_id_gap(pw):
    r = 0
    i = _index(pw, r, lambda x: x.op is Op.SYNC and x.sync == 3)
    instrs = list(pw.programs[r])
    instrs[i] = replace(instrs[i], sync=4)
    assert "expected SYNC:3 (SYNC:3 is missing)" in _first(_with_rank(pw, r, instrs))


def test_remove_a_slice(p1f1b):
    b, entries = next((b, es) for b, es in p1f1b.grad_sync.items() if len(es) > 3)
    gone = entries[2]
    gs = dict(p1f1b.grad_sync)
    gs[b] = entries[:2] + entries[3:]
    msg = _first(replace(p1f1b, grad_sync=gs))
    assert msg.startswith("[slices]") and gone.param in msg and "not covered exactly once" in msg


def test_weights_must_sum_to_one(p1f1b):
    b, entries = next((b, es) for b, es in p1f1b.grad_sync.items() if len(es[0].weights) > 1)
    gs = dict(p1f1b.grad_sync)
    gs[b] = (replace(entries[0], weights=tuple(w * 2 for w in entries[0].weights)), *entries[1:])
    assert "sum to 1" in _first(replace(p1f1b, grad_sync=gs))


def test_wrong_slice_group(p1f1b):
    b, entries = next((b, es) for b, es in p1f1b.grad_sync.items() if len(es[0].weights) == 2)
    other = next(g.name for g in p1f1b.groups if g.name.startswith("dp.") and g.name != entries[0].group)
    gs = dict(p1f1b.grad_sync)
    gs[b] = (replace(entries[0], group=other), *entries[1:])
    msg = format_finding(next(f for f in validate(replace(p1f1b, grad_sync=gs), stop_early=False)
                              if f.check == "slices"))
    assert "but the ranks holding these elements are" in msg


def test_tp_peers_must_agree(p1f1b):
    s1 = p1f1b.stages[1]
    r = s1.ranks[1]
    instrs = list(p1f1b.programs[r])
    i = _index(p1f1b, r, lambda x: x.op is Op.F and x.mb == 0)
    j = _index(p1f1b, r, lambda x: x.op is Op.F and x.mb == 1)
    # swap whole micro-batches 0 and 1 (with their recv) on one TP peer only
    instrs[i], instrs[j] = replace(instrs[i], mb=1), replace(instrs[j], mb=0)
    findings = validate(_with_rank(p1f1b, r, instrs), stop_early=False)
    assert any(f.check == "tp" and f.rank == r for f in findings)


def test_collective_order_mismatch_deadlocks(p1f1b):
    r = next(r for r, p in enumerate(p1f1b.programs) if sum(1 for i in p if i.op is Op.GRAD_SYNC) >= 2)
    instrs = list(p1f1b.programs[r])
    gs = [k for k, x in enumerate(instrs) if x.op is Op.GRAD_SYNC]
    instrs[gs[0]], instrs[gs[-1]] = instrs[gs[-1]], instrs[gs[0]]
    prog = _with_rank(p1f1b, r, instrs)
    rep = dry_run(prog)
    assert not rep.finished and r in rep.error.cycle
    assert "wait on each other in a cycle" in str(rep.error)


@pytest.mark.parametrize("ahead", [0, 1])
def test_dry_run_reports_a_deadlock_cycle(ahead):
    """GPipe on rank 1, 1F1B-without-warm-up on rank 0: each rank's order is locally valid and every
    channel's FIFO matches, but rank 0 waits for the gradient of micro-batch 0 while rank 1 waits
    for the activation of micro-batch 1 — a two-rank cycle. A RECV only posts; the op that
    consumes it is where a rank blocks (with ``ahead=0`` the RECV sits right before it)."""
    prog = compile_plan(make_plan([(2, 2, (1,))], "gpipe"), recv_ahead=ahead)
    p0 = [x for x in prog.programs[0] if str(x) != "RG0.0<1#1"]
    rg = next(x for x in prog.programs[0] if str(x) == "RG0.0<1#1")
    tok = [str(x) for x in p0]
    first_b, second_f = tok.index("B0.0"), tok.index("L0.1")
    reordered = [*p0[:second_f], rg, p0[first_b], *p0[second_f:first_b], *p0[first_b + 1:]]
    bad = _with_rank(prog, 0, reordered)
    assert validate(bad) == []
    with pytest.raises(ScheduleError) as err:
        check_deadlock(bad)
    assert sorted(err.value.cycle) == [0, 1]
    assert {op[2] for op in err.value.ops} == {"B0.0", "F1.1"}
    text = str(err.value)
    assert "rank 0 at position" in text and "(B0.0) waits for the grad of micro-batch 0 from rank 1" in text
    assert "rank 1 at position" in text and "(F1.1) waits for the act of micro-batch 1 from rank 0" in text
    assert ">>F1.1<<" in text and ">>B0.0<<" in text  # grid window marks the stuck ops
    if ahead:  # rank 1's RECV of micro-batch 1 was posted before F1.0: the message says where
        assert "(its RA1.1<0#0 was posted at position" in text


def test_dry_run_reports_missing_sender():
    prog = compile_plan(make_plan([(2, 2, (1,))], "1f1b"))
    p1 = [x for x in prog.programs[1] if not (x.op is Op.SEND and x.mb == 1)]  # last grad never sent
    rep = dry_run(_with_rank(prog, 1, p1))
    assert not rep.finished and rep.error.cycle == []
    assert "rank 0 at position" in str(rep.error) and "rank(s) [1] finished without providing it" in str(rep.error)


def test_schema_reference_errors(p1f1b):
    r = p1f1b.stages[0].ranks[0]
    instrs = list(p1f1b.programs[r])
    instrs[0] = replace(instrs[0], stage=len(p1f1b.stages) + 3)
    assert _first(_with_rank(p1f1b, r, instrs)).startswith(f"[schema] rank {r}, position 0")
    bad = list(p1f1b.programs[r])
    bad[-2] = replace(bad[-2], bucket="nope") if bad[-2].op is Op.GRAD_SYNC else bad[-2]
    if bad[-2].bucket == "nope":
        assert "bucket 'nope' is not in the slice plan" in _first(_with_rank(p1f1b, r, bad))


def test_pipes_must_split_the_steps_micro_batches(p1f1b):
    pipes = (replace(p1f1b.pipes[0], micro_batches=10**12), *p1f1b.pipes[1:])   # checked before any loop over them
    assert "micro-batches sum to" in _first(replace(p1f1b, pipes=pipes))


def test_a_stage_holds_a_range_of_the_models_layers(p1f1b):
    for layers in ((0, 10**12), (3, 3), (-1, 2)):
        stages = (replace(p1f1b.stages[0], layers=layers), *p1f1b.stages[1:])
        assert f"stage 0: layers [{layers[0]}, {layers[1]}) are not" in _first(replace(p1f1b, stages=stages))


def test_opt_must_be_last(p1f1b):
    instrs = list(p1f1b.programs[0])
    instrs.insert(0, instrs.pop())
    assert "OPT must be the last instruction" in _first(_with_rank(p1f1b, 0, instrs))


@pytest.fixture(scope="module")
def ppair() -> Program:
    return compile_plan(make_plan([(2, 5, (1,))], "wshape"), pairing={1: 0.2})


def test_drop_a_layer_part(ppair):
    r = 1
    i = _index(ppair, r, lambda x: x.op is Op.PAIR)
    instrs = list(ppair.programs[r])
    f, b = instrs[i].pair
    instrs[i] = f  # the backward layer part disappears
    msg = _first(_with_rank(ppair, r, instrs))
    assert (msg.startswith(f"[complete] rank {r}") and f"B{b.stage}.{b.mb}" not in msg) or "needs its backward" in msg


def test_layer_parts_out_of_order(ppair):
    r = 1
    pairs = [k for k, x in enumerate(ppair.programs[r]) if x.op is Op.PAIR]
    instrs = list(ppair.programs[r])
    a, b = pairs[0], pairs[1]
    instrs[a], instrs[b] = instrs[b], instrs[a]
    msg = _first(_with_rank(ppair, r, instrs))
    assert msg.startswith("[order]") and ("layer part out of order" in msg or "runs before" in msg)
