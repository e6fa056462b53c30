"""What identifies a run (recorded in the manifest by `run_identity`), and the comparison of the run that wrote a
checkpoint with the one resuming it (`compare_runs`): a changed model, PEFT setup or reference schedule is refused,
every other changed setting is named."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from typing import Any

import torch
from torch import nn

from .layout import RunMismatch, ScheduleMismatch

#: RPGConfig fields recorded in the manifest, by what they decide. `model` (the base model's name, the PEFT type, a
#: fingerprint of the parameter names and shapes) and `rpg_reference` are refused when they differ; the rest warned.
IDENTITY_FIELDS = {
    "objective": ("rpg_divergence", "rpg_estimator", "beta", "rpg_dual_clip_c", "epsilon", "epsilon_high",
                  "loss_type", "importance_sampling_level", "scale_rewards", "reward_weights",
                  "rpg_reference_update_steps", "rpg_reference_kl_target", "rpg_reference_kl_decay",
                  "top_entropy_quantile", "mask_truncated_completions", "temperature", "max_completion_length"),
    "batch": ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
              "steps_per_generation", "num_iterations"),
    "schedule": ("learning_rate", "lr_scheduler_type", "warmup_steps", "warmup_ratio", "max_steps",
                 "num_train_epochs", "weight_decay", "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "seed"),
}
#: Settings the restored optimizer and scheduler keep from the checkpoint: a new value is ignored.
RESTORED_WITH_OPTIMIZER = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")


def _plain(value: Any) -> Any:
    """`value` as the manifest stores it (JSON), so a recorded and a current value compare alike."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def run_identity(args, model: nn.Module, zero_stage: int | None = None,
                 grad_scaler: bool | None = None) -> dict[str, Any]:
    """What identifies the run that writes or resumes a checkpoint: the model (base name, PEFT type, parameter
    fingerprint, how many parameter tensors of each dtype), the reference schedule, the DeepSpeed ZeRO stage
    (`zero_stage`; None without DeepSpeed), whether it has an fp16 gradient scaler (`grad_scaler`; None: unknown),
    and the objective, batch layout and schedule fields of `args`."""
    shapes = [f"{name}:{tuple(getattr(p, 'ds_shape', p.shape))}" for name, p in model.named_parameters()]
    peft = getattr(model, "peft_config", None)
    identity = {
        "model": {"name": getattr(getattr(model, "config", None), "_name_or_path", None),
                  "peft": sorted({str(getattr(c, "peft_type", c)).split(".")[-1] for c in peft.values()})
                  if isinstance(peft, dict) else None,
                  "parameters": hashlib.sha256("\n".join(shapes).encode()).hexdigest(), "tensors": len(shapes),
                  "dtypes": dict(sorted(Counter(str(p.dtype).removeprefix("torch.")
                                                for p in model.parameters()).items()))},
        "rpg_reference": args.rpg_reference,
        "deepspeed_zero_stage": None if zero_stage is None else int(zero_stage),
        "grad_scaler": grad_scaler,
    }
    for group, names in IDENTITY_FIELDS.items():
        identity[group] = {name: _plain(getattr(args, name, None)) for name in names}
    return identity


def compare_runs(directory: str, saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Compare the run that wrote `directory` with the one resuming it: raise `ScheduleMismatch` / `RunMismatch` for
    what cannot work; return a description of each other setting that differs (for a warning)."""
    if saved["rpg_reference"] != current["rpg_reference"]:
        raise ScheduleMismatch(
            f"{directory} was written with rpg_reference={saved['rpg_reference']!r}; this run has "
            f"rpg_reference={current['rpg_reference']!r}. The reference state of one schedule cannot continue "
            f"another: resume with rpg_reference={saved['rpg_reference']!r}, or start a new run from the saved model "
            "weights.")
    check_same_deepspeed_stage(directory, saved["deepspeed_zero_stage"], current["deepspeed_zero_stage"])
    old, new = saved["model"], current["model"]
    if bool(old["peft"]) != bool(new["peft"]):
        kind = {True: f"a PEFT ({', '.join(old['peft'] or new['peft'])}) adapter", False: "the full model"}
        raise RunMismatch(
            f"{directory} was written by a run that trains {kind[bool(old['peft'])]}; this run trains "
            f"{kind[bool(new['peft'])]} (peft_config {'given' if new['peft'] else 'not given'}). Its weights and "
            "optimizer state do not fit this model: resume with the same peft_config as the run that wrote it.")
    if old["parameters"] != new["parameters"]:
        raise RunMismatch(
            f"{directory} was written for another model: {old['tensors']} parameter tensors of model "
            f"{old['name']!r}, this run has {new['tensors']} of model {new['name']!r} (names or shapes differ). Its "
            "weights and optimizer state do not fit: resume with the model (and peft_config) that wrote it, or use "
            "another output_dir.")
    changes = []
    if old["name"] != new["name"]:
        changes.append(f"model {old['name']!r} -> {new['name']!r} (same parameter names and shapes)")
    if saved["deepspeed_zero_stage"] is None and old["dtypes"] != new["dtypes"]:  # ZeRO restores fp32 master weights
        changes.append(dtype_change(old["dtypes"], new["dtypes"]))
    for group in IDENTITY_FIELDS:
        for name, value in current[group].items():
            if name in saved[group] and saved[group][name] != value:
                effect = ("ignored: the optimizer and scheduler restored from the checkpoint keep the checkpoint's "
                          "value" if name in RESTORED_WITH_OPTIMIZER else f"the {group} changes from this step on")
                changes.append(f"{name} {saved[group][name]!r} -> {value!r} ({effect})")
    return changes


def _resolution(dtypes: dict[str, int]) -> float:
    """The coarsest spacing near 1 among the floating-point dtypes named (0 when none is one)."""
    return max((torch.finfo(getattr(torch, name)).eps for name in dtypes
                if isinstance(getattr(torch, name, None), torch.dtype) and getattr(torch, name).is_floating_point),
               default=0.0)


def dtype_change(old: dict[str, int], new: dict[str, int]) -> str:
    """A changed parameter dtype, said with what it does to the weights restored from the checkpoint."""
    before, after = "/".join(old), "/".join(new)
    if _resolution(new) > _resolution(old):
        effect = f"the restored weights are rounded to {after}; resume with dtype={before} to continue exactly"
    else:
        effect = f"the restored weights are converted to {after}; the run continues in another precision"
    return f"parameter dtypes {before} -> {after} ({effect})"


def check_same_deepspeed_stage(directory: str, saved: int | None, current: int | None) -> None:
    """Raise `RunMismatch` when the checkpoint was written under another DeepSpeed ZeRO stage (or with/without
    DeepSpeed): the optimizer state (under ZeRO-3 the weights too) is in DeepSpeed's partitioned files, which only
    DeepSpeed at the same stage reads; transformers would go on with a fresh optimizer and learning-rate schedule."""
    if saved == current:
        return
    step = os.path.basename(os.path.normpath(directory)).rsplit("-", 1)[-1]
    weights_alone = (f"or, to keep the weights alone, convert them with DeepSpeed's `python -m "
                     f"deepspeed.utils.zero_to_fp32 {directory} OUTPUT_DIR --safe_serialization` and start a new run "
                     "from OUTPUT_DIR (model=OUTPUT_DIR, without resume_from_checkpoint)")
    if current is None:
        raise RunMismatch(
            f"{directory} was written under DeepSpeed ZeRO-{saved}; this run does not use DeepSpeed. The optimizer "
            f"state{' and the weights' if saved == 3 else ''} are in DeepSpeed's files (global_step{step}/), which "
            "only DeepSpeed reads: this run would go on with a fresh optimizer and learning-rate schedule. Resume "
            f"under DeepSpeed ZeRO stage {saved} (e.g. accelerate launch --config_file "
            f"accelerate_configs/deepspeed_zero{saved}.yaml), {weights_alone}.")
    if saved is None:
        raise RunMismatch(
            f"{directory} was written without DeepSpeed; this run uses DeepSpeed ZeRO-{current}, which resumes only "
            "its own checkpoint files (global_stepN/, none here). Resume without DeepSpeed, or start a new run from "
            f"its weights (model={directory!r}, without resume_from_checkpoint).")
    raise RunMismatch(
        f"{directory} was written under DeepSpeed ZeRO-{saved}; this run uses DeepSpeed ZeRO-{current}. DeepSpeed "
        f"partitions the state of one stage differently from another's: resume under ZeRO stage {saved}, "
        f"{weights_alone}.")
