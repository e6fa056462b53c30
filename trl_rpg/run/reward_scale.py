"""Whether a run's advantages are far from unit scale: RPG's `scale_rewards="none"` does not divide by the std.

Notation: a group is the `G = num_generations` completions of one prompt, `r` their (weighted) rewards, `std` the
group's reward std over its scored completions. GRPO's default `scale_rewards="group"` trains on
`A = (r - mean) / std`, of unit scale whatever the reward; RPG's default `"none"` (the paper's baseline) on
`A = r - mean`, so every policy-gradient term, the loss and the gradient are `std` times GRPO's, and `beta`
weighs `1 / std` as much against the reward (the KL term does not scale with it). RPG's defaults (`beta=1e-4`,
`max_grad_norm=1.0`) are the paper's, set for its +-1 accuracy reward (`paper_math_reward`; 0/1 halves the
advantages: docs/rewards.md).

The scale of a batch is the median `std` over its groups whose rewards differ (`group_signal.group_reward_signal`;
constant groups have no advantage at all). It is read once, on the first training batch that has such a group, and
warns when it lies outside `[LOW, HIGH]`. Measured on the test suite's tiny random model (8 completions per group,
up to 32 tokens), the first step's gradient norm under `"none"` over that under `"group"` was 1.0-1.3x the median
`std`: `len(completion)` 16.4 (grad norm 13.0 vs 0.70), the number of distinct letters 5.3 (3.6 vs 0.67), 0/1
rewards 0.43, +-1 rewards 0.87, the fraction of digits, in [0, 1], 0.029 (0.034 vs 0.92). The bounds:

- Rewards in [0, 1] have `std <= 0.5` and +-1 rewards `std <= 1`: never above `HIGH = 10`. A reward whose in-group
  std exceeds 10 (a length, a count, a 0-100 score) trains with a step 10x GRPO's or more, bounded only by
  `max_grad_norm`, and a KL term a tenth as strong or less.
- A 0/1 reward's std is `sqrt(p (1 - p))` for `p` the group's success rate, smallest with one success or one failure:
  `sqrt(G - 1) / G`, 0.24 for G = 16, 0.12 for G = 64, 0.031 for G = 1024; `LOW = 0.01` is below that for any
  group of fewer than 10,000 completions, and 3x below the digit-fraction reward of an untrained model. Below it the
  reward's signal is a hundredth of GRPO's or less and `beta`'s weight a hundred times its setting.
- With `scale_rewards="group"` or `"batch"`, or `multi_objective_aggregation="normalize_then_sum"` (which divides by
  the batch std), the advantages have unit scale by construction and nothing is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .group_signal import group_reward_signal

__all__ = ["HIGH", "LOW", "RewardScaleCheck", "batch_reward_scale", "scale_is_checked", "scale_warning",
           "startup_note"]

#: Median in-group reward std above which the warning fires (10x the unit scale of GRPO's advantages).
HIGH = 10.0
#: Median in-group reward std below which the warning fires (a hundredth of the unit scale).
LOW = 0.01


def scale_is_checked(scale_rewards: str, aggregation: str) -> bool:
    """True when the advantages are `r - mean` without any std division: `scale_rewards="none"` with TRL's default
    `multi_objective_aggregation="sum_then_normalize"`."""
    return scale_rewards == "none" and aggregation == "sum_then_normalize"


def startup_note(scale_rewards: str, aggregation: str = "sum_then_normalize") -> str:
    """The start-up line's clause on the advantage scale ("" when the advantages are normalised)."""
    if not scale_is_checked(scale_rewards, aggregation):
        return ""
    return ("not divided by the std, so the loss and gradient scale with the rewards and beta is set for rewards "
            "in [0, 1]; for a length, a count or a score out of 100 set scale_rewards='group', GRPO's default")


def batch_reward_scale(rewards_per_round: Sequence[torch.Tensor], reward_weights: torch.Tensor,
                       num_generations: int, aggregation: str) -> tuple[float, int] | None:
    """`(median std, groups)` over the groups whose rewards differ, in every round of one training batch (the
    gathered `(N, F)` rewards of each round, the same on every process); None when no group's rewards differ."""
    spreads = []
    for rewards in rewards_per_round:
        informative, spread = group_reward_signal(rewards, reward_weights, num_generations, aggregation)
        spreads.append(spread[informative])
    spread = torch.cat(spreads) if spreads else torch.zeros(0)
    if spread.numel() == 0:
        return None
    return float(spread.double().median()), spread.numel()


def scale_warning(scale: float, groups: int, beta: float, max_grad_norm: float | None) -> str | None:
    """The warning for a batch whose median in-group reward std is `scale` (over `groups` groups), or None when it
    lies in `[LOW, HIGH]`."""
    if LOW <= scale <= HIGH:
        return None
    seen = (f"the median reward std within a group is {scale:.3g} (over the {groups} group(s) of the first training "
            f"batch whose rewards differ)")
    if scale > HIGH:
        effect = (f"so the loss and the gradient are ~{scale:.3g}x what GRPOTrainer's default scale_rewards='group' "
                  f"gives (only max_grad_norm={max_grad_norm} bounds a step) and beta={beta} weighs ~1/{scale:.3g} "
                  "as much against the reward as with rewards in [0, 1]")
    else:
        effect = (f"so the reward's share of the loss and gradient is ~{scale:.3g}x what GRPOTrainer's default "
                  f"scale_rewards='group' gives, and beta={beta} weighs ~{1 / scale:.3g}x as much against the reward "
                  "as with rewards in [0, 1]")
    return (f"RPGTrainer: the advantages are far from unit scale. With scale_rewards='none' (RPG's default, the "
            f"paper's) the advantage is reward - group mean, not divided by the std, and {seen}, {effect}. Rescale "
            "the reward to about [0, 1], or set scale_rewards='group' (GRPO's default: divide by each group's std) "
            "or scale_rewards='batch' (by the batch's std), or scale beta with the reward.")


@dataclass
class RewardScaleCheck:
    """Reads the first training batch whose rewards differ within a group, once per `train()` call; the trainer
    calls `add` for every training batch and logs what it returns."""

    checked: bool  #: False when `scale_is_checked` is: nothing to read
    beta: float
    max_grad_norm: float | None
    done: bool = False

    @classmethod
    def for_args(cls, args) -> RewardScaleCheck:
        return cls(scale_is_checked(args.scale_rewards, args.multi_objective_aggregation), args.beta,
                   args.max_grad_norm)

    def add(self, rewards_per_round: Sequence[torch.Tensor], reward_weights: torch.Tensor, num_generations: int,
            aggregation: str) -> str | None:
        """The warning, on the first batch with a group whose rewards differ (None on every other call)."""
        if self.done or not self.checked:
            return None
        measured = batch_reward_scale(rewards_per_round, reward_weights, num_generations, aggregation)
        if measured is None:
            return None
        self.done = True
        return scale_warning(*measured, self.beta, self.max_grad_norm)
