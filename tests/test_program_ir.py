"""Program IR (schema hexhelix.program/1): every instruction kind round-trips through its token,
malformed tokens are rejected, and a hand-built program survives JSON byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.program import (
    PROGRAM_SCHEMA,
    GroupInfo,
    Instr,
    Kind,
    Op,
    PipeInfo,
    Program,
    RankInfo,
    SliceEntry,
    StageInfo,
    format_grid,
    parse_instr,
)

# One instruction (and its token) per kind, some on strand 1; dur/bytes are estimates, not tokens.
EXAMPLES = [
    (Instr(op=Op.LOAD, stage=0, mb=3), "L0.3"),
    (Instr(op=Op.F, stage=2, mb=3, strand=1, dur=1.5e-3), "F2.3@1"),
    (Instr(op=Op.B, stage=2, mb=0), "B2.0"),
    (Instr(op=Op.BI, stage=1, mb=7), "BI1.7"),
    (Instr(op=Op.BW, stage=1, mb=7, strand=1), "BW1.7@1"),
    (Instr(op=Op.SEND, kind=Kind.ACT, stage=2, mb=3, peer=5, ch=12, bytes=4096), "SA2.3>5#12"),
    (Instr(op=Op.SEND, kind=Kind.GRAD, stage=2, mb=3, strand=1, peer=0, ch=1), "SG2.3@1>0#1"),
    (Instr(op=Op.RECV, kind=Kind.GRAD, stage=1, mb=3, peer=4, ch=7), "RG1.3<4#7"),
    (Instr(op=Op.RECV, kind=Kind.ACT, stage=3, mb=10, strand=1, peer=11, ch=130), "RA3.10@1<11#130"),
    (Instr(op=Op.COLL, coll="all_reduce", group="tp1", stage=2, mb=3), "C:all_reduce:tp1:2.3"),
    (Instr(op=Op.COLL, coll="all_gather", group="pp0-tp.2", stage=0, mb=1, strand=1), "C:all_gather:pp0-tp.2:0.1@1"),
    (Instr(op=Op.GRAD_SYNC, bucket="b3"), "GS:b3"),
    (Instr(op=Op.OPT), "OPT"),
    (Instr(op=Op.SYNC, sync=7), "SYNC:7"),
    (Instr(op=Op.PAIR, pair=(Instr(op=Op.F, stage=2, mb=3), Instr(op=Op.B, stage=5, mb=1, strand=1))),
     "(F2.3|B5.1@1)"),
    (Instr(op=Op.PAIR, pair=(Instr(op=Op.F, stage=0, mb=4, strand=1, dur=1.0),
                             Instr(op=Op.BW, stage=0, mb=0, dur=2.0))), "(F0.4@1|BW0.0)"),
]


def test_examples_cover_every_instruction_kind() -> None:
    assert {i.op for i, _ in EXAMPLES} == set(Op)


@pytest.mark.parametrize(("instr", "token"), EXAMPLES, ids=[t for _, t in EXAMPLES])
def test_token_round_trip(instr: Instr, token: str) -> None:
    assert str(instr) == token
    parsed = parse_instr(token)
    assert parsed == instr.stripped()
    assert str(parsed) == token
    assert parse_instr(f"  {token} ") == parsed  # surrounding blanks are tolerated


@pytest.mark.parametrize(("instr", "token"), EXAMPLES, ids=[t for _, t in EXAMPLES])
def test_instr_dict_round_trip_keeps_estimates(instr: Instr, token: str) -> None:
    assert Instr.from_dict(json.loads(json.dumps(instr.to_dict()))) == instr


@pytest.mark.parametrize("token", [
    "", "F", "F2", "F2.", "X2.3", "f2.3", "F2.3@", "F-1.3", "F2.3@1@2",
    "SA2.3>5", "SA2.3#5", "SX2.3>5#1", "SA2.3=5#1", "RG1.3<#7",
    "C:all_reduce:tp1", "C::tp1:2.3", "C:ALL_REDUCE:tp1:2.3",
    "GS:", "OPT1", "SYNC:", "SYNC:x",
    "(F2.3|)", "(|B1.1)", "(F2.3 B1.1)", "(F2.3|B1.1|F0.0)", "F2.3|B1.1",
])
def test_malformed_tokens_raise(token: str) -> None:
    with pytest.raises(InvalidInputError, match="not an instruction token"):
        parse_instr(token)


def small_program(strands: int = 2) -> Program:
    """Two ranks, one pipeline of two TP-1 stages, two micro-batches: built by hand."""
    model, train = PRESETS["tiny"], TrainingConfig(global_batch=2, micro_batch=1, seq_len=16)
    r0 = (Instr(op=Op.LOAD, stage=0, mb=0), Instr(op=Op.F, stage=0, mb=0, dur=1e-3),
          Instr(op=Op.SEND, kind=Kind.ACT, stage=0, mb=0, peer=1, ch=0, bytes=2048),
          Instr(op=Op.LOAD, stage=0, mb=1, strand=1), Instr(op=Op.F, stage=0, mb=1, strand=1, dur=1e-3),
          Instr(op=Op.SEND, kind=Kind.ACT, stage=0, mb=1, strand=1, peer=1, ch=1, bytes=2048),
          Instr(op=Op.RECV, kind=Kind.GRAD, stage=0, mb=0, peer=1, ch=2),
          Instr(op=Op.RECV, kind=Kind.GRAD, stage=0, mb=1, strand=1, peer=1, ch=3),
          Instr(op=Op.PAIR, pair=(Instr(op=Op.BI, stage=0, mb=0, dur=1e-3),
                                  Instr(op=Op.BI, stage=0, mb=1, strand=1, dur=1e-3))),
          Instr(op=Op.SYNC, sync=0), Instr(op=Op.BW, stage=0, mb=0), Instr(op=Op.BW, stage=0, mb=1, strand=1),
          Instr(op=Op.GRAD_SYNC, bucket="b0"), Instr(op=Op.OPT))
    r1 = (Instr(op=Op.RECV, kind=Kind.ACT, stage=1, mb=0, peer=0, ch=0),
          Instr(op=Op.LOAD, stage=1, mb=0), Instr(op=Op.F, stage=1, mb=0), Instr(op=Op.B, stage=1, mb=0),
          Instr(op=Op.SEND, kind=Kind.GRAD, stage=1, mb=0, peer=0, ch=2),
          Instr(op=Op.RECV, kind=Kind.ACT, stage=1, mb=1, strand=1, peer=0, ch=1),
          Instr(op=Op.LOAD, stage=1, mb=1, strand=1), Instr(op=Op.F, stage=1, mb=1, strand=1),
          Instr(op=Op.B, stage=1, mb=1, strand=1),
          Instr(op=Op.SEND, kind=Kind.GRAD, stage=1, mb=1, strand=1, peer=0, ch=3),
          Instr(op=Op.COLL, coll="all_reduce", group="world", stage=1, mb=1),
          Instr(op=Op.GRAD_SYNC, bucket="b0"), Instr(op=Op.OPT))
    return Program(
        world_size=2, strands=strands, schedule="1f1b", model=model, training=train,
        pipes=(PipeInfo(id=0, stages=(0, 1), micro_batches=2, batch_share=1.0),),
        stages=(StageInfo(id=0, pipe=0, phys=0, layers=(0, 4), ranks=(0,), tp_group="tp0", embed=True),
                StageInfo(id=1, pipe=0, phys=1, layers=(4, 8), ranks=(1,), tp_group="tp1", head=True)),
        groups=(GroupInfo(name="world", ranks=(0, 1)), GroupInfo(name="tp0", ranks=(0,)),
                GroupInfo(name="tp1", ranks=(1,))),
        grad_sync={"b0": (SliceEntry(param="layers.0.attn.wq.weight", dim=0, lo=0, hi=64, group="tp0"),)},
        ranks=(RankInfo(rank=0, node="n0", gpu="A100-SXM4-80GB", capacity_bytes=80 * 2**30, state_bytes=123),
               RankInfo(rank=1, node="n0", gpu="A100-SXM4-80GB", capacity_bytes=80 * 2**30, state_bytes=456)),
        programs=(r0, r1),
        meta={"compiler": "by hand"},
    )


def test_program_json_round_trip_is_equal_and_byte_identical(tmp_path: Path) -> None:
    prog = small_program()
    text = prog.to_json()
    assert json.loads(text)["schema"] == PROGRAM_SCHEMA
    path = tmp_path / "prog.json"
    path.write_text(text)
    again = Program.load(str(path))
    assert again == prog
    assert again.meta == prog.meta
    assert again.to_json() == text
    assert small_program().to_json() == text  # identical input → identical bytes


def test_program_tokens_and_grid() -> None:
    prog = small_program()
    assert prog.tokens(1)[:3] == ["RA1.0<0#0", "L1.0", "F1.0"]
    assert [parse_instr(t) for t in prog.tokens(0)] == [i.stripped() for i in prog.programs[0]]
    grid = format_grid(prog)
    assert grid.splitlines()[0].startswith("rank   0: L0.0")
    assert "(BI0.0|BI0.1@1)" in grid
    assert prog.group("tp1").ranks == (1,)
    with pytest.raises(KeyError):
        prog.group("nope")


def _with(d, path, value):
    """A deep copy of ``d`` with the value at ``path`` (keys and indices) replaced."""
    d = json.loads(json.dumps(d))
    cur = d
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return d


@pytest.mark.parametrize(("path", "value", "field"), [
    (("ranks", 1, "state_bytes"), float("nan"), "ranks[1].state_bytes"),
    (("ranks", 0, "node"), 3, "ranks[0].node"),
    (("programs", 1, 0, "stage"), "x", "programs[1][0].stage"),
    (("programs", 0, 0, "op"), "JUMP", "programs[0][0].op"),
    (("programs", 0, 0, "dur"), {}, "programs[0][0].dur"),
    (("programs", 0, 0, "stage"), True, "programs[0][0].stage"),
    (("stages", 0, "layers"), [0], "stages[0].layers"),
    (("stages", 0, "embed"), "yes", "stages[0].embed"),
    (("pipes", 0, "stages"), 7, "pipes[0].stages"),
    (("groups", 0, "ranks", 0), 0.5, "groups[0].ranks[0]"),
    (("programs", 0), {"op": "F"}, "programs[0]"),
    (("meta", "pair_oef"), {}, "meta.pair_oef"),
    (("strands",), 10**12, "strands"),
    (("strands",), 0, "strands"),
    (("meta", "runtime_reserve_bytes"), "x", "meta.runtime_reserve_bytes"),
])
def test_a_program_value_of_the_wrong_kind_is_named_by_its_place(path, value, field) -> None:
    d = small_program().to_dict()
    with pytest.raises(InvalidInputError) as err:
        Program.from_dict(_with(d, path, value), source="p.json")
    assert (err.value.source, err.value.field) == ("p.json", field)


def test_a_program_slice_of_the_wrong_kind_is_named_by_its_place() -> None:
    d = small_program().to_dict()
    bucket = next(iter(d["grad_sync"]))
    with pytest.raises(InvalidInputError) as err:
        Program.from_dict(_with(d, ("grad_sync", bucket, 0, "hi"), "x"), source="p.json")
    assert err.value.field == f"grad_sync.{bucket}[0].hi"


def test_program_rejects_bad_documents(tmp_path: Path) -> None:
    d = small_program().to_dict()
    with pytest.raises(InvalidInputError, match="recompile"):
        Program.from_dict({**d, "schema": "hexhelix.program/0"}, source="p.json")
    with pytest.raises(InvalidInputError) as err:
        Program.from_dict({k: v for k, v in d.items() if k != "groups"}, source="p.json")
    assert (err.value.source, err.value.field) == ("p.json", "groups")
    with pytest.raises(InvalidInputError, match="world size 3"):
        Program.from_dict({**d, "world_size": 3})
    with pytest.raises(InvalidInputError, match="file not found"):
        Program.load(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="invalid JSON"):
        Program.load(str(tmp_path / "bad.json"))
