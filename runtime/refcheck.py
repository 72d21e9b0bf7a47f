"""``--check-reference``: compare a distributed run with the single-process reference.

Rank 0 gathers every rank's parameter shards, trains the reference (:mod:`.reference`) for the same
steps, and compares each step's loss and every element of every shard of every pipeline's copy.
The verdict is broadcast so that every rank exits with the same status.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .reference import run_reference

if TYPE_CHECKING:
    from .torch_exec import Executor

__all__ = ["Tolerance", "compare_with_reference"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance:
    """What "equal to the reference" means in fp32 (see docs/runtime.md, "Tolerances").

    * loss of every step: |a − b| ≤ loss_atol + loss_rtol·|b|;
    * gradients of the first step, after GRAD_SYNC (the direct check of slicing and batch-share
      weights — AdamW is invariant to a common scale of the gradient, so the parameters alone
      would not see a uniformly mis-scaled gradient): |a − b| ≤ grad_atol·max|b| + grad_rtol·|b|
      element-wise, per tensor;
    * final parameters: ‖a − b‖ / ‖b‖ ≤ param_rtol per tensor. Not element-wise: AdamW divides
      by √v, so an element whose gradient is rounding noise (|g| ~ 1e-9) can move by a sizeable
      fraction of lr in either run; the norm is immune to such elements, a real bug is not.
    """

    loss_rtol: float = 1e-5
    loss_atol: float = 1e-6
    grad_rtol: float = 1e-4
    grad_atol: float = 1e-5
    param_rtol: float = 1e-4

    def __str__(self) -> str:
        return (f"fp32; loss rtol {self.loss_rtol:g} atol {self.loss_atol:g}; first-step gradients "
                f"rtol {self.grad_rtol:g} atol {self.grad_atol:g}·max|g|; parameters relative norm "
                f"{self.param_rtol:g}")


def compare_with_reference(ex: Executor, losses: list[float], *, start: int, tol: Tolerance) -> tuple[bool, str]:
    """Collective over the world: returns (ok, report) on every rank (the report is rank 0's)."""
    prog = ex.program
    grads = ex.captured or {}
    shards = {n: (ex.shard_lo[n], p.detach().cpu().clone(), grads.get(n)) for n, p in ex.params.items()}
    gathered: list | None = [None] * prog.world_size if ex.rank == 0 else None
    dist.gather_object(shards, gathered, dst=0)
    verdict: list = [None]
    if ex.rank == 0:
        verdict[0] = _compare(ex, losses, start, tol, gathered)  # type: ignore[arg-type]
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def _piece(full: torch.Tensor, sl: tuple[int | None, int, int]) -> torch.Tensor:
    sdim, lo, hi = sl
    return full if sdim is None else full.narrow(sdim, lo, hi - lo)


def _errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max |diff|, ‖diff‖ / ‖want‖)."""
    diff = got - want
    return float(diff.abs().max()), float(diff.norm() / want.norm().clamp_min(1e-30))


def _compare(ex: Executor, losses: list[float], start: int, tol: Tolerance,
             gathered: list[dict]) -> tuple[bool, str]:
    prog = ex.program
    ref = run_reference(prog.model, prog.training, steps=start + len(losses), seed=ex.opts.seed,
                        data=ex.data, optim=ex.opts.optim, capture_step=start)
    lines, bad = [f"reference check ({tol}):"], []
    for i, loss in enumerate(losses):
        r = ref.losses[start + i]
        good = abs(loss - r) <= tol.loss_atol + tol.loss_rtol * abs(r)
        if not good:
            bad.append(f"loss of step {start + i}")
        lines.append(f"  step {start + i}: loss {loss:.7f} reference {r:.7f} |diff| {abs(loss - r):.2e}"
                     f"{'' if good else '  MISMATCH'}")
    worst = {"grad": [0.0, 0.0, ""], "param": [0.0, 0.0, ""]}
    count = 0
    for rank, shards in enumerate(gathered):
        for name, (sl, value, grad) in shards.items():
            count += 1
            checks = [("param", value, _piece(ref.params[name], sl), tol.param_rtol, 0.0)]
            if grad is not None:
                checks.append(("grad", grad, _piece(ref.grads[name], sl), tol.grad_rtol, tol.grad_atol))
            for what, got, want, rtol, atol in checks:
                a, rel = _errors(got, want)
                w = worst[what]
                if rel > w[1]:
                    w[1], w[2] = rel, f"{name} on rank {rank}"
                w[0] = max(w[0], a)
                if what == "grad":
                    ok = torch.allclose(got, want, rtol=rtol, atol=atol * float(want.abs().max()))
                else:
                    ok = rel <= rtol
                if not ok:
                    bad.append(f"{what} {name} on rank {rank} (max |diff| {a:.2e}, relative norm {rel:.2e})")
    for what, label in (("grad", f"gradients of step {start}"), ("param", "final parameters")):
        a, rel, where = worst[what]
        lines.append(f"  {label}: {count} shards on {len(gathered)} ranks, max |diff| {a:.2e}, "
                     f"max relative norm diff {rel:.2e} ({where or '-'})")
    lines += [f"  MISMATCH {b}" for b in bad[:10]]
    lines.append(f"reference check: {'FAIL' if bad else 'PASS'}")
    return not bad, "\n".join(lines)
