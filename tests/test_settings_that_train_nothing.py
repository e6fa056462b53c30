"""Settings that train nothing, silently (issue 26, section 3): a clip width float32 cannot tell apart from 0 is
refused, naming the smallest accepted width; an optimizer step whose gradient is exactly 0 counts as a step without
learning signal; an evaluation set without the column a reward function reads is refused, naming the set and the
column, as the training set is."""

import re

import pytest
import torch
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from datasets import Dataset
from trl import GRPOConfig

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.objectives.per_token import rpg_per_token_loss
from trl_rpg.rewards import math_reward
from trl_rpg.run.learning_signal import SKIPPED, ZERO_GRADIENT, ZERO_SPREAD, BatchFacts, SignalTally
from trl_rpg.trainers.config import MIN_CLIP_WIDTH


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


# --- clip widths below float32's resolution -------------------------------------------------------------------------


def test_the_smallest_clip_width_is_float32s_resolution_at_one():
    one = torch.ones((), dtype=torch.float32)
    assert MIN_CLIP_WIDTH == torch.finfo(torch.float32).eps  # 2^-23
    assert one + MIN_CLIP_WIDTH > one and one - MIN_CLIP_WIDTH < one
    assert one + 1e-8 == one and one - 1e-8 == one  # the width: both bounds are 1 itself


@pytest.mark.parametrize("field", ["epsilon", "epsilon_high"])
def test_a_clip_width_float32_cannot_resolve_is_refused_naming_the_smallest(tmp_path, field):
    widths = {"epsilon": 0.2, "epsilon_high": 0.28, field: 1e-8}
    where = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False}
    with pytest.raises(ValueError, match=rf"RPGConfig: `{field}`=1e-08 is not allowed; it must be at least "
                                         r"1.19e-07 \(2\^-23"):
        RPGConfig(**where, **widths)
    with pytest.raises(ValueError, match=rf"`{field}`=1e-08 is not allowed"):  # a GRPO script's config, upgraded
        RPGConfig.from_grpo_config(GRPOConfig(**where, **widths))
    RPGConfig(**where, **{**widths, field: MIN_CLIP_WIDTH})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_at_the_smallest_width_on_policy_tokens_keep_their_gradient(dtype):
    """RPG compares w with the clip bounds in float32 whatever the log-probs' dtype (bfloat16 ones are upcast): at
    1e-8 every on-policy token (w = 1) is on the boundary and the default estimator's gradient is 0; at
    `MIN_CLIP_WIDTH` it is the unclipped gradient."""
    logps = (-torch.rand(4, 6) - 0.5).to(dtype)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def gradient(width):
        x = logps.clone().requires_grad_(True)
        clip = {} if width is None else {"epsilon_low": width, "epsilon_high": width}
        loss, _ = rpg_per_token_loss(x, x.detach(), advantages, torch.ones(4, 6), beta=0.0, **clip)
        loss.sum().backward()
        return x.grad.float()

    assert torch.count_nonzero(gradient(1e-8)) == 0
    assert torch.count_nonzero(gradient(None)) == logps.numel()
    assert torch.equal(gradient(MIN_CLIP_WIDTH), gradient(None))


# --- a gradient exactly zero ---------------------------------------------------------------------------------------

SIGNAL = BatchFacts(groups=2, groups_with_spread=1, tokens=10, tokens_with_advantage=4)
FLAT = BatchFacts(groups=2, groups_with_spread=0, tokens=10, tokens_with_advantage=0)


def test_a_step_whose_gradient_is_exactly_zero_carries_no_signal():
    tally = SignalTally()
    tally.add_batch(SIGNAL)
    tally.end_step(skipped=False, zero_gradient=True)
    tally.add_batch(FLAT)
    tally.end_step(skipped=False, zero_gradient=True)  # the batch is the root cause: it comes first
    tally.add_batch(SIGNAL)
    tally.end_step(skipped=True, zero_gradient=False)
    assert tally.causes == {ZERO_GRADIENT: 1, ZERO_SPREAD: 1, SKIPPED: 1} and tally.steps_with_signal == 0
    tally.add_batch(SIGNAL)
    tally.end_step(skipped=False, zero_gradient=False)
    assert tally.steps_with_signal == 1


def test_a_run_whose_every_gradient_is_exactly_zero_fails(tmp_path, model_path):
    """The issue's run: clip widths of 1e-8 (set on the trainer, past the config's refusal) put every on-policy
    token on the clip boundary; every `grad_norm` is 0.0, and the run must not be reported as having trained."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, rpg_generation_reuse=1, beta=0.0))  # every step on-policy
    trainer = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.epsilon_low = trainer.epsilon_high = 1e-8
    verdict = trainer.train().metrics
    assert verdict["rpg/trained_on_nothing"] == 1.0
    assert re.search(r"none of the 2 optimizer steps carried a learning signal \(2 steps: gradient exactly 0\)",
                     verdict["rpg/trained_on_nothing_reason"])
    assert [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h] == [0.0, 0.0]


# --- evaluation sets -----------------------------------------------------------------------------------------------


def with_answers(n: int) -> Dataset:
    return tiny_dataset(n).add_column("answer", ["1"] * n)


def test_an_eval_set_without_a_reward_column_is_refused_naming_it(tmp_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, steps_per_generation=2, eval_strategy="steps", eval_steps=1))
    rewards = [math_reward, length_reward]
    with pytest.raises(ValueError, match=r"`eval_dataset` lacks the columns its reward functions read: reward "
                                         r"function 'math_reward' reads one of the columns \['ground_truth', "
                                         r"'reward_model', 'answer'\]; `eval_dataset` has the columns \['prompt'\]"):
        RPGTrainer(model="no-model-is-loaded", reward_funcs=rewards, args=args, train_dataset=with_answers(16),
                   eval_dataset=tiny_dataset(8))
    with pytest.raises(ValueError, match=r"`eval_dataset\['aime'\]` lacks the columns"):  # a dict of eval sets
        RPGTrainer(model="no-model-is-loaded", reward_funcs=rewards, args=args, train_dataset=with_answers(16),
                   eval_dataset={"gsm8k": with_answers(8), "aime": tiny_dataset(8)})
    with pytest.raises(ValueError, match=r"`eval_dataset\['aime'\]` has no 'prompt' column"):
        RPGTrainer(model="no-model-is-loaded", reward_funcs=rewards, args=args, train_dataset=with_answers(16),
                   eval_dataset={"aime": with_answers(8).rename_column("prompt", "problem")})
