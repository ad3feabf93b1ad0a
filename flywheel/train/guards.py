"""Stop a training at the first non-finite loss or gradient, on every worker at once, with a clear error.

transformers' Trainer hides such losses by default (`logging_nan_inf_filter` averages them away) and keeps
stepping, so a diverged run would otherwise finish "successfully" and be registered. The guard raises
`NonFiniteLossError` before the optimizer applies the bad step; the launcher turns it into a clean stop (no
retry: a diverged run diverges again), and nothing is registered.
"""

from __future__ import annotations

import math

import torch
from transformers import TrainerCallback

from flywheel.train.errors import NonFiniteLossError

__all__ = ["NonFiniteGuard", "NonFiniteLossError", "any_rank", "check_step", "grads_finite"]


def _world() -> int:
    return (torch.distributed.get_world_size()
            if torch.distributed.is_available() and torch.distributed.is_initialized() else 1)


def any_rank(flag: bool) -> bool:
    """True if `flag` is set on any worker (one tiny all-reduce when there are several workers), so every
    worker stops at the same step and none waits forever in a collective."""
    if _world() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item() > 0)


def grads_finite(parameters) -> bool:
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return True
    # NaN or inf anywhere makes the sum non-finite. A sum is an order of magnitude cheaper than an abs-max over
    # every element (this runs on every step); finite gradients only overflow it beyond ~1e38, i.e. diverged.
    total = torch.stack([g.sum() for g in grads]).sum()
    return bool(torch.isfinite(total))


def check_step(step: int, loss: float | torch.Tensor | None, parameters=None) -> None:
    """Raise NonFiniteLossError (on every worker) if this step's loss or gradients are not finite."""
    value = None if loss is None else float(loss.detach() if torch.is_tensor(loss) else loss)
    loss_bad = value is not None and not math.isfinite(value)
    grad_bad = not loss_bad and parameters is not None and not grads_finite(parameters)
    if any_rank(loss_bad or grad_bad):
        raise NonFiniteLossError(step, value, "gradient" if grad_bad else "loss")


class NonFiniteGuard(TrainerCallback):
    """transformers callback: checks the step's loss and (synchronised) gradients before the optimizer step.

    The trainer mixin (flywheel.train.hf) feeds it each micro-batch's loss through `observe`."""

    def __init__(self) -> None:
        self._loss: float | None = None

    def observe(self, loss: torch.Tensor) -> None:
        value = float(loss.detach())
        # keep the first bad value of the accumulation window: a later finite micro-batch must not hide it
        if self._loss is None or math.isfinite(self._loss):
            self._loss = value

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        params = [p for p in model.parameters() if p.requires_grad] if model is not None else None
        loss, self._loss = self._loss, None
        check_step(state.global_step + 1, loss, params)
