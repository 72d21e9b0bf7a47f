"""One function call in a forked child, its value (or what it raised) sent back through a pipe.

The exact planner runs two kinds of work beside itself this way: the fluid bound search on a second
core (:mod:`.fluid_job`) and HiGHS, which does not check its clock in every phase and is killed at
its deadline (:mod:`.milp_plan`). A fork inherits the parent's built tables and models, so nothing
is pickled on the way in; only the answer is.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Answer", "ForkedCall", "can_fork", "fork_available", "fork_call"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What a child sent: its function's ``value``, or ``error`` (one line) when it raised or died."""

    value: Any = None
    error: str = ""


def fork_available() -> bool:
    """The fork start method exists and this process may have children (a daemonic one may not)."""
    return "fork" in mp.get_all_start_methods() and not mp.current_process().daemon


def can_fork() -> bool:
    """A second core to run on, and :func:`fork_available`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores >= 2 and fork_available()


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send(Answer(value=fn(*args)))
    except Exception as err:  # anything the work raises goes back as a message
        conn.send(Answer(error=f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


@dataclass
class ForkedCall:
    """A call running in a forked child (:func:`fork_call`)."""

    process: mp.process.BaseProcess
    conn: Connection

    def ready(self) -> bool:
        """The child has answered (or died): :meth:`wait` will not block."""
        return self.conn.poll(0)

    def wait(self, seconds: float | None) -> Answer | None:
        """The child's answer within ``seconds`` (None: as long as it takes); None if it has not
        answered by then (it keeps running: :meth:`stop` it). A child that died without a word
        answers with an error."""
        if not self.conn.poll(None if seconds is None else max(0.0, seconds)):
            return None
        try:
            return self.conn.recv()
        except (EOFError, OSError) as err:  # the child died without sending
            return Answer(error=f"its process exited without a result ({type(err).__name__})")

    def stop(self, *, grace: float = 0.0, kill: bool = False) -> None:
        """Close the pipe and end the child: wait up to ``grace`` seconds for it to exit (one that
        answered closes its files), then terminate it (SIGTERM) or, with ``kill``, kill it (SIGKILL)."""
        self.conn.close()
        self.process.join(timeout=grace)
        if self.process.is_alive():
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
            self.process.join(timeout=5.0)


def fork_call(fn: Callable[..., Any], *args: Any, name: str) -> ForkedCall:
    """Start ``fn(*args)`` in a forked daemonic child named ``name``."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args), daemon=True, name=name)
    proc.start()
    child.close()
    return ForkedCall(process=proc, conn=parent)
