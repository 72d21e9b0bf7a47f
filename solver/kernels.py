"""The planner's numba kernels, compiled for the argument types their callers pass, ahead of a solve.

Four loops are compiled with numba (the pricing DP, its Pareto-label form, the DP with memory at
depth, HexiScale's layer scan). Compiling them takes ~25 s on 2 cores the first time after an install
(the machine code is then cached on disk beside the sources and loads in well under a second).
Compiled on first use, that time fell inside a solve's time limit: on a fresh install the demo's
10 s ``milp-highs`` solve ran 17 s, and a 40 s ``cpsat`` solve 50 s with its bound lost (a forked
child compiling the same loops again past its deadline; docs/gap-analysis.md, "Short time limits"). :func:`warm` compiles or loads them all for their declared argument types
before an exact solve starts its clock (:func:`.exact_plan.solve_exact`); a type not declared
still compiles, on the call that meets it (tests/test_kernels.py checks that none does).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["AVAILABLE", "Kernel", "signature", "warm"]

logger = logging.getLogger(__name__)

# numba is imported (~0.8 s) on first use only
AVAILABLE = importlib.util.find_spec("numba") is not None

# the modules that define a kernel (imported by :func:`warm`, which registers them)
KERNEL_MODULES = ("shape_dp_jit", "shape_labels_jit", "depth_dp_jit", "layer_assign_jit")

_CODES = {"f": "float64", "i": "int64", "b": "boolean"}
_LAYOUTS = {"1": "[::1]", "2": "[:, ::1]", "3": "[:, :, ::1]"}


def signature(codes: str) -> str:
    """A numba signature from short codes, one per argument: ``f``/``i``/``b`` a float64/int64/bool
    scalar, followed by 1–3 a C-contiguous array of that many dimensions; ``N`` None.
    ``signature("f1 N i")`` is ``"(float64[::1], none, int64)"``."""
    parts = []
    for code in codes.split():
        if code == "N":
            parts.append("none")
        elif code[0] in _CODES and (len(code) == 1 or code[1:] in _LAYOUTS):
            parts.append(_CODES[code[0]] + _LAYOUTS.get(code[1:], ""))
        else:
            raise ValueError(f"unknown argument code {code!r} in {codes!r}")
    return f"({', '.join(parts)})"


_REGISTRY: list[Kernel] = []


class Kernel:
    """``fn`` compiled by numba for ``signatures`` (numba signature strings), its machine code cached
    on disk (uncached where no cache folder is writable); compiled or loaded on the first call or
    by :meth:`ready`. Without numba it is ``fn`` itself, run as plain Python."""

    def __init__(self, fn: Callable[..., Any], signatures: tuple[str, ...]) -> None:
        self.fn, self.signatures = fn, signatures
        self._compiled: Callable[..., Any] | None = None
        _REGISTRY.append(self)

    def ready(self) -> Callable[..., Any]:
        """The compiled function (compiled or loaded now if it is not yet)."""
        if self._compiled is None:
            self._compiled = _compile(self.fn, self.signatures) if AVAILABLE else self.fn
        return self._compiled

    def __call__(self, *args: Any) -> Any:
        return self.ready()(*args)


def _compile(fn: Callable[..., Any], signatures: tuple[str, ...]) -> Callable[..., Any]:
    import numba

    try:
        disp = numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # no writable cache next to the source nor in the user's cache folder
        disp = numba.njit(nogil=True)(fn)
    for sig in signatures:  # loads the cached machine code where it is there
        disp.compile(sig)
    return disp


def warm() -> float:
    """Compile (or load from the disk cache) every kernel now; returns the seconds it took. Says so
    on the log (warning level) when it took over a second (a compile; a load takes ~0.6 s here)."""
    if not AVAILABLE:
        return 0.0
    t0 = time.perf_counter()
    for name in KERNEL_MODULES:
        importlib.import_module(f"{__package__}.{name}")
    cold = [k for k in _REGISTRY if k._compiled is None]
    if cold:
        logger.info("compiling or loading %d numba kernels", len(cold))
    for k in cold:
        k.ready()
    took = time.perf_counter() - t0
    if took > 1.0:
        logger.warning("the planner's numba kernels took %.1f s to compile or load, before the solve's clock "
                       "started (a fresh install compiles them once; the machine code is cached on disk)", took)
    return took
