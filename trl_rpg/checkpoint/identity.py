"""What identifies a run (recorded in the manifest by `run_identity`), and the comparison of the run that wrote a
checkpoint with the one resuming it (`compare_runs`): a changed model, PEFT setup or reference schedule is refused,
every other changed setting is named."""

from __future__ import annotations

import hashlib
import json
from typing import Any

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


def run_identity(args, model: nn.Module) -> dict[str, Any]:
    """What identifies the run that writes or resumes a checkpoint: the model (base name, PEFT type, parameter
    fingerprint), the reference schedule, and the objective, batch layout and schedule fields of `args`."""
    shapes = [f"{name}:{tuple(getattr(p, 'ds_shape', p.shape))}" for name, p in model.named_parameters()]
    peft = getattr(model, "peft_config", None)
    identity = {
        "model": {"name": getattr(getattr(model, "config", None), "_name_or_path", None),
                  "peft": sorted({str(getattr(c, "peft_type", c)).split(".")[-1] for c in peft.values()})
                  if isinstance(peft, dict) else None,
                  "parameters": hashlib.sha256("\n".join(shapes).encode()).hexdigest(), "tensors": len(shapes)},
        "rpg_reference": args.rpg_reference,
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
    for group in IDENTITY_FIELDS:
        for name, value in current[group].items():
            if name in saved[group] and saved[group][name] != value:
                effect = ("ignored: the optimizer and scheduler restored from the checkpoint keep the checkpoint's "
                          "value" if name in RESTORED_WITH_OPTIMIZER else f"the {group} changes from this step on")
                changes.append(f"{name} {saved[group][name]!r} -> {value!r} ({effect})")
    return changes
