"""No non-finite parameters: the optimizer settings that would write NaN or inf into them are refused up front
(`check_optimizer_settings`), and a run whose parameters are not finite after an optimizer step stops at the next
check (`ParameterGuard`: every save, the end, after a skipped step, every `CHECK_EVERY` steps), before anything is
saved from it.

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


#: Between saves, the parameters are checked every `CHECK_EVERY` optimizer steps (besides the checks `check_due` always
#: makes): one fused pass over every parameter costs about 1.5% of a CPU step of the cost benchmark's 24M-parameter
#: model (docs/benchmarks.md section 2), a tenth of that every tenth step.
CHECK_EVERY = 10


def check_due(step: int, control, max_steps: int, skipped_since_check: bool, every: int = CHECK_EVERY) -> bool:
    """Whether the parameters are checked after optimizer step `step` (1-based): always before anything is saved
    from it (`control.should_save`, and the last step, after which the final model is saved), when the gradient
    guard skipped a step since the last check (a non-finite gradient is the usual sign of non-finite parameters:
    the run stops on the parameters at once instead of skipping every later step), and every `every` steps."""
    return (control.should_save or control.should_training_stop or step >= max_steps or skipped_since_check
            or step % every == 0)


class ParameterGuard(TrainerCallback):
    """Stop the run with `NonFiniteParameters` if any parameter holds NaN or inf (on any process: `reduce` sums a flag
    tensor over them, moving it where the collective needs it; every process raises), checked after the optimizer
    steps `check_due` names and at the end of training. It runs before the step's logging and saving, so no checkpoint
    or final model with such parameters is written, and rotation deletes no earlier checkpoint for it.

    What it promises: nothing non-finite is saved (every save and the end are checked), and non-finite parameters
    never go on training in silence (their next gradient is not finite, the gradient guard skips that step, and the
    check after it stops the run); a non-finite value the loss does not reach (an embedding row of a token no batch
    holds) is found at most `every` - 1 steps late, before anything is saved. All processes decide alike (the step,
    `control` and the skipped-step count are the same on each), so the collectives match.

    A check: one fused norm over this process's parameters (`maybe_non_finite`), one collective, one host sync. Only
    when some process's norm is not finite does each process look for the tensor element by element
    (`first_non_finite`) and a second collective decide: a norm that merely overflowed (large finite values) does
    not stop the run. `skipped_steps` returns the trainer's count of steps the gradient guard skipped."""

    def __init__(self, reduce, trainer: str = "RPGTrainer", skipped_steps=lambda: 0, every: int = CHECK_EVERY):
        self.reduce, self.trainer, self.skipped_steps, self.every = reduce, trainer, skipped_steps, every
        self.checked = (0, 0)  # (the step of the last check, the skipped-step count then)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        skipped = self.skipped_steps()
        if check_due(state.global_step, control, state.max_steps, skipped != self.checked[1], self.every):
            self.check(args, state.global_step, model)
            self.checked = (state.global_step, skipped)
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # a stop another callback asked for after this one ran: the model about to be saved is checked too
        if self.checked[0] != state.global_step:
            self.check(args, state.global_step, model)
            self.checked = (state.global_step, self.skipped_steps())
        return control

    def check(self, args, step: int, model) -> None:
        named = local_parameters(model)
        if self.reduce(maybe_non_finite([tensor for _, tensor in named])).item() == 0:
            return
        name = first_non_finite(named)
        if self.reduce(torch.tensor([0.0 if name is None else 1.0])).item() == 0:
            return
        where = f"`{name}` is" if name is not None else "a parameter held by another process is"
        since = f"the last check found every parameter finite after step {self.checked[0]}" if self.checked[0] else (
            "no earlier check")
        raise NonFiniteParameters(
            f"{self.trainer}: after optimizer step {step} {where} not finite (NaN or inf; {since}): the optimizer "
            "wrote it from a finite gradient (a non-finite gradient is skipped before the step). Training stopped "
            f"before saving anything from this step (learning_rate={args.learning_rate}, weight_decay="
            f"{args.weight_decay}, adam_epsilon={args.adam_epsilon}, optim={getattr(args.optim, 'value', args.optim)}"
            "; or the optimizer passed to the trainer). The checkpoints saved before it are intact.")


__all__ = ["CHECK_EVERY", "DDP_TIMEOUT_RANGE", "MIN_ADAM_EPSILON", "NonFiniteParameters", "ParameterGuard",
           "check_ddp_timeout", "check_due", "check_optimizer_settings", "first_non_finite", "local_parameters",
           "maybe_non_finite"]
