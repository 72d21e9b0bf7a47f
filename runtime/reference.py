"""The single-process oracle: the same model, initial weights, data and optimizer as a replayed
program, trained on the whole global batch at once (design.md convention 14).

Every micro-batch has the same size, so the mean loss over the global batch equals the mean of the
micro-batch means the distributed run reports, and its gradient equals the batch-share-weighted sum
of the pipelines' gradients.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from hexhelix.ir.model import ModelConfig, TrainingConfig

from .data import DataSource
from .torch_model import OptimConfig, StageModule
from .torch_tp import TPComm

__all__ = ["ReferenceResult", "run_reference"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceResult:
    """Per-step mean loss over the global batch and every final parameter (canonical names)."""

    losses: tuple[float, ...]
    params: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]  # the gradients of step ``capture_step``


def run_reference(model: ModelConfig, training: TrainingConfig, *, steps: int, seed: int,
                  data: DataSource, optim: OptimConfig | None = None, capture_step: int = 0) -> ReferenceResult:
    """Train the full model in one process for ``steps`` steps from the seed's initial weights;
    the gradients of step ``capture_step`` are kept."""
    net = StageModule(model, range(model.layers), embed=True, head=True, seed=seed)
    opt = (optim or OptimConfig()).build(net.parameters())
    comm = TPComm(group=None)
    losses = []
    grads: dict[str, torch.Tensor] = {}
    for step in range(steps):
        tokens, targets = data.global_batch(step, training.num_micro_batches)
        loss = net(tokens, comm, targets)
        loss.backward()
        if step == capture_step:
            grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        logger.debug("reference step %d loss %.6f", step, losses[-1])
    return ReferenceResult(losses=tuple(losses),
                           params={n: p.detach().clone() for n, p in net.named_parameters()}, grads=grads)
