"""Program IR (schema ``hexhelix.program/1``): per-rank ordered instructions plus a self-contained
header (pipelines, stages, groups, gradient-sync slice plan, per-rank facts).

Vocabulary (token form in brackets; strand ``@s`` omitted when 0):

* LOAD  [``L2.3``]  fetch micro-batch 3's data for (virtual) stage 2 (first stage: tokens; last: targets)
* F / B / BI / BW [``F2.3@1``]  forward, full backward, input-grad backward, weight-grad backward
  (``F2.3@1[5]``: only layer 5 of the stage, from a per-layer PAIR expansion; docs/program.md §7)
* SEND / RECV [``SA2.3>5#12``, ``RG1.3<4#7``]  act|grad of stage 2 micro-batch 3 to/from rank 5 on
  channel 12 (the channel is the tag: unique per (src, dst, kind, stage pair, strand))
* COLL  [``C:all_reduce:tp1:2.3@0``]  a runtime-issued collective on a named group
* GRAD_SYNC [``GS:b3``]  all-reduce the slices of bucket b3 of the header's slice plan
* OPT   [``OPT``]  optimizer step (AdamW) on the rank's parameters, last
* SYNC  [``SYNC:7``]  strand barrier number 7 (both strands of the rank must reach it)
* PAIR  [``(F2.3@0|B5.1@1)``]  co-execute one op of each strand, then barrier

A stage id is a *virtual* stage: a contiguous layer range placed on one TP group; W-shaped
folding puts two virtual stages (down leg, up leg) on the same ranks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from .checks import finite_number
from .errors import InvalidInputError
from .files import read_json
from .model import ModelConfig, TrainingConfig
from .typed import build, checked, mapping

__all__ = [
    "PROGRAM_SCHEMA",
    "GroupInfo",
    "Instr",
    "Kind",
    "Op",
    "PipeInfo",
    "Program",
    "RankInfo",
    "SliceEntry",
    "StageInfo",
    "format_grid",
    "parse_instr",
]

PROGRAM_SCHEMA = "hexhelix.program/1"
_META_NUMBERS = ("pair_oef", "runtime_reserve_bytes")  # the header's meta entries the simulator reads


class Op(StrEnum):
    LOAD = "LOAD"
    F = "F"
    B = "B"
    BI = "BI"
    BW = "BW"
    SEND = "SEND"
    RECV = "RECV"
    COLL = "COLL"
    GRAD_SYNC = "GRAD_SYNC"
    OPT = "OPT"
    SYNC = "SYNC"
    PAIR = "PAIR"


class Kind(StrEnum):
    ACT = "act"
    GRAD = "grad"


COMPUTE_OPS = (Op.F, Op.B, Op.BI, Op.BW)


@dataclass(frozen=True, slots=True, kw_only=True)
class Instr:
    """One instruction. Fields a kind does not use keep their defaults (-1, "", None)."""

    op: Op
    stage: int = -1
    mb: int = -1
    strand: int = 0
    kind: Kind | None = None
    peer: int = -1
    ch: int = -1
    group: str = ""
    coll: str = ""
    bucket: str = ""
    sync: int = -1
    pair: tuple[Instr, Instr] | None = None
    dur: float = 0.0
    bytes: int = 0
    layer: int = -1  # compute ops only: -1 = the whole stage, else just this (global) layer index

    def __str__(self) -> str:
        sm = f"{self.stage}.{self.mb}" + (f"@{self.strand}" if self.strand else "")
        match self.op:
            case Op.LOAD:
                return f"L{sm}"
            case Op.F | Op.B | Op.BI | Op.BW:
                return f"{self.op.value}{sm}" + (f"[{self.layer}]" if self.layer >= 0 else "")
            case Op.SEND | Op.RECV:
                k = "A" if self.kind is Kind.ACT else "G"
                arrow = ">" if self.op is Op.SEND else "<"
                return f"{self.op.value[0]}{k}{sm}{arrow}{self.peer}#{self.ch}"
            case Op.COLL:
                return f"C:{self.coll}:{self.group}:{sm}"
            case Op.GRAD_SYNC:
                return f"GS:{self.bucket}"
            case Op.OPT:
                return "OPT"
            case Op.SYNC:
                return f"SYNC:{self.sync}"
            case Op.PAIR:
                assert self.pair is not None
                return f"({self.pair[0]}|{self.pair[1]})"
        raise AssertionError(self.op)

    @property
    def key(self) -> tuple[int, int, int]:
        """(stage, micro-batch, strand): what the instruction works on."""
        return (self.stage, self.mb, self.strand)

    def stripped(self) -> Instr:
        """The instruction without estimates (what the token form carries)."""
        pair = None if self.pair is None else (self.pair[0].stripped(), self.pair[1].stripped())
        return replace(self, dur=0.0, bytes=0, pair=pair)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op.value}
        defaults = _INSTR_DEFAULTS
        for name in ("stage", "mb", "strand", "peer", "ch", "group", "coll", "bucket", "sync", "dur", "bytes",
                     "layer"):
            v = getattr(self, name)
            if v != defaults[name]:
                d[name] = v
        if self.kind is not None:
            d["kind"] = self.kind.value
        if self.pair is not None:
            d["pair"] = [self.pair[0].to_dict(), self.pair[1].to_dict()]
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "instr") -> Instr:
        """An instruction from its JSON object; a wrong field is an input error naming ``where``."""
        if not isinstance(d, dict):
            raise InvalidInputError(f"must be an object, got {d!r}", field=where)
        given: dict[str, Any] = {}
        for key, enum in (("op", Op), ("kind", Kind)):
            if key in d:
                try:
                    given[key] = enum(d[key])
                except ValueError:
                    raise InvalidInputError(f"must be one of {', '.join(e.value for e in enum)}, got {d[key]!r}",
                                            field=f"{where}.{key}") from None
        if "pair" in d:
            if not isinstance(d["pair"], list) or len(d["pair"]) != 2:
                raise InvalidInputError("must be a list of two instructions", field=f"{where}.pair")
            given["pair"] = tuple(cls.from_dict(x, f"{where}.pair[{i}]") for i, x in enumerate(d["pair"]))
        return build(cls, d, where, **given)


_INSTR_DEFAULTS = {"stage": -1, "mb": -1, "strand": 0, "peer": -1, "ch": -1, "group": "", "coll": "",
                   "bucket": "", "sync": -1, "dur": 0.0, "bytes": 0, "layer": -1}

_SM = r"(\d+)\.(\d+)(?:@(\d+))?"
_PATTERNS: list[tuple[re.Pattern[str], Any]] = [
    (re.compile(rf"^L{_SM}$"), lambda m: Instr(op=Op.LOAD, stage=int(m[1]), mb=int(m[2]), strand=int(m[3] or 0))),
    (re.compile(rf"^(BI|BW|F|B){_SM}(?:\[(\d+)\])?$"),
     lambda m: Instr(op=Op(m[1]), stage=int(m[2]), mb=int(m[3]), strand=int(m[4] or 0),
                     layer=int(m[5]) if m[5] is not None else -1)),
    (re.compile(rf"^([SR])([AG]){_SM}([<>])(\d+)#(\d+)$"),
     lambda m: Instr(op=Op.SEND if m[1] == "S" else Op.RECV, kind=Kind.ACT if m[2] == "A" else Kind.GRAD,
                     stage=int(m[3]), mb=int(m[4]), strand=int(m[5] or 0), peer=int(m[7]), ch=int(m[8]))),
    (re.compile(rf"^C:([a-z_]+):([^:]+):{_SM}$"),
     lambda m: Instr(op=Op.COLL, coll=m[1], group=m[2], stage=int(m[3]), mb=int(m[4]), strand=int(m[5] or 0))),
    (re.compile(r"^GS:(\S+)$"), lambda m: Instr(op=Op.GRAD_SYNC, bucket=m[1])),
    (re.compile(r"^OPT$"), lambda m: Instr(op=Op.OPT)),
    (re.compile(r"^SYNC:(\d+)$"), lambda m: Instr(op=Op.SYNC, sync=int(m[1]))),
]


def parse_instr(token: str) -> Instr:
    """Invert ``str(instr)`` (estimates ``dur``/``bytes`` are not part of the token).

    >>> str(parse_instr("SA2.3@1>5#12"))
    'SA2.3@1>5#12'
    """
    token = token.strip()
    if token.startswith("(") and token.endswith(")") and "|" in token:
        a, b = token[1:-1].split("|", 1)
        return Instr(op=Op.PAIR, pair=(parse_instr(a), parse_instr(b)))
    for pattern, make in _PATTERNS:
        m = pattern.match(token)
        if m:
            return make(m)
    raise InvalidInputError(f"not an instruction token: {token!r}", field="token")


# ----------------------------------------------------------------------------- header
@dataclass(frozen=True, slots=True, kw_only=True)
class StageInfo:
    """A virtual stage: layers [lo, hi) on the TP group ``ranks``; ``embed``/``head`` mark the ends."""

    id: int
    pipe: int
    phys: int
    layers: tuple[int, int]
    ranks: tuple[int, ...]
    tp_group: str
    embed: bool = False
    head: bool = False
    leg: str = ""  # "" (unfolded), "down" or "up" (W-shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeInfo:
    """A pipeline: its virtual stages in data-flow order, micro-batch count and batch share."""

    id: int
    stages: tuple[int, ...]
    micro_batches: int
    batch_share: float


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupInfo:
    """A process group, created in header order on every rank."""

    name: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceEntry:
    """Elements [lo, hi) along ``dim`` of canonical parameter ``param``, all-reduced over ``group``."""

    param: str
    dim: int
    lo: int
    hi: int
    group: str
    weights: tuple[float, ...] = ()  # per group member (group rank order): factor applied before the SUM

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))


@dataclass(frozen=True, slots=True, kw_only=True)
class RankInfo:
    """Static facts about one rank: where it runs and its memory budget."""

    rank: int
    node: str
    gpu: str
    capacity_bytes: int
    state_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """A compiled program for every rank; self-contained and byte-stable when serialised."""

    world_size: int
    strands: int
    schedule: str
    model: ModelConfig
    training: TrainingConfig
    pipes: tuple[PipeInfo, ...]
    stages: tuple[StageInfo, ...]
    groups: tuple[GroupInfo, ...]
    grad_sync: dict[str, tuple[SliceEntry, ...]]
    ranks: tuple[RankInfo, ...]
    programs: tuple[tuple[Instr, ...], ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.programs) != self.world_size:
            raise InvalidInputError(
                f"{len(self.programs)} rank programs for world size {self.world_size}", field="programs")
        if len(self.ranks) != self.world_size:
            raise InvalidInputError(f"{len(self.ranks)} rank entries for world size {self.world_size}",
                                    field="ranks")
        if self.strands not in (1, 2):
            raise InvalidInputError(f"must be 1 or 2 (DHelix co-executes two strands), got {self.strands}",
                                    field="strands")

    def group(self, name: str) -> GroupInfo:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def stage(self, sid: int) -> StageInfo:
        return self.stages[sid]

    def tokens(self, rank: int) -> list[str]:
        return [str(i) for i in self.programs[rank]]

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PROGRAM_SCHEMA,
            "world_size": self.world_size,
            "strands": self.strands,
            "schedule": self.schedule,
            "model": self.model.to_dict(),
            "training": self.training.to_dict(),
            "pipes": [{"id": p.id, "stages": list(p.stages), "micro_batches": p.micro_batches,
                       "batch_share": p.batch_share} for p in self.pipes],
            "stages": [{"id": s.id, "pipe": s.pipe, "phys": s.phys, "layers": list(s.layers),
                        "ranks": list(s.ranks), "tp_group": s.tp_group, "embed": s.embed, "head": s.head,
                        "leg": s.leg} for s in self.stages],
            "groups": [{"name": g.name, "ranks": list(g.ranks)} for g in self.groups],
            "grad_sync": {b: [{"param": e.param, "dim": e.dim, "lo": e.lo, "hi": e.hi, "group": e.group}
                              | ({"weights": list(e.weights)} if e.weights else {})
                              for e in entries] for b, entries in self.grad_sync.items()},
            "ranks": [{"rank": r.rank, "node": r.node, "gpu": r.gpu, "capacity_bytes": r.capacity_bytes,
                       "state_bytes": r.state_bytes} for r in self.ranks],
            "programs": [[i.to_dict() for i in prog] for prog in self.programs],
            "meta": self.meta,
        }

    def to_json(self) -> str:
        """Canonical JSON: fixed key order, one rank program per line group; identical input →
        identical bytes."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> Program:
        try:
            if not isinstance(d, dict):
                raise InvalidInputError("expected a JSON object")
            if d.get("schema") != PROGRAM_SCHEMA:
                raise InvalidInputError(
                    f"expected schema {PROGRAM_SCHEMA!r}, got {d.get('schema')!r}; recompile the plan "
                    "with this version of hexhelix", field="schema")
            try:
                def rows(key: str) -> list[Any]:
                    if not isinstance(d[key], list):
                        raise InvalidInputError(f"must be a list, got {d[key]!r}", field=key)
                    return d[key]

                if not isinstance(d["grad_sync"], dict):
                    raise InvalidInputError("must be an object of buckets", field="grad_sync")
                program = cls(
                    world_size=checked(d["world_size"], int, "world_size"), strands=checked(d["strands"], int, "strands"),
                    schedule=checked(d["schedule"], str, "schedule"),
                    model=ModelConfig.from_dict(d["model"]), training=TrainingConfig.from_dict(d["training"]),
                    pipes=tuple(build(PipeInfo, p, f"pipes[{i}]") for i, p in enumerate(rows("pipes"))),
                    stages=tuple(build(StageInfo, s, f"stages[{i}]") for i, s in enumerate(rows("stages"))),
                    groups=tuple(build(GroupInfo, g, f"groups[{i}]") for i, g in enumerate(rows("groups"))),
                    grad_sync={b: tuple(build(SliceEntry, e, f"grad_sync.{b}[{i}]")
                                        for i, e in enumerate(checked(entries, tuple[Any, ...], f"grad_sync.{b}")))
                               for b, entries in d["grad_sync"].items()},
                    ranks=tuple(build(RankInfo, r, f"ranks[{i}]") for i, r in enumerate(rows("ranks"))),
                    programs=tuple(tuple(Instr.from_dict(x, f"programs[{r}][{i}]")
                                         for i, x in enumerate(checked(prog, tuple[Any, ...], f"programs[{r}]")))
                                   for r, prog in enumerate(rows("programs"))),
                    meta=mapping(d.get("meta"), "meta"),
                )
                for key in _META_NUMBERS:   # checked here, so the error names the file
                    program.meta_number(key, 0.0)
                return program
            except KeyError as err:
                raise InvalidInputError("missing required field", field=str(err.args[0])) from None
            except (TypeError, ValueError, AttributeError) as err:
                if isinstance(err, InvalidInputError):
                    raise
                raise InvalidInputError(f"malformed entry ({err})") from None
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None

    def meta_number(self, key: str, default: float) -> float:
        """A number the header's free-form ``meta`` carries for the simulator (``_META_NUMBERS``),
        else ``default``; anything but a finite number ≥ 0 there is an input error naming it."""
        value = self.meta.get(key, default)
        if not finite_number(value) or value < 0:
            raise InvalidInputError(f"must be a finite number >= 0, got {value!r}", field=f"meta.{key}")
        return value

    @classmethod
    def load(cls, path: str) -> Program:
        return cls.from_dict(read_json(path), source=str(path))


def format_grid(program: Program, width: int = 14) -> str:
    """Per-rank token rows (``rank r: tok tok ...``) for printing and diffs."""
    lines = []
    for r, prog in enumerate(program.programs):
        lines.append(f"rank {r:>3}: " + " ".join(f"{i!s:<{width}}" for i in prog).rstrip())
    return "\n".join(lines)
