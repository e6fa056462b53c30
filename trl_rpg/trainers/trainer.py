"""`RPGTrainer`: a drop-in replacement for TRL's `GRPOTrainer` that trains with RPG objectives.

The trainer only overrides the `GRPOTrainer` / `Trainer` methods TRL calls (each says why in one line) and
delegates: the loss to `objectives` and `loss`, the reference policy to `reference`, dynamic sampling to
`dynamic_sampling`, checkpoints to `checkpoint` (the trainer's parts handed to it by `checkpointing`), the gradient
guard to `gradient_guard`, the model card to `model_card`, data set checks to `validation`, reward-function calls to
`reward_calls`, the "did this run learn anything" verdict to `learning_signal`, the start-up line to `describe`.
`_compat` lists every TRL internal used. docs/architecture.md follows one training step through them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import ClassVar

import torch
from torch import nn
from trl import GRPOTrainer

from .. import _compat
from ..dynamic_sampling import sampling as ds
from ..objectives.loss import (
    Aggregation,
    aggregate,
    appended_means,
    applied_entropy_coef,
    carry_forward,
    entropy_bonus,
    entropy_window,
    next_entropy_coef,
    reduced_metrics,
    sequence_level_logps,
    window_entropy,
)
from ..objectives.per_token import rpg_per_token_loss
from ..run import checkpoint, checkpointing, gradient_guard, learning_signal
from ..run.parameter_guard import ParameterGuard
from ..run.reward_calls import UNSCORED_BATCH_WARNING, ScoringTally, checked_reward_function
from ..run.reward_exits import StuckRewardWatchdog
from ..run.reward_scale import RewardScaleCheck
from . import construction, model_card, precision, sampler_logps
from .config import RPGConfig
from .describe import describe_objective, training_dropout
from .reference import MOVING, ReferencePolicy, ReferenceSchedule, without_dropout

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _holding(trainer):
    """Mark `trainer` as holding its output_dir's lock for the block (its `save_model` then takes none)."""
    trainer._rpg_holds_lock = True
    try:
        yield
    finally:
        trainer._rpg_holds_lock = False


class RPGTrainer(GRPOTrainer):
    """Trainer for Regularized Policy Gradient (RPG), a subclass of [`~trl.GRPOTrainer`] with the same arguments.

    Swap `GRPOTrainer` for `RPGTrainer` (and `GRPOConfig` for `RPGConfig`) and a GRPO script trains with RPG. A plain
    `GRPOConfig` is accepted and upgraded to an [`RPGConfig`]: GRPO fields keep their values, RPG fields get RPG
    defaults. See `RPGConfig` for the objective, clip and reference-policy settings.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "rpg"]
    _name = "RPG"
    #: The config this trainer takes: the upgrade self-check builds it from the class it is handed (trl_rpg.upgrade
    #: never imports a trainer).
    config_class: ClassVar[type] = RPGConfig
    _paper: ClassVar[dict[str, str]] = model_card.RPG_PAPER
    if not _compat.TRAINER_HAS_END:  # transformers < 5.18: `trainer.end()` as on later versions
        end = _compat.trainer_end

    def __init__(self, model, reward_funcs=None, args: RPGConfig | None = None, *positional, **kwargs):
        train_dataset = positional[0] if positional else kwargs.get("train_dataset")
        eval_dataset = positional[1] if len(positional) > 1 else kwargs.get("eval_dataset")
        args = construction.before_load(model, reward_funcs, args, train_dataset, eval_dataset,
                                        kwargs.get("environment_factory"))  # nothing loaded yet
        # With the sampler as reference, TRL must build no reference model and compute no reference log-probs.
        with _compat.trl_sees_beta(args, 0.0 if args.rpg_reference == "sampling" else args.beta):
            super().__init__(model, reward_funcs, args, *positional, **kwargs)

        watchdog = None  # several processes: a reward call stuck on one must end the run, naming it (reward_exits)
        if self.accelerator.num_processes > 1:
            _compat.set_collective_timeout(args.ddp_timeout + _compat.COLLECTIVE_TIMEOUT_MARGIN)
            watchdog = StuckRewardWatchdog(args.ddp_timeout, self.accelerator.process_index,
                                           self.accelerator.num_processes)
        self.reward_funcs = [f if isinstance(f, nn.Module) else checked_reward_function(
            f, name, timeout=args.rpg_reward_timeout, watchdog=watchdog)
            for f, name in zip(self.reward_funcs, self.reward_func_names)]
        self.reference = ReferencePolicy(self, args.rpg_reference, args.rpg_reference_update_steps,
                                         args.rpg_reference_kl_target, args.rpg_reference_kl_decay)
        self.dynamic_sampler = ds.DynamicSampler.for_trainer(self) if args.dynamic_sampling else None
        self.sampler_logps = sampler_logps.SamplerLogps.for_trainer(self)  # mu: the engine's own, or recomputed
        self.skipped_steps = 0
        self._rpg_batch_metrics: dict[str, float] = {}  # generation-time metrics of the batch being trained on
        self._rpg_scoring, self._rpg_signal = ScoringTally(), learning_signal.SignalTally()
        self._rpg_reward_scale = RewardScaleCheck.for_args(args)
        if args.rpg_reference in MOVING:
            self.add_callback(ReferenceSchedule(self.reference))
        self._hub = checkpointing.hub_uploads(args, self.is_world_process_zero(), args.rpg_hub_upload_timeout)
        # parameters the optimizer made NaN/inf stop the run before anything is saved (checked at every save, the end,
        # after a skipped step and every CHECK_EVERY steps)
        self.add_callback(ParameterGuard(lambda t: self.accelerator.reduce(t.to(self.accelerator.device), "sum"),
                                         skipped_steps=lambda: self.skipped_steps))
        construction.after_load(self)  # precision, tokenized prompts, the training forward's dropout

    @property
    def trl_computes_reference_logps(self) -> bool:
        """Whether TRL computes reference log-probs at generation time (it does when its `beta` is not 0)."""
        return self.beta != 0.0

    # ------------------------------------------------------------------------------------------------------------
    # Generation
    # ------------------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        # Override: dynamic sampling, the scoring and learning-signal tallies (training), the reference version tag.
        if not self.model.training:
            output = self._rpg_generate_and_score(inputs)[0]
        else:
            logged_before = {key: len(values) for key, values in self._metrics["train"].items()}
            if self.dynamic_sampler is None:
                output, rewards = self._rpg_generate_and_score(inputs)
                rewards = [rewards]
            else:
                output, rewards = self.dynamic_sampler.collect_batch(
                    inputs, self._rpg_generate_and_score, self.state.stateful_callbacks,
                    lambda values: self._rpg_log_metrics("train", values))
            if self._rpg_scoring.add(rewards):
                logger.warning(UNSCORED_BATCH_WARNING)
            self._rpg_signal.add_batch(learning_signal.batch_facts(  # what the batch offers, over all processes
                rewards, output["advantages"], sampler_logps.trained_tokens(  # less engine log-probs excluded
                    output, output["completion_mask"] * output.get("tool_mask", 1)),
                self.reward_weights, self.num_generations, self.multi_objective_aggregation,
                lambda t: self.accelerator.reduce(t, reduction="sum")))
            scale_warning = self._rpg_reward_scale.add(rewards, self.reward_weights, self.num_generations,
                                                   self.multi_objective_aggregation)  # once: rewards far from [0, 1]
            if scale_warning and self.is_world_process_zero():
                logger.warning(scale_warning)
            # logged again at every step that trains on this batch (see `log`)
            self._rpg_batch_metrics = appended_means(logged_before, self._metrics["train"])
        if self.trl_computes_reference_logps:
            self.reference.tag(output)
        return output

    def _rpg_generate_and_score(self, batch):
        """TRL's generation and scoring of `batch`, and the rewards (gathered over processes) it computed."""
        with _compat.capture_return(self, "_calculate_rewards") as returned, self.sampler_logps.generating(self), \
                _compat.around_trl_reference_pass(without_dropout):  # a deterministic reference (reference.py)
            output = super()._generate_and_score_completions(batch)
        learning_signal.check_reward_model_scores(returned[-1], self.reward_funcs, self.reward_func_names)
        return self.sampler_logps.tag(output, self.state.global_step), returned[-1]

    # ------------------------------------------------------------------------------------------------------------
    # Loss
    # ------------------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        # Override: RPG's per-token loss replaces GRPO's clipped ratio + k3 penalty; TRL's masks gate the reward term
        # only (they zero the advantage; the KL term acts on every token: docs/math.md section 4b).
        args, acc = self.args, self.accelerator
        mode = "train" if self.model.training else "eval"
        completion_ids = inputs["completion_ids"]
        mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
        mask = mask.float()
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1), completion_ids.size(1),
            compute_entropy=True, compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs.get(k) for k in _compat.MULTIMODAL_KEYS})
        # No stored sampler log-probs: the batch is on-policy (one optimizer step per generation), mu = pi_theta.
        old = inputs.get("old_per_token_logps")
        sampling_logps = per_token_logps.detach() if old is None else old
        sampling_logps = sampler_logps.mu(inputs, sampling_logps)  # an engine batch's own; NaN: excluded, counted
        advantages, entropy_mask = self._rpg_reward_signal(inputs, per_token_logps, sampling_logps, entropies, mask)
        per_token_loss, stats = rpg_per_token_loss(
            per_token_logps, sampling_logps, advantages, mask,
            ref_logps=self.reference.logps(inputs, completion_ids.size(1)) if self.trl_computes_reference_logps
            else None,
            reward_logps=sequence_level_logps(per_token_logps, sampling_logps, mask)
            if self.importance_sampling_level == "sequence" else None,
            divergence=args.rpg_divergence, estimator=args.rpg_estimator, beta=args.beta,
            epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high, dual_clip_c=args.rpg_dual_clip_c)
        if "importance_sampling_ratio" in inputs:  # mu != pi_old: TRL's pi_old/mu weighs every term (sec. 4b)
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]

        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        loss, policy_loss = aggregate(per_token_loss, mask, Aggregation(
            self.loss_type, accumulation, args.steps_per_generation, acc.num_processes, self.max_completion_length,
            mode == "train"), inputs.get("num_items_in_batch"))
        if self._entropy_bonus_enabled:
            entropy_tokens = mask if entropy_mask is None else mask * entropy_mask
            loss = loss + self._rpg_entropy_term(entropies, entropy_tokens, mode)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(acc.gather_for_metrics(aux_loss).mean().item())
        self._rpg_log_loss_metrics(stats, entropies, mask, policy_loss, mode)
        if sampler_logps.at_sampling_policy(inputs, self.state.global_step):  # log w here is the sampler mismatch
            mismatch = sampler_logps.mismatch_metrics(per_token_logps, sampling_logps, mask, acc.gather)
            self._rpg_log_metrics(mode, mismatch)
            self._rpg_batch_metrics.update(mismatch if mode == "train" else {})  # shown at every step on the batch
        return loss

    def _rpg_reward_signal(self, inputs, per_token_logps, sampling_logps, entropies, mask):
        """The (B, T) advantages with TRL's off-policy and high-entropy masks applied (a masked token has A = 0),
        and the entropy mask (for TRL's entropy bonus; None when `top_entropy_quantile` is 1)."""
        advantages = inputs["advantages"]
        advantages = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).expand_as(mask)
        if self.off_policy_mask_threshold is not None:
            advantages = advantages * self.get_off_policy_mask(
                advantages=advantages[:, :1] if inputs["advantages"].dim() == 1 else advantages,
                per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", sampling_logps), mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold)
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
            advantages = advantages * entropy_mask
        return advantages, entropy_mask

    def _rpg_entropy_term(self, entropies, mask, mode):
        """TRL's entropy bonus (static `entropy_coef`, or its adaptive controller with `use_adaptive_entropy`)."""
        args, acc, train = self.args, self.accelerator, mode == "train"
        term = entropy_bonus(entropies, mask, applied_entropy_coef(
            self.entropy_coef, self.use_adaptive_entropy, self._last_world_entropy, args.entropy_target),
            self.current_gradient_accumulation_steps if train else 1)
        if self.use_adaptive_entropy and train:
            self._entropy_window_stats = entropy_window(self._entropy_window_stats, entropies, mask)
            if acc.sync_gradients:
                world = window_entropy(acc.reduce(self._entropy_window_stats, reduction="sum"))
                self.entropy_coef = next_entropy_coef(self.entropy_coef, world, args.entropy_target,
                                                      args.entropy_coef_delta, args.entropy_coef_min,
                                                      args.entropy_coef_max)
                self._last_world_entropy, self._entropy_window_stats = world, None
        if train and acc.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return term

    def _rpg_log_loss_metrics(self, stats, entropies, mask, policy_loss, mode):
        """See `loss.reduced_metrics`; training batches also feed the adaptive reference trigger."""
        acc = self.accelerator
        values, divergence_sum, tokens = reduced_metrics(
            stats, entropies, mask, policy_loss, lambda t: acc.reduce(t, reduction="sum"), acc.gather,
            acc.num_processes, log_kl=self.args.beta > 0)
        values["rpg/reference_updates"] = float(self.reference.updates)
        if mode == "train" and self.reference.trigger is not None:
            self.reference.record_divergence(divergence_sum, tokens)
            if acc.sync_gradients:  # the last micro-batch of the optimizer step
                values["rpg/divergence_ema"] = self.reference.end_step()
        self._rpg_log_metrics(mode, values)

    def log(self, logs, start_time=None):
        # Override: with batch reuse, a training step's log line also carries the generation-time metrics (reward,
        # completions/*, num_tokens...) of the batch it trained on, not only the step that generated it.
        if self.model.training and "loss" in logs:
            carry_forward(self._metrics["train"], self._rpg_batch_metrics)
        super().log(logs, start_time)

    def _rpg_log_metrics(self, mode: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._metrics[mode][key].append(value)

    # ------------------------------------------------------------------------------------------------------------
    # The optimizer step: skip a non-finite one
    # ------------------------------------------------------------------------------------------------------------

    def _get_grad_norm(self, model, grad_norm=None):
        # Override: the non-finite-gradient guard, on the norm clipping just computed (no extra pass).
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        skipped = gradient_guard.skip_step(model, grad_norm, self.is_deepspeed_enabled,
                                           self.accelerator.scaler is not None)
        if skipped:
            self.skipped_steps += 1
            self._metrics["train"]["rpg/skipped_steps"].append(float(self.skipped_steps))
            logger.warning(gradient_guard.skipped_warning("RPGTrainer", grad_norm, self.state.global_step + 1,
                                                          self.skipped_steps))
        saved, key = self.state.stateful_callbacks, learning_signal.STATE_KEY  # kept in trainer_state.json
        saved[key], warning = self._rpg_signal.end_step(skipped, saved.get(key),
                                                    zero_gradient=learning_signal.gradient_is_zero(grad_norm),
                                                    no_update=learning_signal.learning_rate_is_zero(self.optimizer))
        if warning:
            logger.warning(warning)
        return grad_norm

    # ------------------------------------------------------------------------------------------------------------
    # Training, checkpoints and resume
    # ------------------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        # Override: one writer per output_dir (a lock held for the run); resume only from a verified, complete RPG
        # checkpoint; a run that trained on nothing is told so.
        acc = self.accelerator
        with checkpoint.output_dir_lock(self.args.output_dir, self.args.should_save, checkpointing.gather_all(acc)), \
                _holding(self):
            resume_from_checkpoint = checkpointing.resume_or_start(
                resume_from_checkpoint, self.args, acc, self._rpg_run_identity, self.is_world_process_zero())
            if self.is_world_process_zero():  # a user who swapped the import sees what this run optimises
                logger.warning(describe_objective(self.args, self.sampler_logps, precision.precision_clause(
                    self.args.bf16, self.args.fp16, self.accelerator.mixed_precision,
                    [p.dtype for p in self.model.parameters() if p.requires_grad],
                    os.environ.get(precision.MIXED_PRECISION_ENV)), training_dropout(self.model)))
            self._rpg_scoring, self._rpg_signal = ScoringTally(), learning_signal.SignalTally()
            self._rpg_reward_scale = RewardScaleCheck.for_args(self.args)
            output = super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
            error = learning_signal.trained_on_nothing(self.state.global_step, self.state.max_steps, self._rpg_scoring,
                                                       self._rpg_signal, self.reward_func_names,
                                                       getattr(self.train_dataset, "column_names", None))
            output.metrics.update(learning_signal.verdict_metrics(error, self._rpg_signal))
            if error and self.args.rpg_require_learning_signal:
                self.save_model(self.args.output_dir)  # a script's own save after train() never runs
                raise learning_signal.NoLearningSignal(learning_signal.verdict_error(error, self.args.output_dir))
            if error and self.is_world_process_zero():
                logger.warning(learning_signal.verdict_warning(error))
            checkpointing.raise_if_upload_failed(self)  # HubUploadError, the final model saved
            return output

    def _rpg_run_identity(self) -> dict:
        """What identifies this run in a checkpoint (`checkpointing.run_identity`)."""
        return checkpointing.run_identity(self.args, self.accelerator, self.model, self.is_deepspeed_enabled)

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        # Override: here transformers has DeepSpeed load a resumed checkpoint, with torch.load(weights_only=False).
        if resume_from_checkpoint is None or not self.is_deepspeed_enabled:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        with checkpoint.deepspeed_loads_weights_only(resume_from_checkpoint):
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)

    def _save_checkpoint(self, model, trial):
        # Override: the folder emptied first; RPG's files and the manifest after TRL's; then rotation (RPG's: this
        # run's checkpoints only) and the Hub upload, so a crash mid-save never leaves a checkpoint that looks
        # complete, deletes the last complete one, or uploads a checkpoint that cannot be resumed (checkpointing).
        checkpointing.save_checkpoint(self, trial, functools.partial(super()._save_checkpoint, model, trial),
                                      lambda output_dir, run_id: checkpointing.save_files(
                                          output_dir, self.args, self.accelerator, self.reference, self._step,
                                          self._buffered_inputs, self.skipped_steps, self.state.global_step,
                                          self._rpg_run_identity, run_id))

    def _push_from_checkpoint(self, checkpoint_folder):
        # Override: the uploads transformers queues run in RPG's worker, a checkpoint's manifest last in a commit of
        # its own, and each result is read (hub_uploads).
        checkpointing.push_recorded(self._hub, checkpoint_folder, self.state.global_step,
                                    super()._push_from_checkpoint)

    def _finish_current_push(self):
        # Override: the final wait is bounded (rpg_hub_upload_timeout); the last checkpoint is pushed if transformers
        # skipped it or its upload failed (hub_uploads.HubUploads.finish).
        self._hub.finish(self._push_from_checkpoint)

    def _load_optimizer_and_scheduler(self, resume_from):
        # Override: restore RPG's state with the optimizer's (called once on resume, on every process; the
        # checkpoint was verified in `train`).
        super()._load_optimizer_and_scheduler(resume_from)
        if resume_from is not None:
            _compat.resume_policy_adapter(self.accelerator.unwrap_model(self.model), resume_from)
            self.skipped_steps, self._step, self._buffered_inputs = checkpointing.restore(
                resume_from, self.args, self.accelerator, self.reference, self._rpg_pad_token_id)

    @property
    def _rpg_pad_token_id(self) -> int:
        """The pad token of the tokenizer (or of a processor's tokenizer)."""
        return getattr(self.processing_class, "tokenizer", self.processing_class).pad_token_id

    # ------------------------------------------------------------------------------------------------------------
    # Model card
    # ------------------------------------------------------------------------------------------------------------

    def save_model(self, output_dir=None, _internal_call=False):
        # Override: the final model in output_dir gets RPG's card, as each checkpoint does (without this, a run with
        # save_strategy="no" keeps PEFT's blank card with LoRA, no card with full fine-tuning). Called on its own
        # (not inside train(), which holds it), it takes the folder's lock: another run's lock is an OutputDirBusy.
        # Each saving process on its own (no collective: a script may call it on the main process only).
        with contextlib.nullcontext() if getattr(self, "_rpg_holds_lock", False) else checkpoint.output_dir_lock(
                output_dir or self.args.output_dir, self.args.should_save, lambda values: values):
            super().save_model(output_dir, _internal_call)
        if not _internal_call and os.path.abspath(output_dir or self.args.output_dir) == os.path.abspath(
                self.args.output_dir):
            self.create_model_card(model_name=os.path.basename(os.path.abspath(self.args.output_dir)))

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        # Override: RPG's card from RPG's own template (what TRL's carries, right for local models, local data and
        # unpushed runs, plus the RPG settings), not TRL's card edited afterwards.
        if self.is_world_process_zero():
            model_card.write(os.path.join(self.args.output_dir, "README.md"), self.args,
                             self.accelerator.unwrap_model(self.model), load_as=self.hub_model_id or
                             self.args.output_dir, model_name=model_name, dataset_name=dataset_name, tags=tags,
                             trainer_tags=self._tag_names)


__all__ = ["RPGTrainer"]
