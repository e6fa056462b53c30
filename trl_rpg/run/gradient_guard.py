"""The non-finite-gradient guard: an optimizer step whose gradient norm is NaN or inf is skipped and counted.

The guard reads the total gradient norm that `Trainer` computes before every optimizer step (for clipping, or
for logging when clipping is off), so it costs no extra pass over the gradients. Reading the norm, not the
gradient elements, also catches a gradient whose elements are all finite but whose norm overflows (clipping would
then scale it to zeros, and AdamW would still move the parameters on stale momentum). Skipping sets every gradient
to None: torch optimizers leave parameters without a gradient, and their state, untouched.

Not applied, on purpose:
- with a gradient scaler (fp16 mixed precision): an overflowing fp16 step is ordinary, and the scaler already skips
  it and lowers its scale (it must see the inf to do so);
- under DeepSpeed, which owns the gradients: DeepSpeed 0.19 itself skips a step whose global gradient norm is not
  finite (ZeRO-1/2/3, every precision; in bf16 while `bf16.check_grad_overflow` is true, its default).
Both are tested end to end (tests/test_gradient_guard.py, tests/test_distributed.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def should_skip(grad_norm, deepspeed: bool, has_scaler: bool) -> bool:
    """Whether the optimizer step with total gradient norm `grad_norm` must be skipped."""
    if deepspeed or has_scaler or grad_norm is None:
        return False
    value = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
    return not math.isfinite(value)


def drop_gradients(model: nn.Module) -> None:
    """Make the coming optimizer step a no-op: no parameter has a gradient."""
    for param in model.parameters():
        param.grad = None


def skip_step(model: nn.Module, grad_norm, deepspeed: bool, has_scaler: bool) -> bool:
    """The guard of both trainers, after `Trainer._get_grad_norm`: when `should_skip`, drop the gradients (the
    step becomes a no-op) and return True."""
    skipped = should_skip(grad_norm, deepspeed, has_scaler)
    if skipped:
        drop_gradients(model)
    return skipped


def skipped_warning(trainer: str, grad_norm, step: int, skipped: int) -> str:
    """The warning of a skipped step: `skipped` steps so far, this one (`step`, 1-based) included."""
    return (f"{trainer}: the gradient norm is {float(grad_norm)} at step {step}; optimizer step skipped ({skipped} so "
            "far).")


__all__ = ["drop_gradients", "should_skip", "skip_step", "skipped_warning"]
