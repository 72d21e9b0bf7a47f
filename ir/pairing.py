"""Segment-pairing IR (DHelix): the problem of co-executing the forward of one micro-batch strand
with the backward of another, and the plan that answers it.

A :class:`PairingProblem` (schema ``hexhelix.problem/1``, kind ``pairing``) holds the two operator
sequences of one layer pair — each op with its duration in seconds, the resource it occupies
(``compute``, ``intra``, ``inter``), its op class and its dependencies — the overlap table (OEF per
op-class pair, DHelix Eq. 1), the per-block overhead, and the paper's *base groups* (segments may
split a group but never cross a group boundary, shared/reference/dhelix.md §1.5) with the *fused*
runs no cut may separate (DHelix fuses each column-parallel wgrad GEMM with the following
reduce-scatter). The op lists are given in a canonical topological order; segments of the barrier
model are contiguous runs of that order.

A :class:`PairingPlan` is a list of :class:`PairBlock` s in the authors' ``DCBlocks`` shape
(reference §2.5): forward-strand compute ops, backward-strand compute ops and the communication
ops of either strand, run together between two barriers. ``meta`` records what the plan was
solved for (GPU, TP degree, sequence parallelism, shapes) so a compiler can attach it to the
stages of a plan that match. This module imports nothing from the solver.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidInputError
from .typed import mapping

__all__ = [
    "PAIRING_PLAN_SCHEMA",
    "PROBLEM_SCHEMA",
    "RESOURCES",
    "PairBlock",
    "PairOp",
    "PairingPlan",
    "PairingProblem",
    "dhelix_default_plan",
]

PROBLEM_SCHEMA = "hexhelix.problem/1"
PAIRING_PLAN_SCHEMA = "hexhelix.pairing/1"
RESOURCES = ("compute", "intra", "inter")
STRANDS = ("fwd", "bwd")


@dataclass(frozen=True, slots=True, kw_only=True)
class PairOp:
    """One operator of a strand: its solo duration, the resource it occupies and its predecessors
    (names of earlier ops of the same strand)."""

    name: str
    op_class: str
    resource: str
    duration_s: float
    deps: tuple[str, ...] = ()
    wgrad: bool = False

    def __post_init__(self) -> None:
        if self.resource not in RESOURCES:
            raise InvalidInputError(f"must be one of {', '.join(RESOURCES)}, got {self.resource!r}",
                                    field=f"ops.{self.name}.resource")
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not d >= 0 or d == float("inf"):
            raise InvalidInputError(f"must be a finite number >= 0, got {d!r}", field=f"ops.{self.name}.duration_s")

    @property
    def is_comm(self) -> bool:
        return self.resource != "compute"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "op_class": self.op_class, "resource": self.resource,
                "duration_s": self.duration_s, "deps": list(self.deps), "wgrad": self.wgrad}

    @classmethod
    def from_dict(cls, d: Any) -> PairOp:
        if not isinstance(d, dict) or "name" not in d:
            raise InvalidInputError("each op must be an object with a name", field="ops")
        try:
            return cls(name=str(d["name"]), op_class=str(d["op_class"]), resource=str(d["resource"]),
                       duration_s=d["duration_s"], deps=tuple(str(x) for x in d.get("deps", ())),
                       wgrad=bool(d.get("wgrad", False)))
        except KeyError as err:
            raise InvalidInputError("missing required field", field=f"ops.{d['name']}.{err.args[0]}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class PairingProblem:
    """Forward strand ``fwd`` and backward strand ``bwd`` of one layer pair, the overlap table and
    the segment rules. Global op index: forward ops 0..F−1, then backward ops F..F+B−1."""

    fwd: tuple[PairOp, ...]
    bwd: tuple[PairOp, ...]
    oef: dict[str, float] = field(default_factory=dict)
    block_overhead_s: float = 0.0
    fwd_groups: tuple[tuple[str, ...], ...] = ()
    bwd_groups: tuple[tuple[str, ...], ...] = ()
    fused: tuple[tuple[str, ...], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    _index: dict[str, int] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.fwd and not self.bwd:
            raise InvalidInputError("a pairing problem needs at least one op", field="ops")
        if not self.block_overhead_s >= 0:
            raise InvalidInputError(f"must be >= 0, got {self.block_overhead_s!r}", field="block_overhead_s")
        for k, v in self.oef.items():
            if not isinstance(v, int | float) or v != v:
                raise InvalidInputError(f"must be a number, got {v!r}", field=f"oef.{k}")
        for strand, ops in (("fwd", self.fwd), ("bwd", self.bwd)):
            seen: set[str] = set()
            for i, op in enumerate(ops):
                if op.name in self._index:
                    raise InvalidInputError(f"duplicate op name {op.name!r}", field=f"ops.{strand}[{i}]")
                for dep in op.deps:
                    if dep not in seen:
                        raise InvalidInputError(
                            f"depends on {dep!r}, which is not an earlier op of the {strand} strand "
                            "(ops must be listed in a topological order)", field=f"ops.{strand}[{i}].deps")
                seen.add(op.name)
                self._index[op.name] = len(self._index)
        for strand, groups, ops in (("fwd", self.fwd_groups, self.fwd), ("bwd", self.bwd_groups, self.bwd)):
            flat = [n for g in groups for n in g]
            if groups and (flat != [o.name for o in ops] or any(not g for g in groups)):
                raise InvalidInputError("groups must be non-empty and concatenate to the op order",
                                        field=f"groups.{strand}")
        for k, run in enumerate(self.fused):
            idx = [self._index.get(n, -1) for n in run]
            if len(run) < 2 or -1 in idx or idx != list(range(idx[0], idx[0] + len(idx))) \
                    or (idx[0] < len(self.fwd) <= idx[-1]):
                raise InvalidInputError("a fused run must name >= 2 consecutive ops of one strand",
                                        field=f"fused[{k}]")

    # ----------------------------------------------------------------- views
    @property
    def ops(self) -> tuple[PairOp, ...]:
        return (*self.fwd, *self.bwd)

    @property
    def num_fwd(self) -> int:
        return len(self.fwd)

    def index(self, name: str) -> int:
        """Global index of op ``name`` (forward first)."""
        try:
            return self._index[name]
        except KeyError:
            raise InvalidInputError(f"no op named {name!r} in the pairing problem", field="ops") from None

    def strand_of(self, i: int) -> str:
        return "fwd" if i < len(self.fwd) else "bwd"

    def overlap_factor(self, a: str, b: str) -> float:
        """OEF of op classes ``a`` and ``b`` (symmetric; 0 — no gain — when the table has no entry)."""
        return float(self.oef.get(f"{a}|{b}", self.oef.get(f"{b}|{a}", 0.0)))

    def cut_rules(self, strand: str) -> tuple[frozenset[int], frozenset[int]]:
        """(mandatory, forbidden) cut positions of a strand: position k cuts between its ops k−1
        and k. Group boundaries are mandatory; positions inside a fused run are forbidden."""
        groups = self.fwd_groups if strand == "fwd" else self.bwd_groups
        ops = self.fwd if strand == "fwd" else self.bwd
        off = 0 if strand == "fwd" else len(self.fwd)
        mandatory, pos = set(), 0
        for g in groups[:-1]:
            pos += len(g)
            mandatory.add(pos)
        forbidden: set[int] = set()
        for run in self.fused:
            first = self._index[run[0]] - off
            if 0 <= first < len(ops):
                forbidden.update(range(first + 1, first + len(run)))
        return frozenset(mandatory), frozenset(forbidden)

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROBLEM_SCHEMA, "kind": "pairing",
                "ops": {"fwd": [o.to_dict() for o in self.fwd], "bwd": [o.to_dict() for o in self.bwd]},
                "oef": dict(self.oef), "block_overhead_s": self.block_overhead_s,
                "groups": {"fwd": [list(g) for g in self.fwd_groups], "bwd": [list(g) for g in self.bwd_groups]},
                "fused": [list(r) for r in self.fused], "meta": self.meta}

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> PairingProblem:
        try:
            if not isinstance(d, dict):
                raise InvalidInputError("expected a JSON object")
            if d.get("schema") != PROBLEM_SCHEMA or d.get("kind") != "pairing":
                raise InvalidInputError(f"expected schema {PROBLEM_SCHEMA!r} kind 'pairing', got "
                                        f"{d.get('schema')!r} kind {d.get('kind')!r}; re-export with "
                                        "`hexhelix pair --export-problem`", field="schema")
            ops = d.get("ops")
            if not isinstance(ops, dict):
                raise InvalidInputError("missing required field", field="ops")
            groups = d.get("groups") or {}
            return cls(fwd=tuple(PairOp.from_dict(o) for o in ops.get("fwd", [])),
                       bwd=tuple(PairOp.from_dict(o) for o in ops.get("bwd", [])),
                       oef={str(k): v for k, v in (d.get("oef") or {}).items()},
                       block_overhead_s=d.get("block_overhead_s", 0.0),
                       fwd_groups=tuple(tuple(g) for g in groups.get("fwd", [])),
                       bwd_groups=tuple(tuple(g) for g in groups.get("bwd", [])),
                       fused=tuple(tuple(r) for r in d.get("fused", [])), meta=mapping(d.get("meta"), "meta"))
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None
        except (TypeError, AttributeError) as err:
            raise InvalidInputError(f"malformed pairing problem ({err})", source=source) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class PairBlock:
    """One barrier interval: forward-strand compute ops ∥ backward-strand compute ops, with the
    communication ops (of either strand) launched at its start."""

    fwd: tuple[str, ...] = ()
    bwd: tuple[str, ...] = ()
    comm: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.fwd, *self.bwd, *self.comm)

    def to_list(self) -> list[list[str] | str]:
        """The authors' DCBlocks entry: three op lists, ``"None"`` when empty."""
        return [list(x) if x else "None" for x in (self.fwd, self.bwd, self.comm)]


@dataclass(frozen=True, slots=True, kw_only=True)
class PairingPlan:
    """An ordered list of blocks covering every op of both strands exactly once."""

    blocks: tuple[PairBlock, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def strand_sets(self, problem: PairingProblem) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Per block, the (forward, backward) global op indices in canonical order; validates the
        plan against ``problem`` (coverage, strands, dependencies, legality) first."""
        self.check(problem)
        out = []
        for b in self.blocks:
            idx = sorted(problem.index(n) for n in b.names)
            out.append((tuple(i for i in idx if i < problem.num_fwd), tuple(i for i in idx if i >= problem.num_fwd)))
        return out

    def check(self, problem: PairingProblem) -> None:
        """Raise InvalidInputError naming the first block that breaks a rule: every op exactly once,
        compute ops in the list of their strand, comm ops in ``comm``, each op after its
        dependencies (earlier block or same block), and no two strands on one link in a block."""
        done: set[str] = set()
        for k, b in enumerate(self.blocks):
            where = f"blocks[{k}]"
            names = b.names
            cur: set[str] = set()
            for lst, strand in ((b.fwd, "fwd"), (b.bwd, "bwd"), (b.comm, None)):
                for n in lst:
                    i = problem.index(n)
                    op = problem.ops[i]
                    if strand is None and not op.is_comm:
                        raise InvalidInputError(f"{n!r} is a compute op but listed under comm", field=where)
                    if strand is not None and (op.is_comm or problem.strand_of(i) != strand):
                        raise InvalidInputError(f"{n!r} does not belong in the {strand} compute list", field=where)
                    if n in done or n in cur:
                        raise InvalidInputError(f"op {n!r} appears twice", field=where)
                    cur.add(n)
            for n in names:
                for dep in problem.ops[problem.index(n)].deps:
                    if dep not in done and dep not in cur:
                        raise InvalidInputError(f"{n!r} runs before its dependency {dep!r}", field=where)
            done |= cur
            links: dict[str, str] = {}
            for n in b.comm:
                i = problem.index(n)
                res, strand = problem.ops[i].resource, problem.strand_of(i)
                if links.setdefault(res, strand) != strand:
                    raise InvalidInputError(f"illegal pair: both strands use the {res} link", field=where)
        missing = [o.name for o in problem.ops if o.name not in done]
        if missing:
            raise InvalidInputError(f"{len(missing)} ops never run, first {missing[0]!r}", field="blocks")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PAIRING_PLAN_SCHEMA, "DCBlocks": [b.to_list() for b in self.blocks], "meta": self.meta}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> PairingPlan:
        """Read our schema, or the authors' ``{"DCBlocks": [...]}`` file as is."""
        try:
            if not isinstance(d, dict) or not isinstance(d.get("DCBlocks"), list):
                raise InvalidInputError("expected an object with a DCBlocks list", field="DCBlocks")
            if d.get("schema", PAIRING_PLAN_SCHEMA) != PAIRING_PLAN_SCHEMA:
                raise InvalidInputError(f"expected schema {PAIRING_PLAN_SCHEMA!r}, got {d.get('schema')!r}",
                                        field="schema")
            blocks = []
            for k, entry in enumerate(d["DCBlocks"]):
                if not isinstance(entry, list) or len(entry) != 3:
                    raise InvalidInputError("each block must be [fwd ops, bwd ops, comm ops]", field=f"DCBlocks[{k}]")
                if any(x not in (None, "None") and not isinstance(x, list) for x in entry):
                    raise InvalidInputError("each of a block's three entries must be a list of op names or "
                                            "\"None\"", field=f"DCBlocks[{k}]")
                lists = [() if x in (None, "None") else tuple(str(n) for n in x) for x in entry]
                blocks.append(PairBlock(fwd=lists[0], bwd=lists[1], comm=lists[2]))
            return cls(blocks=tuple(blocks), meta=mapping(d.get("meta"), "meta"))
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None


# The authors' hand-written default plan (DHeLlam ``init_DCBlocks``, reference §2.5), in the op
# names of :func:`hexhelix.ir.opgraph.build_layer_graph` for a TP > 1 layer with sequence parallelism.
_DHELIX_DEFAULT = (
    (("ln_attn",), (), ()),
    ((), ("bda_mlp_bwd",), ("allgather_attn",)),
    (("gemm_attn_c", "fl_attn"), (), ("allgather_mlp_bwd",)),
    (("gemm_attn_l",), (), ()),
    ((), ("gemm_dgrad_mlp_l", "gemm_wgrad_mlp_l"), ("reduce_scatter_attn",)),
    ((), ("swiglu_bwd",), ()),
    ((), ("gemm_dgrad_mlp_c",), ()),
    ((), ("gemm_wgrad_mlp_c",), ("reduce_scatter_mlp_c_bwd",)),
    (("bda_attn", "ln_mlp"), (), ()),
    ((), ("ln_mlp_bwd", "bda_attn_bwd"), ("allgather_mlp",)),
    (("gemm_mlp_c",), (), ("allgather_attn_bwd",)),
    (("swiglu_mlp", "gemm_mlp_l"), (), ()),
    ((), ("gemm_dgrad_attn_l", "gemm_wgrad_attn_l", "attn_bwd"), ("reduce_scatter_mlp",)),
    (("bda_mlp",), (), ()),
    ((), ("gemm_dgrad_attn_c",), ()),
    ((), ("gemm_wgrad_attn_c",), ("reduce_scatter_attn_c_bwd",)),
    ((), ("ln_attn_bwd",), ()),
)


def dhelix_default_plan() -> PairingPlan:
    """The paper's 17-block default plan for a Llama layer under TP+SP (reference §2.5).

    >>> len(dhelix_default_plan().blocks)
    17
    """
    return PairingPlan(blocks=tuple(PairBlock(fwd=f, bwd=b, comm=c) for f, b, c in _DHELIX_DEFAULT),
                       meta={"source": "DHeLlam init_DCBlocks default plan (shared/reference/dhelix.md §2.5)"})
