"""Simulator ground truths on hand-built uniform programs (closed forms of design.md §6 and
shared/reference/dhelix.md §3.4–3.5) and its execution semantics on tiny hand-written programs."""

from __future__ import annotations

import itertools

import pytest
from hexhelix.ir.errors import InvalidInputError, ScheduleError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.program import GroupInfo, Instr, Kind, Op, PipeInfo, Program, RankInfo, StageInfo
from hexhelix.runtime.sim import SimOptions, simulate
from hexhelix.runtime.sim_synth import synthetic_program

F_, B_ = 1.0, 2.0


# ----------------------------------------------------------------------------- ground truths
@pytest.mark.parametrize(("P", "m"), [(1, 1), (2, 2), (2, 5), (4, 4), (4, 9), (8, 16)])
def test_1f1b_makespan_and_bubble(P: int, m: int) -> None:
    res = simulate(synthetic_program("1f1b", P, m, f=F_, b=B_, act_bytes=1000))
    assert res.makespan_s == pytest.approx((m + P - 1) * (F_ + B_), rel=1e-12)
    assert res.bubble_fraction == pytest.approx((P - 1) / (m + P - 1), rel=1e-12)
    # each rank computes m(f+b); stage k holds min(P-k, m) micro-batches at its peak
    assert [r.busy_s for r in res.ranks] == pytest.approx([m * (F_ + B_)] * P)
    assert [r.peak_activation_bytes for r in res.ranks] == [1000 * min(P - k, m) for k in range(P)]


@pytest.mark.parametrize(("P", "m"), [(2, 2), (4, 8), (3, 7)])
def test_gpipe_makespan_and_all_in_flight(P: int, m: int) -> None:
    res = simulate(synthetic_program("gpipe", P, m, f=F_, b=B_, act_bytes=1000, state_bytes=5))
    assert res.makespan_s == pytest.approx((m + P - 1) * (F_ + B_), rel=1e-12)
    assert [r.peak_activation_bytes for r in res.ranks] == [1000 * m] * P
    assert res.peak_memory_bytes == [1000 * m + 5] * P


@pytest.mark.parametrize(("P", "m"), [(1, 3), (2, 3), (4, 5), (4, 12), (3, 10)])
@pytest.mark.parametrize("g", [0.0, 0.15, 0.3])
def test_wshape_makespan(P: int, m: int, g: float) -> None:
    """(f+b)(P + (m−1)(1−g)) for m > P (dhelix.md §3.4); at g = 0 exactly 1F1B's makespan."""
    res = simulate(synthetic_program("wshape", P, m, f=F_, b=B_, g=g, act_bytes=1000))
    assert res.makespan_s == pytest.approx((F_ + B_) * (P + (m - 1) * (1 - g)), rel=1e-12)
    busy = (F_ + B_) * (P + (m - P) * (1 - g))
    assert [r.busy_s for r in res.ranks] == pytest.approx([busy] * P)
    if g == 0.0:
        one = simulate(synthetic_program("1f1b", P, m, f=F_, b=B_))
        assert res.makespan_s == pytest.approx(one.makespan_s, rel=1e-12)
        assert res.bubble_fraction == pytest.approx((P - 1) / (m + P - 1), rel=1e-12)


@pytest.mark.parametrize(("P", "m"), [(2, 3), (4, 8), (5, 11)])
def test_wshape_activation_peak_equal_across_stages(P: int, m: int) -> None:
    """Folding balances memory: every stage peaks at P micro-batches of L/P layers (dhelix.md §3.5),
    which is 1F1B's stage-0 peak."""
    res = simulate(synthetic_program("wshape", P, m, f=F_, b=B_, g=0.2, act_bytes=1000))
    assert [r.peak_activation_bytes for r in res.ranks] == [1000 * P] * P


def test_comm_free_vs_costly_and_exposed() -> None:
    """Two stages, one micro-batch, transfer c: nothing overlaps, so 2f + 2b + 2c and every
    transfer is exposed on both ranks."""
    c = 0.25
    res = simulate(synthetic_program("1f1b", 2, 1, f=F_, b=B_, comm=c))
    assert res.makespan_s == pytest.approx(2 * F_ + 2 * B_ + 2 * c)
    assert [r.exposed_comm_s for r in res.ranks] == pytest.approx([2 * c, 2 * c])
    assert res.hidden_comm_s == pytest.approx(0.0)
    free = simulate(synthetic_program("1f1b", 2, 1, f=F_, b=B_, comm=c), SimOptions(comm_scale=0.0))
    assert free.makespan_s == pytest.approx(2 * F_ + 2 * B_)


def test_comm_hidden_under_compute_in_steady_state() -> None:
    """With many micro-batches, the sender's compute runs while its sends travel: some comm hidden."""
    res = simulate(synthetic_program("1f1b", 4, 16, f=F_, b=B_, comm=0.1))
    assert res.hidden_comm_s > 0
    assert res.makespan_s >= (16 + 3) * (F_ + B_)


def test_grad_sync_waits_for_every_member_and_opt_last() -> None:
    prog = synthetic_program("1f1b", 2, 4, f=F_, b=B_, pipes=2, grad_sync=0.5, opt=0.1)
    res = simulate(prog)
    assert res.makespan_s == pytest.approx((4 + 1) * (F_ + B_) + 0.5 + 0.1)
    spans = res.timeline.spans
    # the bucket of stage 0 (ranks 0 and 2) starts at the same time on both members
    gs = {r: next(s for s in spans[r] if prog.programs[r][s[3]].op is Op.GRAD_SYNC) for r in (0, 2)}
    assert gs[0][:2] == gs[2][:2]


# ----------------------------------------------------------------------------- semantics
def _prog(programs: list[list[Instr]], *, strands: int = 1, nodes: list[str] | None = None) -> Program:
    W = len(programs)
    nodes = nodes or ["n0"] * W
    return Program(world_size=W, strands=strands, schedule="1f1b", model=PRESETS["tiny"],
                   training=TrainingConfig(global_batch=4, seq_len=128),
                   pipes=(PipeInfo(id=0, stages=tuple(range(W)), micro_batches=1, batch_share=1.0),),
                   stages=tuple(StageInfo(id=r, pipe=0, phys=r, layers=(r, r + 1), ranks=(r,), tp_group=f"tp{r}")
                                for r in range(W)),
                   groups=(GroupInfo(name="all", ranks=tuple(range(W))),), grad_sync={},
                   ranks=tuple(RankInfo(rank=r, node=nodes[r], gpu="x", capacity_bytes=100, state_bytes=10)
                               for r in range(W)),
                   programs=tuple(tuple(p) for p in programs), meta={"runtime_reserve_bytes": 0})


def _send(kind: Kind, stage: int, peer: int, ch: int, dur: float = 0.0, mb: int = 0, nbytes: int = 0) -> Instr:
    return Instr(op=Op.SEND, kind=kind, stage=stage, mb=mb, peer=peer, ch=ch, dur=dur, bytes=nbytes)


def _recv(kind: Kind, stage: int, peer: int, ch: int, mb: int = 0, nbytes: int = 0) -> Instr:
    return Instr(op=Op.RECV, kind=kind, stage=stage, mb=mb, peer=peer, ch=ch, bytes=nbytes)


def test_deadlock_reports_the_wait_for_cycle() -> None:
    """Each rank receives before it computes what the other needs: a two-rank cycle, no hang."""
    p = _prog([
        [_recv(Kind.ACT, 0, 1, 1), Instr(op=Op.F, stage=0, mb=0, dur=1), _send(Kind.ACT, 0, 1, 0)],
        [_recv(Kind.ACT, 1, 0, 0), Instr(op=Op.F, stage=1, mb=0, dur=1), _send(Kind.ACT, 1, 0, 1)],
    ])
    with pytest.raises(ScheduleError, match="wait-for cycle of 2") as err:
        simulate(p)
    assert {r for r, _, _ in err.value.cycle} == {0, 1}
    assert all(tok.startswith("F") for _, _, tok in err.value.cycle)


def test_deadlock_on_a_collective_names_the_late_member() -> None:
    coll = Instr(op=Op.COLL, coll="all_reduce", group="all", stage=0, mb=0, dur=1)
    p = _prog([
        [coll, _send(Kind.ACT, 0, 1, 0)],
        [_recv(Kind.ACT, 1, 0, 0), Instr(op=Op.F, stage=1, mb=0, dur=1), coll],
    ])
    with pytest.raises(ScheduleError, match="deadlock") as err:
        simulate(p)
    assert {r for r, _, _ in err.value.cycle} == {0, 1}


def test_unmatched_send_is_reported_statically() -> None:
    p = _prog([[Instr(op=Op.F, stage=0, mb=0, dur=1), _send(Kind.ACT, 0, 1, 0)], [Instr(op=Op.OPT)]])
    with pytest.raises(ScheduleError, match="no matching RECV on rank 1"):
        simulate(p)


def test_recv_without_consumer_is_reported() -> None:
    p = _prog([[Instr(op=Op.F, stage=0, mb=0, dur=1), _send(Kind.ACT, 0, 1, 0)],
               [_recv(Kind.ACT, 1, 0, 0), Instr(op=Op.F, stage=7, mb=0, dur=1)]])
    with pytest.raises(ScheduleError, match="no later F/B"):
        simulate(p)


def test_rendezvous_vs_eager_and_receive_buffer_liveness() -> None:
    """The receiver posts late (after a long F): rendezvous starts the transfer then; eager sent
    it long before. The receive buffer counts from post (rendezvous) to its consumer's start."""
    p = _prog([
        [Instr(op=Op.F, stage=0, mb=0, dur=1), _send(Kind.ACT, 0, 1, 0, dur=0.5, nbytes=40)],
        [Instr(op=Op.F, stage=1, mb=1, dur=3, bytes=7), _recv(Kind.ACT, 1, 0, 0, nbytes=40),
         Instr(op=Op.F, stage=1, mb=0, dur=1, bytes=5)],
    ])
    rv = simulate(p)
    assert rv.makespan_s == pytest.approx(3 + 0.5 + 1)
    assert rv.ranks[1].peak_activation_bytes == 7 + 40  # buffer live during the transfer
    ea = simulate(p, SimOptions(p2p="eager"))
    assert ea.makespan_s == pytest.approx(3 + 1)
    assert ea.ranks[1].peak_activation_bytes == 7 + 40  # arrived at 1.5, consumed at 3
    assert rv.ranks[1].peak_memory_bytes == 10 + 47


def test_sync_waits_for_both_strands() -> None:
    """Strand 0 computes 3 s, strand 1 computes 1 s (serialised on one compute stream); the ops
    after SYNC start only when both are through."""
    p = _prog([[Instr(op=Op.F, stage=0, mb=0, strand=0, dur=3), Instr(op=Op.F, stage=0, mb=1, strand=1, dur=1),
                Instr(op=Op.SYNC, sync=0), Instr(op=Op.B, stage=0, mb=1, strand=1, dur=2),
                Instr(op=Op.B, stage=0, mb=0, strand=0, dur=2), Instr(op=Op.SYNC, sync=1), Instr(op=Op.OPT)]],
              strands=2)
    res = simulate(p)
    spans = {str(p.programs[0][i]): (a, b) for a, b, _, i in res.timeline.spans[0]}
    assert spans["F0.0"] == (0, 3) and spans["F0.1@1"] == (3, 4)
    assert min(spans["B0.1@1"][0], spans["B0.0"][0]) == 4
    assert res.makespan_s == pytest.approx(8)


def test_pair_time_from_program_or_oef_override() -> None:
    a = Instr(op=Op.F, stage=0, mb=1, strand=0, dur=2.0)
    b = Instr(op=Op.B, stage=0, mb=0, strand=1, dur=4.0)
    p = _prog([[Instr(op=Op.F, stage=0, mb=0, strand=1, dur=1), Instr(op=Op.SYNC, sync=0),
                Instr(op=Op.PAIR, pair=(a, b), dur=5.0), Instr(op=Op.SYNC, sync=1),
                Instr(op=Op.B, stage=0, mb=1, strand=0, dur=1), Instr(op=Op.OPT)]], strands=2)
    assert simulate(p).makespan_s == pytest.approx(1 + 5 + 1)
    # T_ab = T_a + T_b − OEF·min(T_a, T_b) = 6 − 0.5·2
    assert simulate(p, SimOptions(pair_oef=0.5)).makespan_s == pytest.approx(1 + 5 + 1)
    assert simulate(p, SimOptions(pair_oef=1.0)).makespan_s == pytest.approx(1 + 4 + 1)


def test_link_classes_overlap_but_one_class_serialises() -> None:
    """Rank 0 sends to rank 1 (same node) and rank 2 (other node) at once: different streams run
    together; two sends on the inter-node stream queue behind each other."""
    def run(nodes: list[str]) -> float:
        p = _prog([
            [Instr(op=Op.F, stage=0, mb=0, dur=1), _send(Kind.ACT, 0, 1, 0, dur=2), _send(Kind.ACT, 0, 2, 1, dur=2)],
            [_recv(Kind.ACT, 1, 0, 0), Instr(op=Op.F, stage=1, mb=0, dur=1)],
            [_recv(Kind.ACT, 2, 0, 1), Instr(op=Op.F, stage=2, mb=0, dur=1)],
        ], nodes=nodes)
        return simulate(p).makespan_s

    assert run(["a", "a", "b"]) == pytest.approx(1 + 2 + 1)
    assert run(["a", "b", "c"]) == pytest.approx(1 + 2 + 2 + 1)


def test_memory_over_capacity_flagged() -> None:
    res = simulate(synthetic_program("gpipe", 2, 4, act_bytes=30, state_bytes=10, capacity_bytes=100))
    assert res.over_capacity_ranks == [0, 1]
    assert res.summary()["peak_memory_bytes"] == [130, 130]


def test_bad_options_are_rejected() -> None:
    with pytest.raises(InvalidInputError, match="p2p"):
        SimOptions(p2p="buffered")
    with pytest.raises(InvalidInputError, match="pair_oef"):
        SimOptions(pair_oef=3.0)
    with pytest.raises(InvalidInputError, match="recv_ahead"):
        SimOptions(recv_ahead=-1)


def test_recv_ahead_posts_earlier_without_changing_what_runs() -> None:
    """Pre-posting receives keeps every rank's compute order and per-channel order; with eager
    sends it changes nothing, under rendezvous it can only help."""
    from hexhelix.ir.lower import prepost_recvs
    from hexhelix.runtime.sim_prep import prepost_receives

    assert prepost_receives is prepost_recvs  # one implementation: the compiler's pass
    prog = synthetic_program("1f1b", 4, 8, f=F_, b=B_, comm=0.1)
    moved = prepost_receives(prog, 1)
    for a, b in zip(prog.programs, moved.programs):
        assert sorted(map(str, a)) == sorted(map(str, b))
        assert [str(i) for i in a if i.op is not Op.RECV] == [str(i) for i in b if i.op is not Op.RECV]
        assert [str(i) for i in a if i.op is Op.RECV] == [str(i) for i in b if i.op is Op.RECV]
    late = simulate(prog).makespan_s
    early = simulate(prog, SimOptions(recv_ahead=1)).makespan_s
    assert early <= late
    assert early == pytest.approx(simulate(prog, SimOptions(p2p="eager")).makespan_s)


@pytest.mark.parametrize(("P", "m"), [(2, 2), (3, 1), (3, 3), (4, 2), (5, 5), (8, 8)])
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (2.0, 1.0), (1.0, 1.0)])
def test_wshape_with_m_at_most_P(P: int, m: int, f: float, b: float) -> None:
    """m ≤ P: no tick co-executes (dhelix.md §3.4 edge case), yet the two folded chunks per stage
    fill the ramp like a 2-chunk interleaved 1F1B: the simulated makespan is P(f+b) + (m−1)·max(f, b),
    below 1F1B's (m+P−1)(f+b) for m ≥ 2 (the closed form (f+b)(P + (m−1)(1−g)) holds for m > P)."""
    prog = synthetic_program("wshape", P, m, f=f, b=b, g=0.3)
    assert not any(i.op is Op.PAIR for p in prog.programs for i in p)
    assert simulate(prog).makespan_s == pytest.approx(P * (f + b) + (m - 1) * max(f, b), rel=1e-12)


@pytest.mark.parametrize(("P", "p2p", "ahead", "period"), [
    (2, "rendezvous", 0, 2), (3, "rendezvous", 0, 4), (8, "rendezvous", 0, 4), (8, "eager", 0, 2),
    (3, "rendezvous", 1, 2), (8, "rendezvous", 1, 2)])
def test_1f1b_steady_state_period_with_communication(P: int, p2p: str, ahead: int, period: int) -> None:
    """Transfers of c seconds: under rendezvous with each RECV posted right before its consumer
    (as synthetic programs, and the compiler with ``recv_ahead=0``, emit them), a receiver waits
    for every transfer, and the 1F1B F↔B dependency cycle between neighbours makes the
    steady-state period f + b + 4c on interior stages (f + b + 2c with two stages); eager sends,
    or RECVs posted one compute op early (the compiler's default), leave f + b + 2c — the cost
    model's u = f + b + 2c."""
    c, m = 0.1, 24
    res = simulate(synthetic_program("1f1b", P, m, f=F_, b=B_, comm=c), SimOptions(p2p=p2p, recv_ahead=ahead))
    prog = res.timeline.program
    k = P // 2
    starts = sorted(s for s, _, st, i in res.timeline.spans[k] if prog.programs[k][i].op is Op.F)
    steady = [b - a for a, b in zip(starts[P:], starts[P + 1:])][: m - 2 * P]
    if p2p == "rendezvous" and ahead == 0:
        assert steady == pytest.approx([F_ + B_ + period * c] * len(steady))
    elif ahead:  # pre-posted: no interval of the steady state exceeds u = f + b + 2c
        assert max(steady) <= F_ + B_ + period * c + 1e-9
    else:
        assert sum(steady) / len(steady) <= F_ + B_ + period * c + 1e-9


def test_program_opening_with_a_barrier() -> None:
    """A strand barrier reached by both strands at time 0 releases at time 0 (no false deadlock)."""
    p = _prog([[Instr(op=Op.SYNC, sync=0), Instr(op=Op.F, stage=0, mb=0, strand=1, dur=2),
                Instr(op=Op.SYNC, sync=1), Instr(op=Op.B, stage=0, mb=0, strand=1, dur=1), Instr(op=Op.OPT)]],
              strands=2)
    assert simulate(p).makespan_s == pytest.approx(3.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("schedule", ["1f1b", "wshape"])
def test_stream_invariants_under_random_durations(seed: int, schedule: str) -> None:
    """Random per-op durations (seeded): streams never run two things at once, busy time never
    exceeds the makespan, and every op ends after it starts."""
    import random
    from dataclasses import replace

    rng = random.Random(seed)
    base = synthetic_program(schedule, 4, 7, pipes=2, comm=0.2, grad_sync=0.3, ranks_per_node=3)

    def jitter(i: Instr) -> Instr:
        if i.pair is not None:
            return replace(i, dur=rng.uniform(0.5, 2.0), pair=(jitter(i.pair[0]), jitter(i.pair[1])))
        return replace(i, dur=rng.uniform(0.0, 2.0)) if i.dur > 0 else i

    prog = replace(base, programs=tuple(tuple(jitter(i) for i in p) for p in base.programs))
    res = simulate(prog)
    for r, spans in enumerate(res.timeline.spans):
        assert res.ranks[r].busy_s <= res.makespan_s + 1e-9
        for stream in (0, 1, 2):
            iv = sorted((s, e) for s, e, st, _ in spans if st == stream)
            assert all(e >= s for s, e in iv)
            assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(iv)), (r, stream)
