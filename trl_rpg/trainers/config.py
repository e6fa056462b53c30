"""`RPGConfig`: `GRPOConfig` plus the RPG fields, with the paper's defaults."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

from trl import GRPOConfig

from .. import _compat
from ..objectives.config_fields import (  # noqa: F401  (MIN_CLIP_WIDTH, PAPER_CLIP_WIDTHS: importable from here as before)
    MIN_CLIP_WIDTH,
    PAPER_CLIP_WIDTHS,
    beta_field,
    check_objective,
    divergence_field,
    dual_clip_field,
    epsilon_field,
    epsilon_high_field,
    estimator_field,
    resolve_clip_widths,
)
from ..objectives.config_fields import config_field as _field
from ..objectives.config_fields import finite as _finite
from ..run import hub_uploads
from ..run.parameter_guard import check_optimizer_settings
from .describe import (
    beta_too_small_warning,
    ignored_fields_warning,
    inert_kl_warning,
    kl_term_is_inert,
    truncated_sampling_warning,
)
from .sampler_logps import MODES as SAMPLER_LOGPS_MODES
from .sampler_logps import check_config as check_sampler_logps

REFERENCE_MODES = ("sampling", "initial", "periodic", "adaptive")
#: GRPO loss types that keep their aggregation meaning under RPG (the per-token loss itself is RPG's).
AGGREGATION_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
DYNAMIC_SAMPLING_ON_EXHAUSTED = ("train", "raise")


@dataclass
class RPGConfig(GRPOConfig):
    r"""
    Configuration for [`RPGTrainer`]: every [`~trl.GRPOConfig`] field, plus the RPG fields below.

    RPG (Zhang et al., "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning", ICLR 2026)
    replaces GRPO's KL penalty and importance weighting with surrogate losses whose gradient is exactly that of
    `E_pi[A] - beta * D` off-policy. Defaults follow the paper (its section 5 and Appendix H):

    - `rpg_divergence="urkl"`, `rpg_estimator="reinforce"`: RPG-REINFORCE with the unnormalised reverse KL, one of
      the paper's two best methods (Table 3).
    - `beta=1e-4`: the paper's KL coefficient (GRPOConfig's default is 0.0).
    - `epsilon=0.2`, `epsilon_high=0.28`, `rpg_dual_clip_c=10.0`: RPG-Style Clip with the paper's trust region and
      the dual-clip bound of the released scripts. As in `GRPOConfig`, setting only `epsilon` gives the symmetric
      region `(epsilon, epsilon)`; the paper's clip-higher 0.28 applies when neither width is set. Both widths must
      be > 0 (with 0, `w = 1` lies on the clip boundary and on-policy tokens get no gradient).
    - `scale_rewards="none"`: the advantage is `R - mean(group)` with no std scaling, the paper's baseline.
    - `loss_type="dapo"`: token-mean aggregation over the accumulated batch, as in the paper (DAPO's token-mean).
    - `rpg_reference="sampling"`: the reference is the policy that sampled each generation batch, whose log-probs
      are already stored, so no reference model is kept in memory and no extra forward pass is made.
    - Batch reuse: unless `steps_per_generation` or `generation_batch_size` is set or `num_iterations > 1`, each
      generation batch is reused for `rpg_generation_reuse` (default 4) optimizer steps (`num_iterations=1`, GRPO's
      default, keeps it). With the reference equal to the sampler, w = 1 on-policy and the KL gradient vanishes;
      the regulariser and the clip act only on reused, off-policy batches (docs/math.md section 2). The paper reuses
      each rollout batch for 16 optimizer steps.

    `use_bias_correction_kl` (GRPO's weighting of its k3 penalty by w) is ignored: RPG's KL term is exact off-policy
    by construction. Every other field keeps `GRPOConfig`'s default, including `bf16=True`: on a machine without a
    GPU pass `use_cpu=True, bf16=False` (CLI: `--use_cpu True --bf16 False`).

    Parameters:
        > Parameters that control the RPG objective

        rpg_divergence (`str`, *optional*, defaults to `"urkl"`):
            Divergence regularising the policy: `"fkl"` KL(ref || pi), `"rkl"` KL(pi || ref), `"ufkl"` and `"urkl"`
            their unnormalised forms, or a name added with `trl_rpg.objectives.per_token.register_divergence`.
        rpg_estimator (`str`, *optional*, defaults to `"reinforce"`):
            `"reinforce"`: stop-gradient surrogate `-SG(weight) * logp` (RPG-REINFORCE); `"differentiable"`: the
            fully differentiable surrogate (the paper's "RPG" runs).
        rpg_dual_clip_c (`float` or `None`, *optional*, defaults to `10.0`):
            Dual-clip bound `c > 1`: tokens with negative (effective) advantage and `w >= c` get no gradient. `None`
            disables the bound. The trust region itself is `[1 - epsilon, 1 + epsilon_high]`.

        > Parameters that control the reference policy

        rpg_reference (`str`, *optional*, defaults to `"sampling"`):
            `"sampling"`: the sampling policy of each generation batch (no reference model). `"initial"`: the
            policy at the start of training, fixed (full fine-tuning: a copy of the model passed in, not the model
            TRL reloads from its path; with a `peft_config`: the base model with the new adapter disabled, the policy
            at the start while the adapter starts as the identity, a warning otherwise (`init_lora_weights=False`,
            PiSSA, OLoRA); a `PeftModel` passed in: a frozen copy of its initial adapter). `"periodic"`:
            `pi_ref <- pi_theta` every `rpg_reference_update_steps` optimizer steps. `"adaptive"`: `pi_ref <- pi_theta`
            when a moving average of the token-level divergence exceeds `rpg_reference_kl_target`.
        rpg_reference_update_steps (`int` or `None`, *optional*):
            Optimizer steps between reference updates; required by, and only valid with, `"periodic"`.
        rpg_reference_kl_target (`float` or `None`, *optional*):
            Divergence target kappa; required by, and only valid with, `"adaptive"`.
        rpg_reference_kl_decay (`float`, *optional*, defaults to `0.9`):
            Decay of the exponential moving average of the per-step divergence used by `"adaptive"`.
        rpg_sampler_logps (`str`, *optional*, defaults to `"auto"`):
            Where the sampler's log-probs mu come from under vLLM generation: `"engine"` (the engine's own: no
            recomputation pass; the `vllm_importance_sampling_*` fields have no effect), `"recompute"` (the trainer
            recomputes them; TRL's correction applies), `"auto"`: `"engine"` where it is exact (docs/math.md 4b).

        > Parameters that control batch reuse and checkpoints

        rpg_generation_reuse (`int`, *optional*, defaults to `4`):
            Optimizer steps per generation batch when neither `steps_per_generation`, `generation_batch_size` nor
            `num_iterations > 1` is given (sets `steps_per_generation = rpg_generation_reuse *
            gradient_accumulation_steps`).
        rpg_save_generation_buffer (`bool`, *optional*, defaults to `True`):
            Save the buffered generation batch in each checkpoint, so a run resumed inside a reused batch continues
            exactly (TRL otherwise regenerates it and the run diverges).
        rpg_reward_timeout (`float` or `None`, *optional*, defaults to `None`):
            Seconds one call of a reward function may take; a call that has not returned by then stops training with
            a `TimeoutError` naming the function. `None` (the default, as in TRL) sets no limit: no one limit fits
            every reward (a code sandbox or a remote judge can legitimately take minutes per batch), and with a limit
            a synchronous function runs in a worker thread (`trl_rpg.run.reward_calls.checked_reward_function`).
        rpg_hub_upload_timeout (`float` or `None`, *optional*, defaults to `3600`):
            Seconds the end of training (and `push_to_hub()`, before its own upload) waits for the Hub uploads still
            running (`push_to_hub=True`); then `train()` raises `trl_rpg.run.hub_uploads.HubUploadError` naming them.
            `None`: no bound, as in transformers (`trl_rpg.run.hub_uploads`).
        rpg_require_learning_signal (`bool`, *optional*, defaults to `False`):
            What `train()` does when the run trained on nothing (no optimizer step, no scored reward, or no step with
            a learning signal: `trl_rpg.run.learning_signal`). `False`: it returns, as `GRPOTrainer.train()` does, with
            the verdict as a warning at the end and in the returned metrics (`rpg/trained_on_nothing`,
            `rpg/trained_on_nothing_reason`). `True`: it saves the final model to `output_dir` (whatever
            `save_strategy`) and raises `trl_rpg.run.learning_signal.NoLearningSignal` saying so. `trl-rpg train` sets
            it to `True`.

        > Parameters that control dynamic sampling (DAPO)

        dynamic_sampling (`bool`, *optional*, defaults to `False`):
            Drop groups whose rewards have zero variance (up to float rounding; binary or not: the filter reads the
            variance, not the mean) and generate more prompts until the generation batch again holds
            `generation_batch_size / num_generations` groups; the batch then trains (and is reused) as usual. Extra
            prompts come from a seeded stream over the training set whose position is saved in `trainer_state.json`.
            Logged under `dynamic_sampling/`: `rounds`, `groups_generated`, `groups_kept`, `frac_filtered`,
            `groups_trained_without_signal`, `exhausted`, `exhausted_total`. Not supported with multimodal inputs.
        dynamic_sampling_max_rounds (`int`, *optional*, defaults to `8`):
            Generation rounds allowed per training batch, the first one included.
        dynamic_sampling_on_exhausted (`str`, *optional*, defaults to `"train"`):
            What happens when the rounds run out before the batch is full: `"train"` trains on every group kept,
            topped up with the earliest dropped groups, in generation order (every dropped group has the same reward
            spread, zero, and advantages zero: no policy-gradient signal, though their tokens still count in the loss
            normalisation and the KL term), logs it and warns; `"raise"` stops with a `RuntimeError` on every
            process.
        dynamic_sampling_metric (`str` or `None`, *optional*, defaults to `None`):
            Whose reward spread decides whether a group is kept: the name of one reward function (as in
            `trainer.reward_func_names`), or `None` for the weighted total of all reward functions (the same when
            there is one reward function). DAPO and the paper filter on accuracy: with an accuracy reward plus a
            length penalty, set it to the accuracy reward (e.g. `"math_reward"`), or groups that are all wrong but
            differ in length penalty are kept and train on the length penalty alone. The trainer cannot tell which
            function measures accuracy, hence the default. On the command line, `None` (or `none`) means None.
    """

    # ---- GRPOConfig fields whose defaults change (the paper's setup) ----
    beta: float = beta_field()
    epsilon: float | None = epsilon_field()
    epsilon_high: float | None = epsilon_high_field()
    scale_rewards: str = _field(
        "none",
        "Reward scaling: 'none' (RPG default: advantage = reward - group mean), 'group' or 'batch' (divide by the "
        "std).",
    )
    loss_type: str = _field(
        "dapo",
        "Aggregation of RPG's per-token loss: 'dapo' (default, token-mean over the accumulated batch), 'bnpo' "
        "(token-mean over the local batch), 'grpo' (sequence-mean), 'dr_grpo' (sum / max_completion_length). GRPO's "
        "other loss types have no meaning under RPG.",
    )

    # ---- RPG objective ----
    rpg_divergence: str = divergence_field()
    rpg_estimator: str = estimator_field()
    rpg_dual_clip_c: float | None = dual_clip_field()

    # ---- Reference policy ----
    rpg_reference: str = _field(
        "sampling",
        "Reference policy: 'sampling' (the sampler of each generation batch; no reference model), 'initial' (the "
        "policy at the start of training, fixed; with a peft_config the base model, adapter disabled), "
        "'periodic' (updated every rpg_reference_update_steps), 'adaptive' (updated when the divergence average "
        "exceeds rpg_reference_kl_target).",
        choices=list(REFERENCE_MODES),
    )
    rpg_reference_update_steps: int | None = _field(
        None,
        "Optimizer steps between reference updates (rpg_reference='periodic' only).",
    )
    rpg_reference_kl_target: float | None = _field(
        None,
        "Divergence target that triggers a reference update (rpg_reference='adaptive' only).",
    )
    rpg_reference_kl_decay: float = _field(
        0.9,
        "Decay of the moving average of the divergence used by rpg_reference='adaptive'.",
    )
    rpg_sampler_logps: str = _field(
        "auto",
        "Sampler log-probs mu under vLLM: 'engine' (vLLM's own; no recomputation pass, vllm_importance_sampling_* "
        "have no effect), 'recompute' (the trainer's; TRL's correction applies), 'auto' ('engine' where exact).",
        choices=list(SAMPLER_LOGPS_MODES),
    )

    # ---- Batch reuse and checkpoints ----
    rpg_generation_reuse: int = _field(
        4,
        "Optimizer steps per generation batch when steps_per_generation and generation_batch_size are left unset and "
        "num_iterations is 1.",
    )
    rpg_save_generation_buffer: bool = _field(
        True,
        "Save the buffered generation batch in checkpoints so resuming inside a reused batch is exact.",
    )
    rpg_reward_timeout: float | None = _field(
        None,
        "Seconds one reward-function call may take before training stops with a TimeoutError naming it; None (the "
        "default, as in TRL): no limit.",
    )
    rpg_hub_upload_timeout: float | None = _field(3600.0, hub_uploads.TIMEOUT_HELP)
    rpg_require_learning_signal: bool = _field(
        False,
        "A run that trained on nothing (no step with a learning signal): False (default, as GRPOTrainer) returns "
        "from train() with a warning and the verdict in its metrics; True saves the final model to output_dir and "
        "raises NoLearningSignal. trl-rpg train sets it to True.",
    )

    # ---- Dynamic sampling (DAPO) ----
    dynamic_sampling: bool = _field(
        False,
        "Drop zero-reward-variance groups and generate more prompts until the batch is full.",
    )
    dynamic_sampling_max_rounds: int = _field(
        8,
        "Generation rounds allowed per training batch when dynamic_sampling is on.",
    )
    dynamic_sampling_on_exhausted: str = _field(
        "train",
        "When the rounds run out: 'train' (fill with the earliest dropped groups and log it) or 'raise'.",
        choices=list(DYNAMIC_SAMPLING_ON_EXHAUSTED),
    )
    dynamic_sampling_metric: str | None = _field(
        None,
        "Whose reward spread decides if a group is kept: the name of one reward function (e.g. 'math_reward', as in "
        "DAPO and the paper: filter on accuracy) or None (default) for the weighted total of all reward functions.",
    )

    def __post_init__(self):
        if self.dynamic_sampling_metric in ("None", "none"):  # `--dynamic_sampling_metric None` arrives as text
            self.dynamic_sampling_metric = None
        self.epsilon, self.epsilon_high = resolve_clip_widths(self.epsilon, self.epsilon_high)
        self._validate_rpg()
        if (
            self.steps_per_generation is None
            and self.generation_batch_size is None
            and self.num_iterations == 1
        ):
            self.steps_per_generation = self.rpg_generation_reuse * self.gradient_accumulation_steps
        _check_generation_batch(self)  # before TRL's own check, whose message names a number the user never set
        _compat.checkpointing_at_trl_default(self)  # TRL's default under transformers' current name: no warning
        super().__post_init__()
        if kl_term_is_inert(self):
            warnings.warn(inert_kl_warning(self), UserWarning, stacklevel=3)
        if too_small := beta_too_small_warning(self):
            warnings.warn(too_small, UserWarning, stacklevel=3)
        if truncated_sampling_warning(self):
            warnings.warn(truncated_sampling_warning(self), UserWarning, stacklevel=3)
        if ignored := ignored_fields_warning(self):
            warnings.warn(ignored, UserWarning, stacklevel=3)

    def _validate_rpg(self):
        def bad(name, value, allowed):
            raise ValueError(f"RPGConfig: `{name}`={value!r} is not allowed; {allowed}.")

        check_objective(self, "RPGConfig")
        if self.rpg_reference not in REFERENCE_MODES:
            bad("rpg_reference", self.rpg_reference, f"choose one of {list(REFERENCE_MODES)}")
        if self.loss_type not in AGGREGATION_LOSS_TYPES:
            bad("loss_type", self.loss_type,
                f"RPG defines its own per-token loss; `loss_type` only selects the aggregation, one of "
                f"{list(AGGREGATION_LOSS_TYPES)} (use GRPOTrainer for '{self.loss_type}')")

        ref = self.rpg_reference
        if ref != "sampling" and self.beta == 0:
            bad("rpg_reference", ref, "a reference other than 'sampling' needs `beta` > 0 (with beta=0 the "
                                      "reference is never used)")
        if ref == "periodic":
            if self.rpg_reference_update_steps is None or not _positive_int(self.rpg_reference_update_steps):
                bad("rpg_reference_update_steps", self.rpg_reference_update_steps,
                    "rpg_reference='periodic' needs an integer >= 1")
        elif self.rpg_reference_update_steps is not None:
            bad("rpg_reference_update_steps", self.rpg_reference_update_steps,
                f"it is only used with rpg_reference='periodic' (got rpg_reference={ref!r})")
        if ref == "adaptive":
            target = self.rpg_reference_kl_target
            if target is None or not _finite(target) or target <= 0:
                bad("rpg_reference_kl_target", target, "rpg_reference='adaptive' needs a number > 0")
        elif self.rpg_reference_kl_target is not None:
            bad("rpg_reference_kl_target", self.rpg_reference_kl_target,
                f"it is only used with rpg_reference='adaptive' (got rpg_reference={ref!r})")
        if not _finite(self.rpg_reference_kl_decay) or not 0 <= self.rpg_reference_kl_decay < 1:
            bad("rpg_reference_kl_decay", self.rpg_reference_kl_decay, "it must be in [0, 1)")
        if not _positive_int(self.per_device_train_batch_size):
            bad("per_device_train_batch_size", self.per_device_train_batch_size, "it must be an integer >= 1")
        if not _positive_int(self.rpg_generation_reuse):
            bad("rpg_generation_reuse", self.rpg_generation_reuse, "it must be an integer >= 1")
        if self.rpg_hub_upload_timeout is not None and (not _finite(self.rpg_hub_upload_timeout)
                                                        or self.rpg_hub_upload_timeout <= 0):
            bad("rpg_hub_upload_timeout", self.rpg_hub_upload_timeout, "it must be a number of seconds > 0, or None")
        if not _positive_int(self.dynamic_sampling_max_rounds):
            bad("dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds, "it must be an integer >= 1")
        if self.dynamic_sampling_metric is not None and (
                not isinstance(self.dynamic_sampling_metric, str) or not self.dynamic_sampling_metric):
            bad("dynamic_sampling_metric", self.dynamic_sampling_metric,
                "use the name of a reward function, or None for the weighted total of all reward functions")
        if self.dynamic_sampling_on_exhausted not in DYNAMIC_SAMPLING_ON_EXHAUSTED:
            bad("dynamic_sampling_on_exhausted", self.dynamic_sampling_on_exhausted,
                f"choose one of {list(DYNAMIC_SAMPLING_ON_EXHAUSTED)}")

        if self.max_steps <= 0 and not (_finite(self.num_train_epochs) and self.num_train_epochs > 0):
            bad("num_train_epochs", self.num_train_epochs,
                f"with max_steps={self.max_steps} the run would train nothing; set num_train_epochs > 0 or "
                "max_steps >= 1")
        if self.max_steps == 0:  # transformers counts 0 as a step limit (only a negative one means "epochs")
            bad("max_steps", 0, "it must be an integer >= 1, or -1 (train num_train_epochs epochs): with 0, "
                                "transformers takes one optimizer step, at learning rate 0")
        check_optimizer_settings(self)

        # GRPO settings RPG cannot honour
        if self.sync_ref_model:
            bad("sync_ref_model", True, "use rpg_reference='periodic' with rpg_reference_update_steps (works with "
                                        "PEFT and ZeRO-3 too)")
        if self.delta is not None:
            bad("delta", self.delta, "two-sided clipping is GRPO's; RPG bounds large ratios with rpg_dual_clip_c")
        if self.importance_sampling_level not in ("token", "sequence"):
            bad("importance_sampling_level", self.importance_sampling_level, "choose 'token' or 'sequence'")
        check_sampler_logps(self)

    @classmethod
    def from_grpo_config(cls, args: GRPOConfig) -> RPGConfig:
        """Upgrade a `GRPOConfig` to an `RPGConfig`: GRPO fields keep their values, RPG fields get RPG defaults.

        `steps_per_generation` is kept as GRPO resolved it (and `generation_batch_size` re-derived from it), so the
        batch layout of the GRPO script is unchanged. With `beta > 0` the reference is `"initial"`: GRPO's `beta`
        regularises towards the initial model (here: the model passed in; with a `peft_config` the base model with
        the adapter disabled, with a `PeftModel` its initial adapter), and with GRPO's on-policy
        layout RPG's default reference (the sampler) would make the KL term vanish.
        """
        if isinstance(args, cls):
            return args
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
        values["generation_batch_size"] = None
        if values["beta"] > 0:
            values["rpg_reference"] = "initial"
        # GRPO's meaning of epsilon_high=None (symmetric trust region) is kept
        if values.get("epsilon_high") is None:
            values["epsilon_high"] = values["epsilon"]
        return cls(**values)


def as_rpg_config(args, model) -> RPGConfig:
    """The `RPGConfig` a trainer runs with: `args` itself, a `GRPOConfig` upgraded (GRPO fields keep their values,
    RPG fields get RPG defaults), or, for `args=None`, defaults with an output directory named after the model."""
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model") or "model"
        return RPGConfig(f"{str(name).rstrip('/').split('/')[-1]}-RPG")
    if isinstance(args, RPGConfig):
        check_optimizer_settings(args)  # again: a field may have been changed since the config was built
        return args
    if not isinstance(args, GRPOConfig):
        raise ValueError(f"`args` must be an RPGConfig or a GRPOConfig, got {type(args).__name__}.")
    return RPGConfig.from_grpo_config(args)


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _expected_num_processes() -> int:
    """The process count TRL's check will use (`TrainingArguments.world_size`), known before the arguments set up the
    devices: an accelerate state already in place, else the launcher's `WORLD_SIZE`, else 1."""
    import os

    from accelerate.state import PartialState

    if PartialState._shared_state:
        return PartialState().num_processes
    return int(os.environ.get("WORLD_SIZE", "1"))


def _check_generation_batch(args) -> None:
    """Refuse a generation batch that does not hold whole prompt groups, as `GRPOConfig.__post_init__` would, but
    say where its size comes from and what to change: TRL computes it as `per_device_train_batch_size x
    steps_per_generation x processes`, and RPG sets `steps_per_generation = rpg_generation_reuse x
    gradient_accumulation_steps` by default. A `generation_batch_size` the user set is left to TRL's own message."""
    if args.generation_batch_size is not None or not _positive_int(args.num_generations):
        return
    processes = _expected_num_processes()
    accumulation = args.gradient_accumulation_steps
    per_device, steps, groups = args.per_device_train_batch_size, args.steps_per_generation, args.num_generations
    if steps is None:  # num_iterations > 1: TRL's default
        steps = accumulation
        steps_text = (f"steps_per_generation {steps} (= gradient_accumulation_steps, TRL's default when "
                      "num_iterations > 1)")
    elif args.num_iterations == 1 and steps == args.rpg_generation_reuse * accumulation:
        steps_text = (f"steps_per_generation {steps} (= rpg_generation_reuse {args.rpg_generation_reuse} x "
                      f"gradient_accumulation_steps {accumulation})")
    else:
        steps_text = f"steps_per_generation {steps}"
    batch = per_device * steps * processes
    if batch % groups == 0:
        return
    small = [d for d in range(2, min(math.isqrt(batch), 10**6) + 1) if batch % d == 0]  # never a loop to `batch`
    divisors = sorted({*small, *(batch // d for d in small), batch})[:6]
    per_device_step = groups // math.gcd(groups, steps * processes)
    fixes = [f"per_device_train_batch_size to a multiple of {per_device_step}"]
    if divisors:
        fixes.append(f"num_generations to a divisor of {batch} ({', '.join(map(str, divisors))})")
    if args.num_iterations == 1 and steps == args.rpg_generation_reuse * accumulation:
        reuse_step = groups // math.gcd(groups, per_device * accumulation * processes)
        fixes.append(f"rpg_generation_reuse to a multiple of {reuse_step}")
    raise ValueError(
        f"RPGConfig: the generation batch of {batch} completions = per_device_train_batch_size {per_device} x "
        f"{steps_text} x {processes} process(es) is not a multiple of num_generations ({groups}), so it cannot hold "
        f"whole groups of {groups} completions per prompt (TRL: `generation_batch_size ({batch}) must be divisible by "
        f"num_generations ({groups})`). To fix it, set {', or '.join(fixes)}."
    )
