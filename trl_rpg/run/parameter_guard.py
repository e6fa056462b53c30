"""No non-finite parameters: the optimizer settings that would write NaN or inf into them are refused up front
(`check_optimizer_settings`), and a run whose parameters are not finite after an optimizer step stops there
(`ParameterGuard`), before anything is saved from it.

The gradient guard (`gradient_guard`) skips a step whose gradient is not finite; it cannot see a finite gradient
that the optimizer turns into NaN or inf: `learning_rate=inf` (inf times any gradient), `adam_epsilon=0` (AdamW
divides the first moment by `sqrt(v) + eps`, 0 / 0 for a parameter whose gradient is 0), `weight_decay=nan`, or a
custom optimizer passed to the trainer. Such a step leaves every later loss NaN, every later step skipped, and a
final model that is not finite, saved as if training had succeeded.
"""

from __future__ import annotations

import math

import torch
from transformers import TrainerCallback

#: The smallest positive normal float32: an `adam_epsilon` below it is 0 (or denormal) where AdamW adds it to float32
#: moments, and 0 / 0 is NaN for a parameter whose gradient is 0.
MIN_ADAM_EPSILON = float(torch.finfo(torch.float32).tiny)
#: The `ddp_timeout` seconds a process group works with (`check_ddp_timeout`): measured on gloo with two processes,
#: 5e9 s works and 9e9 s hangs at start-up (torch's deadline, now + timeout in int64 nanoseconds, overflows at about
#: 7.4e9 s from today); 1e9 s (about 31 years) leaves room for the collectives' margin and for the clock to advance.
DDP_TIMEOUT_RANGE = (1, 1_000_000_000)


class NonFiniteParameters(RuntimeError):
    """The parameters hold NaN or inf after an optimizer step: the run stops before saving anything from it."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_optimizer_settings(args) -> None:
    """Refuse optimizer settings (fields of `TrainingArguments`) that write NaN or inf into the parameters at the
    first step, or turn the gradient guard off: a `ValueError` names the field, the value and what is allowed.

    `learning_rate` and `weight_decay` must be finite and >= 0 (a negative one climbs the loss, or grows every
    weight); with an Adam-type `optim`, `adam_epsilon` finite and at least `MIN_ADAM_EPSILON` and `adam_beta1`,
    `adam_beta2` in [0, 1); `max_grad_norm` None or a number >= 0 (inf: no clipping, the norm still computed; NaN or
    a negative one would silently turn off both clipping and the gradient guard, which reads the norm clipping
    computes); and `ddp_timeout` (`check_ddp_timeout`), so that every config that checks these checks it too."""
    def bad(name, allowed):
        raise ValueError(f"{type(args).__name__}: `{name}`={getattr(args, name)!r} is not allowed; {allowed}.")

    for name in ("learning_rate", "weight_decay"):
        value = getattr(args, name)
        if not _number(value) or not math.isfinite(value) or value < 0:
            bad(name, "it must be a finite number >= 0 (a non-finite one makes the optimizer write NaN or inf into "
                      "every parameter at the first step)")
    if "adam" in str(getattr(args.optim, "value", args.optim)).lower():
        epsilon = args.adam_epsilon
        if not _number(epsilon) or not math.isfinite(epsilon) or epsilon < MIN_ADAM_EPSILON:
            bad("adam_epsilon", f"it must be a finite number >= {MIN_ADAM_EPSILON:.3g} (float32's smallest normal "
                                "number; e.g. 1e-8, the default): AdamW divides by sqrt(v) + adam_epsilon, which is "
                                "0 / 0 = NaN for every parameter whose gradient is 0")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(args, name)
            if not _number(value) or not 0 <= value < 1:
                bad(name, "it must be a number in [0, 1)")
    norm = args.max_grad_norm
    if norm is not None and (not _number(norm) or math.isnan(norm) or norm < 0):
        bad("max_grad_norm", "it must be a number >= 0 (0: no clipping; inf: no clipping, the norm still computed) "
                             "or None; a NaN or negative one turns clipping and the non-finite-gradient guard off")
    check_ddp_timeout(args)


def check_ddp_timeout(args) -> None:
    """Refuse a `ddp_timeout` the process group cannot work with, before anything is launched: a `ValueError` names
    the field and the range. 0 or a negative one times every collective out at once (and calls a healthy reward
    stuck); torch adds the timeout to the clock in nanoseconds (int64), so one above about 7e9 s overflows and every
    multi-process run fails at start-up with a gloo error that names neither ("client socket has timed out") or
    hangs. Allowed: `DDP_TIMEOUT_RANGE` (1 s to about 31 years; 1800, transformers' default)."""
    value = getattr(args, "ddp_timeout", None)
    if value is None:
        return
    low, high = DDP_TIMEOUT_RANGE
    if not _number(value) or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(
            f"{type(args).__name__}: `ddp_timeout`={value!r} is not allowed; it must be a number of seconds in "
            f"[{low}, {high}] (e.g. 1800, the default): 0 or less times every collective out at once, and one far "
            "above the range (about 7e9) overflows torch's process-group clock (every multi-process run fails at "
            "start-up).")


def local_parameters(model) -> list[tuple[str, torch.Tensor]]:
    """The trainable parameters of `model` as this process holds them (DeepSpeed ZeRO-3's partition, a DTensor's
    local shard, else the parameter), with their names."""
    held = []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            local = getattr(parameter, "ds_tensor", None)
            if local is None:
                local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
            held.append((name, local.detach()))
    return held


def maybe_non_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A one-element float tensor, 1.0 when the L2 norm of all `tensors` is not finite, else 0.0, left where the
    norm is (no host sync): one fused pass (torch's foreach norm, the kernel gradient clipping uses; the inf-norm one
    is about 12 times slower on CPU). A finite norm means every element is finite (NaN makes it NaN, inf makes it
    inf); a non-finite one may also come from large finite values whose squares overflow, so a 1.0 is confirmed by
    `first_non_finite`."""
    tensors = [tensor for tensor in tensors if tensor.numel()]
    if not tensors:
        return torch.zeros(1)
    return torch.isfinite(torch.nn.utils.get_total_norm(tensors, norm_type=2.0)).logical_not().float().reshape(1)


def first_non_finite(named: list[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first tensor of `named` holding NaN or inf, or None: exact, element by element (the slow
    path, taken only when `maybe_non_finite` flagged the tensors)."""
    return next((name for name, tensor in named if tensor.numel() and not torch.isfinite(tensor).all()), None)


class ParameterGuard(TrainerCallback):
    """After every optimizer step, stop the run with `NonFiniteParameters` if any parameter holds NaN or inf (on any
    process: `reduce` sums a flag tensor over them, moving it where the collective needs it; every process raises).
    It runs before the step's logging and saving, so no checkpoint or final model with such parameters is written,
    and rotation deletes no earlier checkpoint for it.

    Per step: one fused norm over this process's parameters (`maybe_non_finite`), one collective, one host sync. Only
    when some process's norm is not finite does each process look for the tensor element by element
    (`first_non_finite`) and a second collective decide: a norm that merely overflowed (large finite values) does
    not stop the run."""

    def __init__(self, reduce, trainer: str = "RPGTrainer"):
        self.reduce, self.trainer = reduce, trainer

    def on_step_end(self, args, state, control, model=None, **kwargs):
        named = local_parameters(model)
        if self.reduce(maybe_non_finite([tensor for _, tensor in named])).item() == 0:
            return control
        name = first_non_finite(named)
        if self.reduce(torch.tensor([0.0 if name is None else 1.0])).item() == 0:
            return control
        where = f"`{name}` is" if name is not None else "a parameter held by another process is"
        raise NonFiniteParameters(
            f"{self.trainer}: after optimizer step {state.global_step} {where} not finite (NaN or inf): the optimizer "
            "wrote it from a finite gradient (a non-finite gradient is skipped before the step). Training stopped "
            f"before saving anything from this step (learning_rate={args.learning_rate}, weight_decay="
            f"{args.weight_decay}, adam_epsilon={args.adam_epsilon}, optim={getattr(args.optim, 'value', args.optim)}"
            "; or the optimizer passed to the trainer). The checkpoints saved before it are intact.")


__all__ = ["DDP_TIMEOUT_RANGE", "MIN_ADAM_EPSILON", "NonFiniteParameters", "ParameterGuard", "check_ddp_timeout",
           "check_optimizer_settings", "first_non_finite", "local_parameters", "maybe_non_finite"]
