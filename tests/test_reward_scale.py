"""Issue 29 section 2: with RPG's `scale_rewards="none"` the advantages are `reward - group mean`, so a reward outside
[0, 1] (a length, a count) scales the loss and gradient with it. The start-up line says so, and the trainer warns once
when the first batch's median in-group reward std is far from 1 (`trl_rpg.run.reward_scale`); the usual reward kinds
(0/1 in groups of any size, +-1, scores in [0, 1], unscored rows, constant groups) never trigger it."""

import logging

import pytest
import torch
from _tiny import cpu_args, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.run.reward_scale import HIGH, LOW, RewardScaleCheck, batch_reward_scale
from trl_rpg.trainers.describe import describe_objective

WARNING = "RPGTrainer: the advantages are far from unit scale"
ONE = torch.ones(1)


def warning_for(rewards, group, weights=ONE, aggregation="sum_then_normalize"):
    """The warning for one batch of gathered `(N,)` or `(N, F)` rewards (None when there is none)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    rewards = rewards.unsqueeze(1) if rewards.dim() == 1 else rewards
    check = RewardScaleCheck(checked=True, beta=1e-4, max_grad_norm=1.0)
    return check.add([rewards], weights, group, aggregation)


def one_success_per_group(group, groups=4):
    """0/1 rewards at the smallest spread a 0/1 reward can have: one success per group (std sqrt(G - 1) / G)."""
    return torch.tensor(([1.0] + [0.0] * (group - 1)) * groups)


def usual_reward_batches():
    generator = torch.Generator().manual_seed(0)
    batches = {f"0/1, one success in {g}": (one_success_per_group(g), g) for g in (2, 4, 16, 64, 1024)}
    batches.update({f"0/1, one failure in {g}": (1 - one_success_per_group(g), g) for g in (2, 16, 1024)})
    binary = (torch.rand(64, generator=generator) < 0.3).float()
    batches["0/1, random"] = (binary, 8)
    batches["+-1"] = (2 * binary - 1, 8)
    batches["+-1, one success in 1024"] = (2 * one_success_per_group(1024) - 1, 1024)
    batches["score in [0, 1]"] = (torch.rand(64, generator=generator), 8)
    batches["score in [0, 10]"] = (10 * torch.rand(64, generator=generator), 8)
    unscored = binary.clone()
    unscored[::3] = float("nan")  # TRL's None: left out of the group statistics
    batches["0/1 with unscored rows"] = (unscored, 8)
    lengths = torch.tensor([400.0] * 56 + [1.0, 0.0] * 4)  # most groups constant (and large): no advantage at all
    batches["constant groups of a large reward, 0/1 elsewhere"] = (lengths, 8)
    return batches


@pytest.mark.parametrize("name", list(usual_reward_batches()))
def test_usual_rewards_never_warn(name):
    rewards, group = usual_reward_batches()[name]
    scale, _ = batch_reward_scale([rewards.unsqueeze(1)], ONE, group, "sum_then_normalize")
    assert LOW <= scale <= HIGH
    assert warning_for(rewards, group) is None


def test_weighted_binary_rewards_of_two_functions_do_not_warn():
    rewards = torch.stack([torch.tensor([1.0, 0.0] * 16), torch.tensor([0.0, 1.0, 1.0, 1.0] * 8)], dim=1)
    assert warning_for(rewards, 4, weights=torch.tensor([1.0, 0.5])) is None


def completion_lengths(groups=8, group=8):
    """Character lengths of completions: a typical len(completion) reward (TRL's quick start)."""
    generator = torch.Generator().manual_seed(1)
    return torch.randint(50, 400, (groups * group,), generator=generator).float()


def test_reward_far_above_unit_scale_warns_naming_the_settings():
    text = warning_for(completion_lengths(), 8)
    assert text is not None and text.startswith(WARNING)
    for part in ("scale_rewards='none'", "scale_rewards='group'", "scale_rewards='batch'", "beta=0.0001",
                 "max_grad_norm=1.0", "over the 8 group(s)"):
        assert part in text, part


def test_reward_far_below_unit_scale_warns():
    tiny = 1e-3 * torch.tensor([1.0, 0.0] * 16)  # std 5e-4
    text = warning_for(tiny, 4)
    assert text is not None and "as much against the reward" in text
    assert warning_for(tiny * 100, 4) is None  # the same reward at 0/1 scale


def test_normalised_advantages_are_not_checked(tmp_path):
    for settings in (dict(scale_rewards="group"), dict(scale_rewards="batch"),
                     dict(multi_objective_aggregation="normalize_then_sum")):
        check = RewardScaleCheck.for_args(RPGConfig(**cpu_args(tmp_path, **settings)))
        assert check.add([completion_lengths().unsqueeze(1)], ONE, 8, "sum_then_normalize") is None
    assert RewardScaleCheck.for_args(RPGConfig(**cpu_args(tmp_path))).checked  # RPG's default is checked


def test_check_reads_the_first_batch_whose_rewards_differ_once():
    check = RewardScaleCheck(checked=True, beta=1e-4, max_grad_norm=1.0)
    large = completion_lengths().unsqueeze(1)
    assert check.add([torch.full((16, 1), 300.0)], ONE, 8, "sum_then_normalize") is None  # no spread: not read
    assert check.add([large], ONE, 8, "sum_then_normalize").startswith(WARNING)
    assert check.add([large], ONE, 8, "sum_then_normalize") is None  # once


def test_dynamic_sampling_rounds_are_read_together():
    rounds = [torch.full((16, 1), 7.0), completion_lengths(2, 8).unsqueeze(1)]
    assert batch_reward_scale(rounds, ONE, 8, "sum_then_normalize")[1] == 2


def test_start_up_line_says_the_advantages_are_not_divided_by_the_std(tmp_path):
    default = describe_objective(RPGConfig(**cpu_args(tmp_path)))
    assert "scale_rewards='none': not divided by the std" in default and "rewards in [0, 1]" in default
    assert "not divided" not in describe_objective(RPGConfig(**cpu_args(tmp_path, scale_rewards="group")))


def score_out_of_100(completions, **kwargs):
    """A score out of 100 (std 50 in every group of an even size)."""
    return [100.0 * (i % 2) for i in range(len(completions))]


def pass_fail(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]


def test_training_warns_once_for_a_reward_out_of_100_and_not_for_a_0_1_reward(tmp_path, caplog):
    model = save_tiny_model(str(tmp_path / "model"))
    for reward, expected in ((score_out_of_100, 1), (pass_fail, 0)):
        args = RPGConfig(**cpu_args(tmp_path / reward.__name__, max_steps=2, rpg_generation_reuse=1, beta=0.0))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="trl_rpg"):
            RPGTrainer(model=model, reward_funcs=reward, args=args, train_dataset=tiny_dataset()).train()
        warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith(WARNING)]
        assert len(warned) == expected, (reward.__name__, warned)  # two generation batches, one warning
        if expected:
            assert "median reward std within a group is 50" in warned[0]
