"""One rule for user-given numbers: a finite real number (numpy scalars included) and never a bool —
shared by the file loaders (cluster, profile) and the solvers' options of seconds, so ``True`` is
not taken for one second anywhere."""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import InvalidInputError

__all__ = ["check_seconds", "finite_number"]


def finite_number(value: Any) -> bool:
    """A finite real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_seconds(value: Any, field: str, *, positive: bool = False) -> float:
    """``value`` as seconds: a finite number ≥ 0 (> 0 with ``positive``), else an
    :class:`InvalidInputError` naming ``field``."""
    if not finite_number(value) or value < 0 or (positive and value == 0):
        raise InvalidInputError(f"must be a {'positive' if positive else 'non-negative'} number of seconds, "
                                f"got {value!r}", field=field)
    return float(value)
