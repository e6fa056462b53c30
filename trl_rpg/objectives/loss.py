"""From RPG's per-token loss to the scalar the trainer backpropagates, and the metrics it logs.

`trl_rpg.objectives.per_token` computes the per-token loss; this module holds the trainer-side pieces around it, each
as
TRL 1.16's `GRPOTrainer._compute_loss` defines it, so that with `beta = 0`, the differentiable estimator and no
dual clip an RPG run trains exactly as a GRPO run (tests/test_grpo_equivalence.py):

- `sequence_level_logps`: GSPO-style ratios (`importance_sampling_level="sequence"`);
- `aggregate`: the `loss_type` aggregations and their gradient-accumulation normalisation; `packed_token_mean`: the
  asynchronous trainer's token mean (`AsyncRPGTrainer`);
- `entropy_bonus`, `applied_entropy_coef`, `entropy_window`, `window_entropy`, `next_entropy_coef`: TRL's static
  and adaptive entropy bonus, whose state stays in TRL's trainer attributes (TRL checkpoints it);
- `metric_sums` / `metrics` / `reduced_metrics`: what is logged, under `rpg/` and under TRL's own names;
  `appended_means` / `carry_forward`: a reused batch's generation-time metrics on every step that trains on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: `loss_type`s whose normalisation is per micro-batch, divided by the gradient-accumulation steps.
PER_MICRO_BATCH = ("grpo", "bnpo", "dr_grpo")


def sequence_level_logps(per_token_logps: torch.Tensor, sampling_logps: torch.Tensor,
                         mask: torch.Tensor) -> torch.Tensor:
    """Log-probs whose ratio to the sampler is, at every token, the sequence's length-normalised ratio (GSPO):
    `log w_seq = sum_t mask * (logp - logmu) / sum_t mask`, returned as `logmu + log w_seq`."""
    diff = torch.nan_to_num(per_token_logps - sampling_logps, nan=0.0) * mask
    log_w_seq = diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return sampling_logps + log_w_seq


@dataclass(frozen=True)
class Aggregation:
    """How `loss_type` turns a per-token loss into the micro-batch loss (TRL 1.16's normalisations)."""

    loss_type: str
    accumulation_steps: int  # current gradient-accumulation steps in training, 1 in evaluation
    steps_per_generation: int
    num_processes: int
    max_completion_length: int
    training: bool


def aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, how: Aggregation,
              num_items_in_batch: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch loss to backpropagate, and the policy loss TRL logs as `policy_loss`.

    - `"grpo"`: mean over sequences of the per-sequence token mean; `"bnpo"`: token mean over the micro-batch;
      `"dr_grpo"`: sum / (rows x max_completion_length). Each divided by the accumulation steps in training (the
      logged policy loss is the undivided value).
    - `"dapo"`: sum / the completion tokens of one accumulation window over all processes:
      `num_items_in_batch` (the tokens of the whole generation batch) / processes x accumulation / steps per
      generation in training, / processes in evaluation.
    """
    masked = per_token_loss * mask
    if how.loss_type == "dapo":
        normalizer = num_items_in_batch.clamp(min=1.0) / how.num_processes
        if how.training:
            normalizer = normalizer * how.accumulation_steps / how.steps_per_generation
        loss = masked.sum() / normalizer
        return loss, loss.detach()
    if how.loss_type == "grpo":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif how.loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    elif how.loss_type == "dr_grpo":
        loss = masked.sum() / (per_token_loss.size(0) * how.max_completion_length)
    else:
        raise ValueError(f"Unknown aggregation loss_type {how.loss_type!r}.")
    return loss / how.accumulation_steps, loss.detach()


def packed_token_mean(per_token_loss: torch.Tensor, global_tokens: torch.Tensor, num_processes: int,
                      accumulation_steps: int) -> torch.Tensor:
    """The micro-batch loss of TRL's asynchronous trainer (`AsyncGRPOTrainer.compute_loss`, TRL 1.16): the sum over
    this process's trained tokens divided by the tokens per process of the whole micro-batch (`global_tokens /
    num_processes`, at least 1: after DDP's averaging, a token mean over all processes) and by the accumulation
    steps (the trainer scales for gradient accumulation itself)."""
    tokens_per_process = (global_tokens / num_processes).clamp(min=1.0)
    return per_token_loss.sum() / tokens_per_process.to(torch.float32) / accumulation_steps


def entropy_bonus(entropies: torch.Tensor, mask: torch.Tensor, coef: float, accumulation_steps: int) -> torch.Tensor:
    """The term added to the loss: `-coef * mean entropy over mask / accumulation steps` (TRL's entropy bonus:
    the mean is over the tokens the bonus acts on, never the loss type's normaliser)."""
    entropy = (entropies * mask).sum() / mask.sum().clamp(min=1.0)
    return -coef * entropy / accumulation_steps


def next_entropy_coef(coef: float, world_entropy: float, target: float, delta: float, lowest: float,
                      highest: float) -> float:
    """TRL's adaptive entropy controller: raise the coefficient by `delta` while the entropy of the last optimizer
    step is at or below `target`, lower it otherwise, within `[lowest, highest]`."""
    if world_entropy <= target:
        return min(coef + delta, highest)
    return max(coef - delta, lowest)


def applied_entropy_coef(coef: float, adaptive: bool, last_world_entropy: float, target: float) -> float:
    """The coefficient every micro-batch of an optimizer step applies: TRL's adaptive controller gates the bonus
    off while the entropy of the previous optimizer step is above `target`."""
    return 0.0 if adaptive and last_world_entropy > target else coef


def entropy_window(window: torch.Tensor | None, entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The controller's running `[entropy sum, token count]` of the optimizer step, with one micro-batch added."""
    stats = torch.stack([(entropies * mask).sum(), mask.sum()]).detach()
    return stats if window is None else window + stats


def window_entropy(totals: torch.Tensor) -> float:
    """The token-weighted mean entropy of a window summed over processes (what the controller compares)."""
    return (totals[0] / totals[1].clamp(min=1.0)).item()


# ----------------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------------

#: Token-weighted statistics of `rpg_per_token_loss`, summed over processes before division by the token count.
_WEIGHTED = ("divergence", "w_mean", "clip_frac_high", "clip_frac_low", "clip_frac_dual")


def metric_sums(stats: dict[str, torch.Tensor], entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One vector of this process's sums, reduced (summed) over processes in one collective call:
    token-weighted statistics, valid and excluded tokens, entropy sum and token count."""
    n = stats["valid_tokens"]
    return torch.stack([stats[k] * n for k in _WEIGHTED]
                       + [n, stats["excluded_tokens"], (entropies.detach() * mask).sum(), mask.sum()]).float()


#: Per-process statistics combined over processes by their extremum: (name in `rpg_per_token_loss` stats, largest?).
EXTREMA = (("w_max", True), ("w_p01", False), ("w_p99", True), ("clip_frac_low_seq_min", False),
           ("clip_frac_high_seq_max", True))


def extremum_stats(stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """This process's `EXTREMA` statistics, as one vector to gather."""
    return torch.stack([stats[name] for name, _ in EXTREMA]).float()


def combine_extrema(gathered: torch.Tensor) -> dict[str, float]:
    """`EXTREMA` over processes from the gathered `(processes, len(EXTREMA))` statistics (NaN ignored)."""
    return {name: nan_extremum(gathered[:, i], largest) for i, (name, largest) in enumerate(EXTREMA)}


def metrics(totals: torch.Tensor, extrema: dict[str, float], log_kl: bool) -> dict[str, float]:
    """What one micro-batch logs, from the process-summed `metric_sums` and the combined `EXTREMA`.

    Under `rpg/`: `divergence` (the divergence estimate per valid token), `w_mean`, `w_max`, `w_p01` / `w_p99` (the
    smallest 1% quantile and largest 99% quantile of `w` over processes: exact with one process), the fractions of
    valid tokens in each zero-gradient region of the clip (`clip_frac_high`, `clip_frac_low`, `clip_frac_dual`) and
    `excluded_tokens`. Under TRL's names, with their closest RPG meaning: `entropy`; `kl` (the divergence, when
    beta > 0); `clip_ratio/high_mean`, `/low_mean`, `/region_mean` (the high, low and high-or-low region fractions),
    `clip_ratio/low_min`, `/high_max` (the smallest per-sequence low fraction, the largest per-sequence high
    fraction).
    """
    tokens = max(float(totals[len(_WEIGHTED)]), 1.0)
    means = {key: float(totals[i]) / tokens for i, key in enumerate(_WEIGHTED)}
    out = {f"rpg/{key}": value for key, value in means.items()}
    out.update({f"rpg/{name}": extrema[name] for name in ("w_max", "w_p01", "w_p99")})
    out["rpg/excluded_tokens"] = float(totals[len(_WEIGHTED) + 1])
    out["entropy"] = float(totals[-2]) / max(float(totals[-1]), 1.0)
    if log_kl:
        out["kl"] = means["divergence"]
    out["clip_ratio/low_mean"] = means["clip_frac_low"]
    out["clip_ratio/high_mean"] = means["clip_frac_high"]
    out["clip_ratio/region_mean"] = means["clip_frac_low"] + means["clip_frac_high"]
    out["clip_ratio/low_min"] = extrema["clip_frac_low_seq_min"]
    out["clip_ratio/high_max"] = extrema["clip_frac_high_seq_max"]
    return out


def reduced_metrics(stats: dict[str, torch.Tensor], entropies: torch.Tensor, mask: torch.Tensor,
                    policy_loss: torch.Tensor, reduce_sum, gather, num_processes: int,
                    log_kl: bool) -> tuple[dict[str, float], float, float]:
    """One micro-batch's logged values over all processes, with one collective sum (`reduce_sum`) and one gather.

    Returns `(values, divergence_sum, tokens)`: `metrics` plus `policy_loss` (the mean over processes of the
    per-process policy loss, as TRL logs it), and the process-summed divergence and valid-token count that feed the
    adaptive reference trigger.
    """
    local = torch.cat([metric_sums(stats, entropies, mask), policy_loss.detach().float().reshape(1)])
    totals = reduce_sum(local)
    local_extrema = extremum_stats(stats)
    extrema = combine_extrema(gather(local_extrema.unsqueeze(0)).reshape(-1, local_extrema.numel()))
    values = metrics(totals[:-1], extrema, log_kl=log_kl)
    values["policy_loss"] = float(totals[-1]) / num_processes
    return values, float(totals[0]), float(totals[len(_WEIGHTED)])


#: Generation-time metrics that count events of the generation step itself: logged once, never carried forward.
EVENT_METRIC_PREFIXES = ("dynamic_sampling/",)


def appended_means(lengths_before: dict[str, int], logged: dict[str, list[float]]) -> dict[str, float]:
    """The mean of the values each metric gained since `lengths_before` (NaN ignored, as TRL's `log` averages):
    what one generation step logged about its batch (event counts, `EVENT_METRIC_PREFIXES`, left out)."""
    means = {}
    for key, values in logged.items():
        if key.startswith(EVENT_METRIC_PREFIXES):
            continue
        new = [v for v in values[lengths_before.get(key, 0):] if not math.isnan(v)]
        if new:
            means[key] = sum(new) / len(new)
    return means


def carry_forward(logged: dict[str, list[float]], batch_metrics: dict[str, float]) -> None:
    """Give every metric of `batch_metrics` that has no value in this logging window the batch's value."""
    for key, value in batch_metrics.items():
        if not logged.get(key):
            logged[key] = [value]


def nan_extremum(values: torch.Tensor, largest: bool) -> float:
    """max (or min) of `values` ignoring NaN; NaN when all are NaN (as TRL's nanmax/nanmin)."""
    values = values[~torch.isnan(values)]
    if values.numel() == 0:
        return math.nan
    return float(values.max() if largest else values.min())


__all__ = ["EVENT_METRIC_PREFIXES", "EXTREMA", "Aggregation", "aggregate", "appended_means", "applied_entropy_coef",
           "carry_forward", "combine_extrema", "entropy_bonus", "entropy_window", "extremum_stats", "metric_sums",
           "metrics", "nan_extremum", "next_entropy_coef", "packed_token_mean", "reduced_metrics",
           "sequence_level_logps", "window_entropy"]
