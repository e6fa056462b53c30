"""Which prompt groups carry a learning signal: under a group baseline a group whose rewards do not vary has
advantage 0 everywhere (`group_reward_signal`, read from the rewards gathered over every process). Dynamic sampling
(`trl_rpg.dynamic_sampling.sampling`) keeps the groups it finds informative; the learning-signal verdicts
(`trl_rpg.run.learning_signal`) and the reward-scale check (`trl_rpg.run.reward_scale`) read it too.
"""

from __future__ import annotations

import math

import torch

__all__ = ["RTOL", "group_reward_signal"]

#: Relative tolerance of "zero variance": a group is constant when max - min <= RTOL * max(1, max |reward|).
RTOL = 1e-6


def _constant(values: torch.Tensor, valid: torch.Tensor, rtol: float = RTOL) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of `values` (groups x G), whether its valid entries are constant (or fewer than 2), and their
    population std (0 for constant rows)."""
    count = valid.sum(-1)
    hi = torch.where(valid, values, torch.full_like(values, -math.inf)).amax(-1)
    lo = torch.where(valid, values, torch.full_like(values, math.inf)).amin(-1)
    scale = torch.where(valid, values.abs(), torch.zeros_like(values)).amax(-1).clamp(min=1.0)
    constant = (count < 2) | ((hi - lo) <= rtol * scale)
    zeros = torch.zeros_like(values)
    mean = torch.where(valid, values, zeros).sum(-1, keepdim=True) / count.clamp(min=1).unsqueeze(-1)
    var = torch.where(valid, (values - mean) ** 2, zeros).sum(-1) / count.clamp(min=1)
    std = torch.where(constant, torch.zeros_like(var), var.sqrt())
    return constant, std


def group_reward_signal(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, num_generations: int,
    aggregation: str = "sum_then_normalize", rtol: float = RTOL,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which groups carry a learning signal, from the rewards of the whole (gathered) batch.

    Args:
        rewards_per_func: `(N, F)` rewards of N completions (N a multiple of `num_generations`, groups contiguous)
            under F reward functions; NaN where a function gave no reward (TRL's `None`).
        reward_weights: `(F,)` weights of the reward functions.
        aggregation: TRL's `multi_objective_aggregation`. `"sum_then_normalize"`: the group's reward is the weighted
            sum of the functions (NaN when every function gave None) and the group is kept iff that reward varies.
            `"normalize_then_sum"`: each function is normalised within the group first, so the group is kept iff the
            weighted sum of the normalised rewards varies (a function constant in the group contributes 0).

    Returns:
        `(informative, spread)`: bool `(N // G,)`, True for groups whose reward variance is non-zero (up to float
        rounding: max - min <= `rtol` * max(1, max |reward|) counts as constant; fewer than two scored completions
        count as constant); and float `(N // G,)`, the std of the group's reward (0 when not informative).
    """
    if rewards_per_func.dim() != 2 or rewards_per_func.size(0) % num_generations:
        raise ValueError(f"rewards_per_func must be (N, F) with N a multiple of num_generations={num_generations}, "
                         f"got {tuple(rewards_per_func.shape)}.")
    rpf = rewards_per_func.detach().double().cpu()
    weights = reward_weights.detach().double().cpu()
    grouped = rpf.view(-1, num_generations, rpf.size(1))  # (groups, G, F)
    scored = ~torch.isnan(grouped).all(-1)  # (groups, G): at least one function gave a reward
    if aggregation == "sum_then_normalize":
        rewards = (torch.nan_to_num(grouped, nan=0.0) * weights).sum(-1)
    elif aggregation == "normalize_then_sum":
        per_func = grouped.transpose(1, 2)  # (groups, F, G)
        valid = ~torch.isnan(per_func)
        constant, _ = _constant(per_func, valid, rtol)
        count = valid.sum(-1, keepdim=True).clamp(min=1)
        mean = torch.where(valid, per_func, torch.zeros_like(per_func)).sum(-1, keepdim=True) / count
        var = torch.where(valid, (per_func - mean) ** 2, torch.zeros_like(per_func)).sum(-1, keepdim=True) / count
        normalised = torch.where(valid & ~constant.unsqueeze(-1), (per_func - mean) / (var.sqrt() + 1e-4),
                                 torch.zeros_like(per_func))
        rewards = (normalised * weights.view(1, -1, 1)).sum(1)  # (groups, G)
    else:
        raise ValueError(f"Unknown multi_objective_aggregation {aggregation!r}.")
    constant, spread = _constant(rewards, scored, rtol)
    return ~constant, spread.float()
