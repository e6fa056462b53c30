"""The reference policy pi_ref of an RPG run: which policy it is, its log-probs, and when it moves.

`rpg_reference` (RPGConfig) chooses it (docs/math.md section 4):

- `"sampling"`: the policy that sampled each generation batch. Its log-probs are the stored sampling log-probs, so
  there is no reference model and no extra forward pass (rho = 1); TRL is told `beta = 0` so it builds none.
- `"initial"`: the policy at the start of training, fixed. Full fine-tuning: TRL's reference model, which TRL
  loads from the model's path (`config._name_or_path`), made a copy of the model passed in (`start_at_policy`), so a
  model changed in memory before training (an SFT stage, merged adapters) is its own reference; where the path's
  model does not have the policy's parameters (resized embeddings), it cannot be, and the trainer warns that the
  reference is the model as saved at that path. PEFT with a `peft_config`: the model with the new adapter disabled
  (the base model, equal to the policy at the start while the adapter starts as the identity, as LoRA's default
  initialisation does; for any other `init_lora_weights` (False, PiSSA, OLoRA...) or PEFT method the trainer warns,
  as the reference is then the residual base, as in GRPO). A `PeftModel` passed in: the initial adapter, a frozen
  copy TRL adds as the adapter "ref".
- `"periodic"` / `"adaptive"`: pi_ref <- pi_theta every `rpg_reference_update_steps` optimizer steps, or when the
  moving average of the per-step divergence exceeds `rpg_reference_kl_target`. The copy lives in TRL's reference
  model (full fine-tuning) or in a frozen copy of the LoRA adapter named "ref" (PEFT: TRL's `sync_ref_model`
  refuses PEFT). Under ZeRO-3 the copy is made from gathered parameters a bounded group at a time
  (`copy_parameters`, `gather_to_cpu`, `scatter_from_cpu` at the end of this module: at most `ZERO3_GATHER_NUMEL`
  elements at once, for the update, the checkpoint snapshot and its restore).

The reference is a deterministic policy: every reference pass runs with every module in eval mode
(`without_dropout`: no `lora_dropout` of the "ref" adapter, no model dropout, whatever `disable_dropout` says), TRL's
own pass at generation included (`_compat.around_trl_reference_pass`); a full fine-tuning reference model is in eval
mode throughout (TRL loads it so and never trains it). The sampler's and the policy's log-probs are TRL's, in training
mode, as in GRPO (with dropout on, each is one dropout draw: docs/math.md section 4).

Every update bumps `version`. Generation batches are tagged with the version their reference log-probs were
computed with; a batch reused after an update recomputes them, once.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model
from torch import nn
from transformers import TrainerCallback

from .. import _compat
from ..run.checkpoint.layout import CheckpointError

#: Schedules whose reference moves during training (and is saved in checkpoints).
MOVING = ("periodic", "adaptive")
#: Name of the frozen adapter copy that holds a moving reference under PEFT.
REFERENCE_ADAPTER = "ref"
#: Key of the version tag in a generation batch.
VERSION_KEY = "rpg_ref_version"


@contextmanager
def without_dropout(model: nn.Module) -> Iterator[None]:
    """Within the block every module of `model` is in eval mode (no dropout of any kind: `nn.Dropout`, LoRA's
    `lora_dropout`, attention dropout read from `self.training`); each module's own mode is restored after."""
    training = [module for module in model.modules() if module.training]
    model.eval()
    try:
        yield
    finally:
        for module in training:
            module.training = True


#: `init_lora_weights` values with which a new LoRA adapter starts as the identity (B = 0, base weights unchanged).
IDENTITY_LORA_INITS = (True, "gaussian", "eva")


def initial_adapter_warning(model) -> str | None:
    """For `rpg_reference="initial"` with a `peft_config`: the reference is the model with the new adapter disabled,
    the policy at the start only while the adapter starts as the identity. A warning naming `init_lora_weights` where
    it does not (or the PEFT method, where RPG cannot tell), else None."""
    config = model.peft_config.get("default")
    init = getattr(config, "init_lora_weights", None)
    if config is None or init in IDENTITY_LORA_INITS:
        return None
    what = (f"init_lora_weights={init!r}: the adapter is not the identity at the start"
            if hasattr(config, "init_lora_weights")
            else f"a {type(config).__name__} adapter, not known to be the identity at the start")
    return (f"RPGTrainer: rpg_reference='initial' with a peft_config ({what}). The reference is the model with the "
            "adapter disabled (the base model; PiSSA's or OLoRA's residual), not the policy at the start of training, "
            "as in GRPOTrainer. To regularise towards the policy at the start, pass a PeftModel "
            "(get_peft_model(model, peft_config)) instead of peft_config, whose initial adapter is then copied as the "
            "reference, or use LoRA's default init_lora_weights=True.")


@dataclass
class AdaptiveTrigger:
    """The `"adaptive"` schedule's controller: an exponential moving average of the per-optimizer-step divergence.

    The divergence of one optimizer step is the token-weighted mean over its micro-batches (and processes); the
    average is `decay * average + (1 - decay) * step_divergence` (the first step initialises it), and the reference
    is due when the average exceeds `target`. An update restarts the average.
    """

    target: float
    decay: float
    average: float | None = None
    _window_sum: float = 0.0
    _window_tokens: float = 0.0

    def record(self, divergence_sum: float, tokens: float) -> None:
        """Add one micro-batch (summed over processes) to the current optimizer step."""
        self._window_sum += divergence_sum
        self._window_tokens += tokens

    def end_step(self) -> float:
        """Close the optimizer step: fold its divergence into the average; returns the average."""
        step = self._window_sum / max(self._window_tokens, 1.0)
        self.average = step if self.average is None else self.decay * self.average + (1 - self.decay) * step
        self._window_sum = self._window_tokens = 0.0
        return self.average

    @property
    def due(self) -> bool:
        return self.average is not None and self.average > self.target


class ReferencePolicy:
    """pi_ref of one `RPGTrainer`: its log-probs for a batch, its schedule, its update, its checkpointed state."""

    def __init__(self, trainer, schedule: str, update_steps: int | None = None, kl_target: float | None = None,
                 kl_decay: float = 0.9):
        self.trainer = trainer
        self.schedule = schedule
        self.update_steps = update_steps
        self.version = 0  # bumped at each update; buffered reference log-probs of an older version are recomputed
        self.updates = 0
        self.trigger = AdaptiveTrigger(kl_target, kl_decay) if schedule == "adaptive" else None
        if trainer.ref_model is not None and (warning := self.start_at_policy()):
            warnings.warn(warning, UserWarning, stacklevel=3)
        if schedule in MOVING:
            self._add_reference_adapter()
        elif (schedule == "initial" and trainer.ref_model is None and is_peft_model(self._policy)
              and REFERENCE_ADAPTER not in self._policy.peft_config
              and (warning := initial_adapter_warning(self._policy))):
            warnings.warn(warning, UserWarning, stacklevel=3)

    # -- which parameters hold it ---------------------------------------------------------------------------------

    @property
    def moving(self) -> bool:
        """Whether the reference moves during the run (its snapshot is part of a checkpoint)."""
        return self.schedule in MOVING

    @property
    def _policy(self) -> nn.Module:
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def start_at_policy(self) -> str | None:
        """pi_ref <- the policy passed in, once at construction (ZeRO-3-safe, as `update`). TRL's reference model is
        loaded from the model's path, not copied from the model object. Returns a warning where the path's model does
        not have the policy's parameters (the reference then stays the model as saved there), else None."""
        policy, reference = self._policy.named_parameters(), self.trainer.ref_model.named_parameters()
        policy = [(n, tuple(getattr(p, "ds_shape", p.shape)), p) for n, p in policy]
        reference = [(n, tuple(getattr(p, "ds_shape", p.shape)), p) for n, p in reference]
        if [(n, s) for n, s, _ in policy] == [(n, s) for n, s, _ in reference]:
            copy_parameters([p for _, _, p in policy], [p for _, _, p in reference])
            return None
        differ = next((f"{a[0]} {a[1]} vs {b[0]} {b[1]}" for a, b in zip(policy, reference) if a[:2] != b[:2]),
                      f"{len(policy)} vs {len(reference)} parameters")
        path = getattr(self._policy.config, "_name_or_path", None)
        return (f"RPGTrainer: the {self.schedule!r} reference is the model as saved at {path!r}, not the model passed "
                f"in: TRL loads its reference model from that path, and its parameters differ from the policy's "
                f"({differ}), so it cannot be made a copy of the policy. The KL term regularises towards the saved "
                "model. To regularise towards the model as it is now, save it (`model.save_pretrained(path)`) and "
                "pass that path, or use rpg_reference='sampling'.")

    def _add_reference_adapter(self) -> None:
        """With PEFT, a moving reference is a frozen copy of the adapter, not a second model."""
        model = self._policy
        if not is_peft_model(model):
            return
        if REFERENCE_ADAPTER not in model.peft_config:  # TRL adds it itself for a PeftModel passed in with beta > 0
            model.add_adapter(REFERENCE_ADAPTER, model.peft_config["default"])
        trained, frozen = self._adapter_pairs()
        for source, param in zip(trained, frozen):
            # the trained adapter's dtype: the base's under ZeRO-3 (TRL's #6089 fix), PEFT's float32 otherwise
            param.data = param.data.to(source.dtype)
            param.requires_grad_(False)
        copy_parameters(trained, frozen)

    def _adapter_pairs(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        named = dict(self._policy.named_parameters())
        pairs = [(p, named[n.replace(".default.", f".{REFERENCE_ADAPTER}.")]) for n, p in named.items()
                 if ".default." in n and n.replace(".default.", f".{REFERENCE_ADAPTER}.") in named]
        return [s for s, _ in pairs], [t for _, t in pairs]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters that hold a moving reference: the reference model's, or the "ref" adapter's."""
        if self.trainer.ref_model is not None:
            return list(self.trainer.ref_model.named_parameters())
        named = dict(self._policy.named_parameters())
        return [(n, p) for n, p in named.items() if f".{REFERENCE_ADAPTER}." in n]

    # -- log-probs --------------------------------------------------------------------------------------------------

    def tag(self, batch: dict) -> dict:
        """Record in a generation batch which reference version its `ref_per_token_logps` (if any) belong to."""
        batch[VERSION_KEY] = torch.tensor(self.version)
        return batch

    def logps(self, inputs: dict, logits_to_keep: int) -> torch.Tensor:
        """Reference log-probs of a micro-batch: the stored ones, or recomputed (and stored in the batch, so a
        reused batch recomputes at most once per update) when the reference changed since they were computed."""
        version = inputs.get(VERSION_KEY)
        if "ref_per_token_logps" in inputs and version is not None and int(version) == self.version:
            return inputs["ref_per_token_logps"]
        trainer = self.trainer
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        kwargs = {k: inputs[k] for k in _compat.MULTIMODAL_KEYS if k in inputs}
        batch_size = input_ids.size(0)
        with torch.no_grad(), _compat.disable_gradient_checkpointing(trainer.model,
                                                                      trainer.args.gradient_checkpointing_kwargs):
            if trainer.ref_model is not None:
                ref, _, _ = trainer._get_per_token_logps_and_entropies(  # in eval mode, as TRL loads it
                    trainer.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs)
            else:  # PEFT: the "ref" adapter (moving, or a PeftModel's initial adapter), or the adapter disabled
                policy = self._policy
                adapter = REFERENCE_ADAPTER if REFERENCE_ADAPTER in policy.peft_config else None
                with _compat.use_adapter(policy, adapter_name=adapter), without_dropout(policy):
                    ref, _, _ = trainer._get_per_token_logps_and_entropies(
                        trainer.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs)
        inputs["ref_per_token_logps"] = ref
        self.tag(inputs)
        return ref

    # -- schedule ---------------------------------------------------------------------------------------------------

    def record_divergence(self, divergence_sum: float, tokens: float) -> None:
        """Feed one training micro-batch's divergence (summed over processes) to the adaptive trigger."""
        if self.trigger is not None:
            self.trigger.record(divergence_sum, tokens)

    def end_step(self) -> float | None:
        """Close an optimizer step; returns the adaptive moving average (None for other schedules)."""
        return self.trigger.end_step() if self.trigger is not None else None

    def due(self, global_step: int) -> bool:
        """Whether pi_ref <- pi_theta is due after optimizer step `global_step`."""
        if self.schedule == "periodic":
            return global_step % self.update_steps == 0
        return self.trigger is not None and self.trigger.due

    def update(self) -> None:
        """pi_ref <- pi_theta (paper section 5, "iterative reference updates"); ZeRO-3-safe."""
        if self.trainer.ref_model is not None:
            copy_parameters(self._policy.parameters(), self.trainer.ref_model.parameters())
        elif is_peft_model(self._policy):
            copy_parameters(*self._adapter_pairs())
        else:  # pragma: no cover - RPGConfig requires beta > 0 for a non-sampling reference
            raise RuntimeError("No reference to update: rpg_reference needs beta > 0.")
        self.version += 1
        self.updates += 1
        if self.trigger is not None:
            self.trigger.average = None

    # -- checkpoints ------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"reference_version": self.version, "reference_updates": self.updates,
                "kl_ema": self.trigger.average if self.trigger is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["reference_version"])
        self.updates = int(state["reference_updates"])
        if self.trigger is not None:
            self.trigger.average = state["kl_ema"]

    def snapshot(self, keep: bool) -> dict[str, torch.Tensor] | None:
        """Full CPU copies of a moving reference's parameters (a collective call under ZeRO-3; None where not
        `keep`)."""
        named = self.named_parameters()
        tensors = gather_to_cpu([p for _, p in named], keep=keep)
        return dict(zip([n for n, _ in named], tensors)) if keep else None

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        named = self.named_parameters()
        missing = [n for n, _ in named if n not in tensors]
        if missing or len(tensors) != len(named):
            raise CheckpointError(f"The reference snapshot does not match the reference ({len(tensors)} tensors for "
                                  f"{len(named)} parameters; first missing: {missing[:3]}); was the checkpoint "
                                  "written with another model or PEFT config?")
        scatter_from_cpu([p for _, p in named], [tensors[n] for n, _ in named])


class ReferenceSchedule(TrainerCallback):
    """pi_ref <- pi_theta after the optimizer steps where the "periodic" / "adaptive" schedule says so."""

    def __init__(self, reference: ReferencePolicy):
        self.reference = reference

    def on_step_end(self, args, state, control, **kwargs):
        if self.reference.due(state.global_step):
            self.reference.update()
        return control


# ----------------------------------------------------------------------------------------------------------------
# ZeRO-3: gather, copy and scatter partitioned parameters a bounded group at a time
# ----------------------------------------------------------------------------------------------------------------

#: Elements gathered at once when ZeRO-3 parameters are copied, saved or restored: the transient full-size memory
#: of a reference update or a checkpoint is bounded by this, not by the size of the model.
ZERO3_GATHER_NUMEL = 50_000_000


def _is_zero3(p) -> bool:
    return hasattr(p, "ds_id")


def _full_numel(p) -> int:
    return p.ds_numel if _is_zero3(p) else p.numel()


def _groups(items, numel):
    """Consecutive groups of `items` holding at most ZERO3_GATHER_NUMEL elements (at least one item each)."""
    group, size = [], 0
    for item in items:
        n = numel(item)
        if group and size + n > ZERO3_GATHER_NUMEL:
            yield group
            group, size = [], 0
        group.append(item)
        size += n
    if group:
        yield group


def copy_parameters(source: Iterable[nn.Parameter], target: Iterable[nn.Parameter]) -> None:
    """target <- source, parameter by parameter. ZeRO-3: gathered a bounded group at a time (a collective call),
    copied on rank 0 and re-partitioned from it."""
    pairs = list(zip(source, target, strict=True))
    if not any(_is_zero3(p) for pair in pairs for p in pair):
        with torch.no_grad():
            for s, t in pairs:
                t.data.copy_(s.data)
        return
    import deepspeed

    rank0 = deepspeed.comm.get_rank() == 0
    for group in _groups(pairs, lambda pair: _full_numel(pair[0]) + _full_numel(pair[1])):
        with deepspeed.zero.GatheredParameters([p for pair in group for p in pair], modifier_rank=0), \
                torch.no_grad():
            for s, t in group:
                if rank0 or not _is_zero3(t):
                    t.data.copy_(s.data)


def gather_to_cpu(params: Sequence[nn.Parameter], keep: bool = True) -> list[torch.Tensor] | None:
    """Full CPU copies of `params`, or None where `keep` is False. ZeRO-3 parameters are gathered a bounded group at
    a time, on every rank (a collective call); only ranks that keep the result copy it to the CPU."""
    if not any(_is_zero3(p) for p in params):
        return [p.data.detach().cpu().clone() for p in params] if keep else None
    import deepspeed

    tensors = []
    for group in _groups(params, _full_numel):
        with deepspeed.zero.GatheredParameters(group):
            if keep:
                tensors.extend(p.data.detach().cpu().clone() for p in group)
    return tensors if keep else None


def scatter_from_cpu(params: Sequence[nn.Parameter], tensors: Sequence[torch.Tensor]) -> None:
    """params <- tensors (full CPU copies), re-partitioned under ZeRO-3."""
    if len(params) != len(tensors):
        raise CheckpointError(f"The reference snapshot has {len(tensors)} tensors but the reference has "
                              f"{len(params)} parameters; was the checkpoint written with another model or PEFT "
                              "config?")
    for p, t in zip(params, tensors):
        if math.prod(t.shape) != _full_numel(p):
            raise CheckpointError(f"A reference snapshot tensor of shape {tuple(t.shape)} does not fit a parameter "
                                  f"of {_full_numel(p)} elements; was the checkpoint written with another model?")
    if not any(_is_zero3(p) for p in params):
        with torch.no_grad():
            for p, t in zip(params, tensors):
                p.data.copy_(t.to(p.device, p.dtype))
        return
    import deepspeed

    rank0 = deepspeed.comm.get_rank() == 0
    for group in _groups(list(zip(params, tensors)), lambda pair: _full_numel(pair[0])):
        with deepspeed.zero.GatheredParameters([p for p, _ in group], modifier_rank=0), torch.no_grad():
            for p, t in group:
                if rank0 or not _is_zero3(p):
                    p.data.copy_(t.to(p.device, p.dtype))


__all__ = ["IDENTITY_LORA_INITS", "MOVING", "VERSION_KEY", "ZERO3_GATHER_NUMEL", "AdaptiveTrigger", "ReferencePolicy",
           "ReferenceSchedule", "initial_adapter_warning", "without_dropout",
           "copy_parameters", "gather_to_cpu", "scatter_from_cpu"]
