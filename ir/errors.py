"""The hexhelix exception hierarchy: every error a user can meet says what is wrong and how to fix it."""

from __future__ import annotations

__all__ = [
    "HexhelixError",
    "InvalidInputError",
    "ScheduleError",
    "SolverError",
    "UnsupportedError",
]


class HexhelixError(Exception):
    """Base class of every error hexhelix raises on purpose."""


class InvalidInputError(HexhelixError, ValueError):
    """A cluster, model, plan or program file (or argument) is malformed or inconsistent.

    ``source`` names the file (or argument) and ``field`` the offending key path, so the CLI can
    print one line such as ``cluster.yaml: nodes[1].count: must be a positive integer, got -2``.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.message = message
        self.source = source
        self.field = field
        super().__init__(self.__str__())

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        return ": ".join([*parts, self.message])

    def with_source(self, source: str) -> InvalidInputError:
        """Return a copy that names ``source`` (used when a loader learns the file name late)."""
        return InvalidInputError(self.message, source=source, field=self.field)


class UnsupportedError(HexhelixError):
    """The request is well formed but outside what hexhelix implements (e.g. wshape with 1 layer)."""


class ScheduleError(HexhelixError):
    """A program would deadlock or is inconsistent; carries the wait-for cycle and ops involved."""

    def __init__(self, message: str, *, cycle: list | None = None, ops: list | None = None):
        self.cycle = list(cycle or [])
        self.ops = list(ops or [])
        super().__init__(message)


class SolverError(HexhelixError):
    """A solver backend failed to run (not: found no feasible plan, which is a status)."""
