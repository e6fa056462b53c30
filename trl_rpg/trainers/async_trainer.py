"""`AsyncRPGTrainer`: TRL's asynchronous GRPO trainer (`trl.experimental.async_grpo.AsyncGRPOTrainer`) with RPG's loss.

A vLLM server generates while the trainer steps; each sample reaches the loss one or several policy versions after
it was drawn, with the sampler's own log-probs (`old_log_probs`). TRL's loss is a PPO clip on pi_theta/mu with no KL
term. Here the loss is `objectives.rpg_per_token_loss` on the same flat per-token tensors, with the reference the
sampler of each sample (rho = 1): w = pi_theta/mu is the exact importance weight at any staleness, so the KL term
regularises towards the policy version that drew each sample with an exact off-policy gradient (docs/math.md,
docs/asynchronous.md).

The trainer is a thin subclass: TRL's rollout pipeline, packing, staleness filter, weight sync, metrics and step
accounting run unchanged. It overrides `compute_loss` (TRL's forward and bookkeeping run on a recording of the model
call; RPG's loss replaces TRL's, with TRL's token normalisation and gradient-accumulation scaling), `_get_grad_norm`
(the non-finite-gradient guard), `train` (the start-up line; RPGTrainer's run guarantees: the output_dir lock, a
verified resume, a failed Hub upload ending the run), `_save_checkpoint`, `_load_optimizer_and_scheduler`,
`_push_from_checkpoint` and `_finish_current_push` (RPG's manifest, Hub uploads read) and `create_model_card`. What it
shares with `RPGTrainer` lives beside both: the objective's fields and checks (`objective_config`), the metrics
(`loss`), the guard (`gradient_guard`), the checkpoint and Hub glue (`checkpointing`), the start-up line
(`describe`), the card (`model_card`). What the worker sends is read through `worker_samples.CheckedRollouts`
(installed as TRL's `rollout_queue` on the main process), and the sampler settings are judged when the trainer is
built (`async_sampler`: the server TRL's worker samples from is asked).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import ClassVar

from trl.experimental.async_grpo import AsyncGRPOTrainer

from .. import _compat
from ..objectives.loss import packed_token_mean, reduced_metrics
from ..objectives.per_token import rpg_per_token_loss
from ..run import checkpoint, checkpointing, gradient_guard, learning_signal
from ..run.parameter_guard import ParameterGuard
from . import async_sampler, construction, model_card, worker_samples
from .async_config import AsyncRPGConfig
from .describe import describe_async_objective

logger = logging.getLogger(__name__)


def packed_terms(inputs: dict):
    """The loss terms of one packed micro-batch row, as TRL's `compute_loss` selects them: the packed position whose
    prediction each trained token is (`token_index`), its sampler log-prob and its advantage."""
    selected = inputs["token_index"] >= 0
    return inputs["token_index"][selected], inputs["old_log_probs"][selected], inputs["advantages"][selected]


def trained_on_nothing(global_step: int, max_steps: int, batches_with_signal: int) -> str | None:
    """Why a finished asynchronous run learned nothing from its rewards, or None (`learning_signal`'s verdict, for
    the asynchronous trainer: TRL's rollout worker computes the rewards and advantages, so the trainer reads the
    advantages it trains on)."""
    if global_step == 0:
        return ("AsyncRPGTrainer: the run took no optimizer step, so the model was trained on nothing "
                f"(max_steps={max_steps}).")
    if batches_with_signal == 0:
        return ("AsyncRPGTrainer: every trained sample had advantage 0 (in every group the rewards were equal, or "
                "unscored), so the model learned nothing from its rewards (only the KL term acted). Check the reward "
                "functions against the data (rpg/trained_on_nothing is 1.0 in train()'s metrics).")
    return None


class AsyncRPGTrainer(AsyncGRPOTrainer):
    """Trainer for Regularized Policy Gradient (RPG) with asynchronous rollouts: a subclass of
    [`~trl.experimental.async_grpo.AsyncGRPOTrainer`] with the same arguments (`rollout_worker` and
    `weight_transfer` included).

    Swap `AsyncGRPOTrainer` for `AsyncRPGTrainer` (and `AsyncGRPOConfig` for `AsyncRPGConfig`; a plain
    `AsyncGRPOConfig` is upgraded) and an asynchronous GRPO script trains with RPG's KL-regularised loss, the KL term
    towards the policy version that sampled each sample. See `AsyncRPGConfig`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "rpg", "async-rpg"]
    _name = "AsyncRPG"
    #: The config this trainer takes: the upgrade self-check builds it from the class it is handed (trl_rpg.upgrade
    #: never imports a trainer).
    config_class: ClassVar[type] = AsyncRPGConfig
    _paper: ClassVar[dict[str, str]] = model_card.RPG_PAPER

    def __init__(self, model, reward_funcs=None, args: AsyncRPGConfig | None = None, *positional, **kwargs):
        args = construction.async_before_load(model, args, positional, kwargs)  # nothing loaded yet
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
        # parameters the optimizer made NaN/inf stop the run before anything is saved (checked at every save, the end,
        # after a skipped step and every CHECK_EVERY steps)
        self.add_callback(ParameterGuard(lambda t: self.accelerator.reduce(t.to(self.accelerator.device), "sum"),
                                         trainer="AsyncRPGTrainer", skipped_steps=lambda: self.skipped_steps))
        self.skipped_steps = 0
        self.batches_with_signal = 0  # micro-batches with a trained token of non-zero advantage (this train() call)
        # --- run guarantees, as RPGTrainer's (checkpointing): every Hub upload's result read ---
        self._hub = checkpointing.hub_uploads(args, self.is_world_process_zero(), args.rpg_hub_upload_timeout,
                                              trainer="AsyncRPGTrainer")
        if self.accelerator.is_main_process:  # what the worker sends is checked before TRL's staleness filter reads it
            self.rollout_queue = worker_samples.CheckedRollouts(
                self.rollout_queue, worker_samples.worker_name(self.rollout_worker, self.args.vllm_server_base_url),
                lambda: self.model_version, self.args.max_staleness, self._metrics["train"],
                worker_samples.unusable_limit(self.args))
        self.sampler_verdict = self._sampler_verdict()

    def _sampler_verdict(self) -> async_sampler.SamplerVerdict:
        # The settings w = pi_theta/mu is exact under (`async_sampler`): the main process asks the vLLM server TRL's
        # worker samples from for its logprobs mode; every process gets its verdict (a refusal raised on all).
        from accelerate.utils import broadcast_object_list
        from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

        verdict = [None]
        if self.accelerator.is_main_process:
            try:
                server = mode = None
                if isinstance(self.rollout_worker, AsyncRolloutWorker):
                    server = self.args.vllm_server_base_url
                    mode = async_sampler.asked_logprobs_mode(self.vllm_client)
                verdict = [async_sampler.sampler_verdict(self.args, mode, server)]
            except Exception as error:  # noqa: BLE001 - raised on every process below, not on this one alone
                verdict = [error]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(verdict, from_process=0)
        if isinstance(verdict[0], Exception):
            raise verdict[0]
        if verdict[0].kind == "refused":
            raise async_sampler.SamplerRefused(verdict[0].message)
        if verdict[0].kind == "warned" and self.accelerator.is_main_process:
            warnings.warn(verdict[0].message, UserWarning, stacklevel=3)
        return verdict[0]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # Override: TRL's forward, metrics and step accounting run as they are, on a recording of the model call; its
        # PPO-clip loss is discarded and RPG's per-token loss, on the same tokens, replaces it.
        call, outputs = _compat.recording(model)
        super().compute_loss(call, inputs, return_outputs, num_items_in_batch)
        args, acc, output = self.args, self.accelerator, outputs[-1]
        token_index, sampling_logps, advantages = packed_terms(inputs)
        logps = output.log_probs.flatten()[token_index].unsqueeze(0)  # (1, M): one row of M trained tokens
        mask = logps.new_ones(logps.shape)
        per_token_loss, stats = rpg_per_token_loss(
            logps, sampling_logps.unsqueeze(0), advantages.unsqueeze(0), mask,
            divergence=args.rpg_divergence, estimator=args.rpg_estimator, beta=args.beta,
            epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high, dual_clip_c=args.rpg_dual_clip_c)
        accumulation = self.current_gradient_accumulation_steps
        loss = packed_token_mean(per_token_loss, inputs["global_n_tokens"][0], acc.num_processes, accumulation)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * output.aux_loss / accumulation
        values, _, _ = reduced_metrics(
            stats, output.entropy.flatten()[token_index].unsqueeze(0), mask, loss.detach(),
            lambda t: acc.reduce(t, reduction="sum"), acc.gather, acc.num_processes, log_kl=False)
        for key, value in values.items():  # TRL's own `kl`, `entropy` and `clip_ratio/*` are logged by TRL
            if key.startswith("rpg/"):
                self._metrics["train"][key].append(value)
        signal = acc.reduce(worker_samples.trained_tokens(advantages, sampling_logps).any().float().reshape(1),
                            reduction="sum")
        self.batches_with_signal += int(float(signal) > 0)
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        # Override: the non-finite-gradient guard, on the norm clipping just computed (no extra pass).
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if gradient_guard.skip_step(model, grad_norm, self.is_deepspeed_enabled, self.accelerator.scaler is not None):
            self.skipped_steps += 1
            self._metrics["train"]["rpg/skipped_steps"].append(float(self.skipped_steps))
            logger.warning(gradient_guard.skipped_warning("AsyncRPGTrainer", grad_norm, self.state.global_step + 1,
                                                          self.skipped_steps))
        return grad_norm

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        # Override: RPGTrainer's run guarantees (one writer per output_dir: the lock held for the run; resume only from
        # a verified, complete checkpoint; a last checkpoint that never reached the Hub ends the run in
        # HubUploadError, the final model saved); a user who swapped the import sees what this run optimises, and
        # whether it learned from rewards.
        acc = self.accelerator
        with checkpoint.output_dir_lock(self.args.output_dir, self.args.should_save, checkpointing.gather_all(acc)):
            main = self.is_world_process_zero()
            resume_from_checkpoint = checkpointing.resume_or_start(resume_from_checkpoint, self.args, acc,
                                                                   self._rpg_run_identity, main)
            if main:
                logger.warning(describe_async_objective(self.args))
            self.batches_with_signal = 0
            checked = self.rollout_queue if isinstance(self.rollout_queue, worker_samples.CheckedRollouts) else None
            excluded_before = checked.excluded if checked else 0
            output = super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
            if checked:  # the main process's count (only it reads the worker's queue)
                output.metrics[worker_samples.EXCLUDED_RUN_METRIC] = float(checked.excluded - excluded_before)
            error = trained_on_nothing(self.state.global_step, self.state.max_steps, self.batches_with_signal)
            output.metrics[learning_signal.TRAINED_ON_NOTHING] = float(error is not None)
            if error:
                output.metrics[learning_signal.TRAINED_ON_NOTHING_REASON] = error
                if self.is_world_process_zero():
                    logger.warning(error)
            checkpointing.raise_if_upload_failed(self)  # HubUploadError, the final model saved
            return output

    # --- run guarantees (as RPGTrainer's): checkpoints with RPG's manifest, verified before a resume; Hub uploads ---

    def _rpg_run_identity(self) -> dict:
        """What identifies this run in a checkpoint (`checkpointing.async_run_identity`)."""
        return checkpointing.async_run_identity(self.args, self.accelerator, self.model)

    def _save_checkpoint(self, model, trial):
        # Override: RPGTrainer's save (checkpointing.save_checkpoint): the folder emptied first, TRL's files, then
        # RPG's state and the manifest; then the Hub upload and RPG's rotation.
        checkpointing.save_checkpoint(self, trial, functools.partial(super()._save_checkpoint, model, trial),
                                      lambda output_dir, run_id: checkpointing.save_async_files(
                                          output_dir, self.args, self.accelerator, self.skipped_steps,
                                          self.state.global_step, self._rpg_run_identity, run_id))

    def _load_optimizer_and_scheduler(self, resume_from):
        # Override: RPG's state restored with the optimizer's (the checkpoint was verified in `train`).
        super()._load_optimizer_and_scheduler(resume_from)
        if resume_from is not None:
            self.skipped_steps = checkpointing.restore_async(resume_from)

    def _push_from_checkpoint(self, checkpoint_folder):
        # Override: transformers' uploads run in RPG's worker, a checkpoint's manifest last, each result read.
        checkpointing.push_recorded(self._hub, checkpoint_folder, self.state.global_step,
                                    super()._push_from_checkpoint)

    def _finish_current_push(self):
        # Override: the final wait is bounded (rpg_hub_upload_timeout); the last checkpoint is pushed again if its
        # upload failed or was skipped (hub_uploads.HubUploads.finish).
        self._hub.finish(self._push_from_checkpoint)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        # Override: RPG's card (what TRL's carries, plus the RPG settings), as RPGTrainer writes it.
        if self.is_world_process_zero():
            model_card.write(os.path.join(self.args.output_dir, "README.md"), self.args,
                             self.accelerator.unwrap_model(self.model), load_as=self.hub_model_id or
                             self.args.output_dir, model_name=model_name, dataset_name=dataset_name, tags=tags,
                             trainer_tags=self._tag_names, trainer="AsyncRPGTrainer", trl_trainer="AsyncGRPOTrainer",
                             settings=model_card.async_rpg_settings)


__all__ = ["AsyncRPGTrainer", "packed_terms", "trained_on_nothing"]
