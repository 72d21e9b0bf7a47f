"""What the simulator reports (schema ``hexhelix.sim/1``): iteration time, per-rank busy and idle
time, bubble fraction, peak memory against capacity, hidden and exposed communication.

The timeline itself (every op's start and end) rides along in :class:`Timeline` for the Chrome
trace and the Gantt chart; it is not part of the JSON summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hexhelix.ir.program import Program

__all__ = ["SIM_SCHEMA", "STREAMS", "RankStats", "SimResult", "Timeline"]

SIM_SCHEMA = "hexhelix.sim/1"
STREAMS = ("compute", "intra", "inter")  # stream ids 0, 1, 2 of a rank


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStats:
    """One rank's totals.

    ``busy_s`` is the time its compute stream works (F/B/PAIR/OPT), ``idle_s`` = makespan − busy.
    ``comm_s`` is the time its link streams move data (transfers it sends or receives, collectives
    it joins); ``exposed_comm_s`` is the part of that time during which the compute stream is idle,
    ``hidden_comm_s`` the part that runs under compute. ``peak_memory_bytes`` = model states
    (``RankInfo.state_bytes``) + runtime reserve + peak of live activations and receive buffers
    (``peak_activation_bytes``), the same terms as the cost model's memory.
    """

    rank: int
    busy_s: float
    idle_s: float
    comm_s: float
    exposed_comm_s: float
    hidden_comm_s: float
    peak_activation_bytes: int
    peak_memory_bytes: int
    capacity_bytes: int
    state_bytes: int
    reserve_bytes: int = 0

    @property
    def over_capacity(self) -> bool:
        return self.capacity_bytes > 0 and self.peak_memory_bytes > self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "busy_s": self.busy_s, "idle_s": self.idle_s, "comm_s": self.comm_s,
                "exposed_comm_s": self.exposed_comm_s, "hidden_comm_s": self.hidden_comm_s,
                "peak_activation_bytes": self.peak_activation_bytes,
                "peak_memory_bytes": self.peak_memory_bytes, "capacity_bytes": self.capacity_bytes,
                "state_bytes": self.state_bytes, "reserve_bytes": self.reserve_bytes}


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Where every executed instruction ran: ``spans[r]`` lists ``(start, end, stream, index)``
    for rank r (``index`` into ``program.programs[r]``); ``flows`` lists each point-to-point
    transfer as ``(src, send_index, dst, recv_index, start, end)``; ``memory[r]`` lists
    ``(time, live_bytes)`` after each change of rank r's live activations and receive buffers."""

    program: Program
    spans: tuple[tuple[tuple[float, float, int, int], ...], ...]
    flows: tuple[tuple[int, int, int, int, float, float], ...]
    memory: tuple[tuple[tuple[float, int], ...], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """The simulator's verdict on one program (one optimizer step).

    ``bubble_fraction`` is the share of rank-seconds in which compute streams are idle,
    1 − Σ busy / (world · makespan); for 1F1B with P equal stages and free communication it is
    (P−1)/(m+P−1). ``exposed_comm_s`` and ``hidden_comm_s`` are per-rank means.
    """

    makespan_s: float
    schedule: str
    strands: int
    instructions: int
    ranks: tuple[RankStats, ...]
    options: dict[str, Any] = field(default_factory=dict)
    wall_s: float = field(default=0.0, compare=False)
    timeline: Timeline | None = field(default=None, compare=False, repr=False)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def bubble_fraction(self) -> float:
        if self.makespan_s <= 0 or not self.ranks:
            return 0.0
        return 1.0 - sum(r.busy_s for r in self.ranks) / (len(self.ranks) * self.makespan_s)

    @property
    def exposed_comm_s(self) -> float:
        return sum(r.exposed_comm_s for r in self.ranks) / max(len(self.ranks), 1)

    @property
    def hidden_comm_s(self) -> float:
        return sum(r.hidden_comm_s for r in self.ranks) / max(len(self.ranks), 1)

    @property
    def peak_memory_bytes(self) -> list[int]:
        return [r.peak_memory_bytes for r in self.ranks]

    @property
    def over_capacity_ranks(self) -> list[int]:
        return [r.rank for r in self.ranks if r.over_capacity]

    def summary(self) -> dict[str, Any]:
        """The headline numbers (what ``hexhelix plan --simulate`` adds to its output)."""
        comm = self.exposed_comm_s + self.hidden_comm_s
        return {
            "makespan_s": self.makespan_s,
            "bubble_fraction": self.bubble_fraction,
            "exposed_comm_s": self.exposed_comm_s,
            "hidden_comm_s": self.hidden_comm_s,
            "comm_hidden_fraction": self.hidden_comm_s / comm if comm > 0 else 1.0,
            "peak_memory_bytes": self.peak_memory_bytes,
            "capacity_bytes": [r.capacity_bytes for r in self.ranks],
            "over_capacity_ranks": self.over_capacity_ranks,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SIM_SCHEMA, "schedule": self.schedule, "strands": self.strands,
                "world_size": self.world_size, "instructions": self.instructions, **self.summary(),
                "options": self.options, "ranks": [r.to_dict() for r in self.ranks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def format_table(self, max_rows: int = 64) -> str:
        """A human-readable per-rank table (what ``hexhelix simulate`` prints without --json); at
        most ``max_rows`` ranks, the fullest-memory ranks first beyond that."""
        gib = 2.0**30
        lines = [f"makespan {self.makespan_s:.6g} s   bubble {100 * self.bubble_fraction:.1f} %   "
                 f"comm exposed {self.exposed_comm_s:.4g} s / hidden {self.hidden_comm_s:.4g} s (mean per rank)",
                 f"{'rank':>5} {'busy s':>10} {'idle s':>10} {'comm s':>10} {'exposed s':>10} "
                 f"{'peak GiB':>9} {'cap GiB':>8}"]
        shown = list(self.ranks)
        if len(shown) > max_rows:
            shown = sorted(sorted(shown, key=lambda r: -r.peak_memory_bytes)[:max_rows], key=lambda r: r.rank)
        for r in shown:
            flag = "  OVER CAPACITY" if r.over_capacity else ""
            lines.append(f"{r.rank:>5} {r.busy_s:>10.4g} {r.idle_s:>10.4g} {r.comm_s:>10.4g} "
                         f"{r.exposed_comm_s:>10.4g} {r.peak_memory_bytes / gib:>9.2f} "
                         f"{r.capacity_bytes / gib:>8.1f}{flag}")
        if len(shown) < len(self.ranks):
            lines.append(f"({len(self.ranks) - len(shown)} more ranks not shown: the {max_rows} with the highest peak "
                         "memory are listed; --json has all)")
        return "\n".join(lines)
