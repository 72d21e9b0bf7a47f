"""Turn a hang into an error: a thread that watches the executor's position and, when one
instruction has not finished within the timeout, logs the rank, its step and program counter and
the surrounding tokens of every rank's schedule, then ends the process.

Every rank holds every rank's program (docs/program.md), so the grid can be printed anywhere —
PyTorch pipelining's best debugging feature (shared/reference/schedule_ir.md §1.6, §7.8). When a
c10d store is reachable (torchrun's agent keeps it alive even when a worker dies), each firing
rank publishes its position there and waits briefly for the others', so the grid marks where every
stuck rank stands.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from hexhelix.ir.program import Program

__all__ = ["EXIT_HANG", "Watchdog", "format_window"]

logger = logging.getLogger(__name__)

EXIT_HANG = 3
_KEY = "hexhelix/watchdog/pc/{}"


def format_window(program: Program, positions: dict[int, int], *, radius: int = 3,
                  fallback: int | None = None) -> str:
    """One line per rank: the tokens within ``radius`` of that rank's position, the current one in
    brackets. Ranks without a known position are centred on ``fallback`` and say so."""
    lines = []
    for r, prog in enumerate(program.programs):
        known = r in positions
        pc = positions.get(r, fallback if fallback is not None else 0)
        lo, hi = max(0, pc - radius), min(len(prog), pc + radius + 1)
        toks = [f"[{prog[i]}]" if known and i == pc else str(prog[i]) for i in range(lo, hi)]
        if known and pc >= len(prog):
            toks.append("[done]")
        where = f"pc {pc:>3}" if known else "pc   ?"
        lines.append(f"  rank {r:>3} {where}: {'… ' if lo else ''}{' '.join(toks)}{' …' if hi < len(prog) else ''}")
    return "\n".join(lines)


class Watchdog:
    """Watch one rank's progress; ``enter`` marks the start of each instruction (cheap: one tuple
    assignment), ``idle`` marks phases that may wait without limit.

    Parameters
    ----------
    rank, program : the rank watched and the whole-world program (for the grid).
    timeout : seconds one instruction may take.
    store : optional c10d store to exchange positions with the other ranks when firing.
    on_fire : called with the exit code after the report (default ``os._exit``: the main thread
        is blocked inside a collective and cannot be interrupted any other way).
    """

    def __init__(self, rank: int, program: Program, timeout: float, *, store: Any = None,
                 on_fire: Callable[[int], None] | None = None):
        self.rank, self.program, self.timeout, self.store = rank, program, float(timeout), store
        self.on_fire = on_fire or os._exit
        self._pos: tuple[int, int, str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hexhelix-watchdog-{rank}", daemon=True)
        self.fired = False

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def enter(self, step: int, pc: int, label: str) -> None:
        self._pos = (step, pc, label, time.monotonic())

    def idle(self) -> None:
        self._pos = None

    def _run(self) -> None:
        period = min(0.25, self.timeout / 10)
        while not self._stop.wait(period):
            pos = self._pos
            if pos is not None and time.monotonic() - pos[3] > self.timeout:
                self.fired = True
                logger.error("%s", self.report(pos))
                self.on_fire(EXIT_HANG)
                return

    def positions(self, pc: int) -> dict[int, int]:
        """This rank's pc and those the other ranks published within ~2 s (best effort)."""
        return {self.rank: pc, **self._exchange(pc)}

    def report(self, pos: tuple[int, int, str, float]) -> str:
        step, pc, label, _ = pos
        positions = self.positions(pc)
        return (f"rank {self.rank}: hang — no progress for {self.timeout:g} s in step {step} at pc {pc} "
                f"({label}); positions of the ranks that reported ([x] = current instruction):\n"
                + format_window(self.program, positions, fallback=pc))

    def _exchange(self, pc: int, wait_s: float = 2.0) -> dict[int, int]:
        """Publish this rank's pc in the store and collect the others' (best effort)."""
        if self.store is None:
            return {}
        out: dict[int, int] = {}
        try:
            self.store.set(_KEY.format(self.rank), str(pc))
            deadline = time.monotonic() + wait_s
            others = [r for r in range(self.program.world_size) if r != self.rank]
            while others and time.monotonic() < deadline:
                for r in list(others):
                    if self.store.check([_KEY.format(r)]):
                        out[r] = int(self.store.get(_KEY.format(r)))
                        others.remove(r)
                time.sleep(0.05)
        except Exception as err:  # a dead store must not hide the report
            logger.debug("watchdog: position exchange failed: %s", err)
        return out
