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
(the non-finite-gradient guard), `train` (the start-up line) and `create_model_card`. What it shares with
`RPGTrainer` lives beside both: the objective's fields and checks (`objective_config`), the metrics (`loss`), the guard
(`gradient_guard`), the start-up line (`describe`), the card (`model_card`).
"""

from __future__ import annotations

import logging
import os
from typing import ClassVar

from trl.experimental.async_grpo import AsyncGRPOTrainer

from . import _compat, async_upgrade_guard, gradient_guard, learning_signal, model_card
from .async_config import AsyncRPGConfig, as_async_rpg_config
from .async_runtime import check_async_runtime
from .describe import describe_async_objective
from .loss import packed_token_mean, reduced_metrics
from .objectives import rpg_per_token_loss
from .parameter_guard import ParameterGuard

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
    _paper: ClassVar[dict[str, str]] = model_card.RPG_PAPER

    def __init__(self, model, reward_funcs=None, args: AsyncRPGConfig | None = None, *positional, **kwargs):
        async_upgrade_guard.check_async()  # first: TRL code RPG relies on changed must not train silently wrong
        check_async_runtime(positional, kwargs)  # no CUDA GPU, no stand-ins: one line, before anything loads
        args = as_async_rpg_config(args, model)
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
        # after every optimizer step: parameters the optimizer made NaN/inf stop the run before anything is saved
        self.add_callback(ParameterGuard(lambda t: self.accelerator.reduce(t.to(self.accelerator.device), "sum"),
                                         trainer="AsyncRPGTrainer"))
        self.skipped_steps = 0
        self.batches_with_signal = 0  # micro-batches with a non-zero advantage on some process (this train() call)

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
        signal = acc.reduce((advantages != 0).any().float().reshape(1), reduction="sum")
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

    def train(self, *positional, **kwargs):
        # Override: a user who swapped the import sees what this run optimises, and whether it learned from rewards.
        if self.is_world_process_zero():
            logger.warning(describe_async_objective(self.args))
        self.batches_with_signal = 0
        output = super().train(*positional, **kwargs)
        error = trained_on_nothing(self.state.global_step, self.state.max_steps, self.batches_with_signal)
        output.metrics[learning_signal.TRAINED_ON_NOTHING] = float(error is not None)
        if error:
            output.metrics[learning_signal.TRAINED_ON_NOTHING_REASON] = error
            if self.is_world_process_zero():
                logger.warning(error)
        return output

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        # Override: RPG's card (what TRL's carries, plus the RPG settings), as RPGTrainer writes it.
        if self.is_world_process_zero():
            model_card.write(os.path.join(self.args.output_dir, "README.md"), self.args,
                             self.accelerator.unwrap_model(self.model), load_as=self.hub_model_id or
                             self.args.output_dir, model_name=model_name, dataset_name=dataset_name, tags=tags,
                             trainer_tags=self._tag_names, trainer="AsyncRPGTrainer", trl_trainer="AsyncGRPOTrainer",
                             settings=model_card.async_rpg_settings)


__all__ = ["AsyncRPGTrainer", "packed_terms", "trained_on_nothing"]
