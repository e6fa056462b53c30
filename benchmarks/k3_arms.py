"""The KL a user would otherwise add to AsyncGRPO: GRPO's k3 term towards the sampler, in its two forms.

TRL's asynchronous trainer (`trl.experimental.async_grpo.AsyncGRPOTrainer`) has no KL term. The arm a user would
reach for adds GRPO's (TRL 1.16, `GRPOTrainer._compute_loss`) towards the policy version that sampled each sample
(mu, the sample's `old_log_probs`: the same reference AsyncRPG regularises towards), per trained token:

    k3 = exp(log mu - log pi) - (log mu - log pi) - 1          added to the per-token loss as beta * k3

- **unweighted** (`use_bias_correction_kl=False`): d(beta k3)/d log pi = beta (1 - 1/w), w = pi/mu. Its off-policy
  gradient is not the gradient of the KL it estimates (the paper's contribution iii; docs/math.md section 2).
- **IS-weighted** (`use_bias_correction_kl=True`, TRL's default): the k3 term multiplied by w = exp(log pi - log mu)
  exactly as TRL writes it (`per_token_kl * coef_1`, the ratio NOT detached: TRL's docstring says it changes the
  gradient even where w = 1): d(beta w k3)/d log pi = beta w log w, which is URKL's KL gradient (C_KL = -beta w log r
  with r = w) without RPG-Style Clip. (With the ratio detached the gradient would be beta (w - 1), UFKL's.)

The PPO-clipped reward term is TRL's, untouched: `compute_loss` runs TRL's on a recording of the model call (the way
`AsyncRPGTrainer` reads the log-probs) and adds beta * k3 with TRL's normalisation (the sum over the micro-batch's
trained tokens over the tokens per process, over the accumulation steps). The arms subclass `AsyncGRPOTrainer`, not
`AsyncRPGTrainer` at beta 0: AsyncRPG's clip is RPG-Style Clip (widths 0.2/0.28, dual clip c = 10) on a
REINFORCE surrogate, so "AsyncRPG at beta 0 plus k3" would differ from AsyncGRPO in two places; here the only
difference from the AsyncGRPO arm is the k3 term, as in TRL's synchronous GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer


def k3_per_token(logps: torch.Tensor, sampling_logps: torch.Tensor, importance_weighted: bool) -> torch.Tensor:
    """GRPO's per-token k3 term towards the sampler (TRL 1.16 `GRPOTrainer._compute_loss`, `per_token_kl`, with the
    reference's log-probs the sampler's), times the importance ratio w = pi/mu when `importance_weighted`
    (TRL's `use_bias_correction_kl=True`: `per_token_kl * coef_1`, the ratio carrying its gradient)."""
    delta = sampling_logps - logps
    per_token_kl = torch.exp(delta) - delta - 1
    if importance_weighted:
        per_token_kl = per_token_kl * torch.exp(logps - sampling_logps)
    return per_token_kl


def k3_gradient(w: torch.Tensor, importance_weighted: bool) -> torch.Tensor:
    """Closed form of d k3_per_token / d log pi at w = pi/mu: 1 - 1/w unweighted, w log w IS-weighted."""
    return w * torch.log(w) if importance_weighted else 1 - 1 / w


@dataclass
class AsyncGRPOWithK3Config(AsyncGRPOConfig):
    """`AsyncGRPOConfig` plus GRPO's KL fields, with GRPO's names and meanings (the reference: the sampler)."""

    beta: float = field(default=0.0, metadata={"help": "Coefficient of GRPO's k3 term towards the sampler."})
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "Multiply the k3 term by the importance ratio pi/mu (TRL's default)."})

    def __post_init__(self):
        if not (isinstance(self.beta, (int, float)) and self.beta >= 0 and self.beta == self.beta
                and self.beta != float("inf")):
            raise ValueError(f"AsyncGRPOWithK3Config.beta must be a finite number >= 0, got {self.beta!r}.")
        if not isinstance(self.use_bias_correction_kl, bool):
            raise ValueError("AsyncGRPOWithK3Config.use_bias_correction_kl must be True or False, got "
                             f"{self.use_bias_correction_kl!r}.")
        super().__post_init__()


class AsyncGRPOWithK3Trainer(AsyncGRPOTrainer):
    """`AsyncGRPOTrainer` whose loss is TRL's plus beta * (GRPO's k3 term towards the sampler), unweighted or
    IS-weighted by `args.use_bias_correction_kl`. A non-finite loss stops the run (FloatingPointError) before the
    optimizer sees it."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # Override: TRL's loss as it is, on a recording of the model call; the k3 term added on the same tokens.
        from trl_rpg._compat import recording
        from trl_rpg.objectives.loss import packed_token_mean
        from trl_rpg.trainers.async_trainer import packed_terms

        call, outputs = recording(model)
        loss = super().compute_loss(call, inputs, return_outputs, num_items_in_batch)
        if self.args.beta == 0.0:
            return loss
        token_index, sampling_logps, _ = packed_terms(inputs)
        logps = outputs[-1].log_probs.flatten()[token_index]
        per_token_kl = k3_per_token(logps, sampling_logps, self.args.use_bias_correction_kl)
        loss = loss + packed_token_mean(self.args.beta * per_token_kl, inputs["global_n_tokens"][0],
                                        self.accelerator.num_processes, self.current_gradient_accumulation_steps)
        if not torch.isfinite(loss.detach()).all():
            raise FloatingPointError(
                f"AsyncGRPOWithK3Trainer: the loss is {loss.item()} at step {self.state.global_step + 1} (k3 term "
                f"with beta={self.args.beta}); stopping before the optimizer step.")
        with torch.no_grad():
            self._metrics["train"]["k3/term"].append(per_token_kl.mean().item())
        return loss


#: The two asynchronous k3 arms, as `AsyncGRPOWithK3Config` fields (beta is tuned).
K3_ARMS = {
    "AsyncGRPO+k3": {"use_bias_correction_kl": False},
    "AsyncGRPO+k3 IS": {"use_bias_correction_kl": True},
}
