"""Bad data and misbehaving reward functions: a documented meaning, or an error naming the function and the row;
numerical faults never reach the optimizer silently."""

import math

import pytest
import torch
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from datasets import Dataset
from transformers import TrainerCallback

from trl_rpg import RPGConfig, RPGTrainer


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def make(model_path, tmp_path, reward=length_reward, dataset=None, **overrides):
    args = RPGConfig(**cpu_args(tmp_path, **{"max_steps": 2, **overrides}))
    return RPGTrainer(model=model_path, reward_funcs=reward, args=args,
                      train_dataset=dataset if dataset is not None else tiny_dataset())


@pytest.mark.parametrize(
    "dataset,match",
    [
        (Dataset.from_dict({"question": ["1+1"] * 8}), "no 'prompt' column"),
        (Dataset.from_dict({"prompt": ["1+1"] * 5 + ["  "] + ["2+2"] * 2}), "row 5: the prompt is empty"),
        (Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}]] * 3
                            + [[{"role": "robot", "content": "1+1"}]]}), "row 3, message 0: role 'robot'"),
        (Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}], []]}), "row 1"),
    ],
)
def test_bad_data_set_is_rejected_before_any_compute(tmp_path, dataset, match):
    with pytest.raises(ValueError, match=match):
        # the model path does not even exist: the data check comes first
        make(str(tmp_path / "no-model-here"), tmp_path, dataset=dataset)


def test_reward_function_that_raises_is_named_with_its_row(tmp_path, model_path):
    def picky_reward(completions, prompts, **kwargs):
        return [1 / (int(p[0]) % 2) for p in prompts]  # fails on prompts starting with an even digit

    trainer = make(model_path, tmp_path, reward=picky_reward)
    with pytest.raises(RuntimeError, match=r"Reward function `picky_reward` raised ZeroDivisionError.*row \d+ "
                                           r"\(prompt: '[02468]"):
        trainer.train()


def test_reward_function_with_wrong_length_is_named(tmp_path, model_path):
    def short_reward(completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    with pytest.raises(ValueError, match="`short_reward` returned 31 rewards for 32 completions"):
        make(model_path, tmp_path, reward=short_reward).train()


def test_infinite_reward_is_rejected_with_its_row(tmp_path, model_path):
    def wild_reward(completions, **kwargs):
        return [math.inf if i == 3 else 0.5 for i in range(len(completions))]

    with pytest.raises(ValueError, match="`wild_reward` returned inf for row 3"):
        make(model_path, tmp_path, reward=wild_reward).train()


def test_none_and_nan_rewards_mean_not_scored(tmp_path, model_path):
    """TRL's convention: None (and NaN, treated the same) means not scored; such completions get zero advantage and
    training goes on with finite parameters."""

    def partial_reward(completions, **kwargs):
        out = length_reward(completions)
        return [None if i % 4 == 0 else (math.nan if i % 4 == 1 else r) for i, r in enumerate(out)]

    trainer = make(model_path, tmp_path, reward=partial_reward)
    trainer.train()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    advantages = torch.cat([b["advantages"] for b in trainer._buffered_inputs])
    assert torch.isfinite(advantages).all()


def test_nan_sampling_logprobs_are_excluded_and_counted(tmp_path, model_path):
    """Tokens a generator could not score (NaN log-prob) are dropped from the loss and counted in the logs."""
    trainer = make(model_path, tmp_path, max_steps=3, steps_per_generation=4)
    original = trainer._generate_and_score_completions

    def corrupt(inputs):
        out = original(inputs)
        out["old_per_token_logps"][0, 0] = float("nan")
        out["old_per_token_logps"][1, 0] = float("inf")
        return out

    trainer._generate_and_score_completions = corrupt
    trainer.train()
    excluded = [h["rpg/excluded_tokens"] for h in trainer.state.log_history if "rpg/excluded_tokens" in h]
    assert sum(excluded) >= 1  # the corrupted rows land in some micro-batch of the reused generation batch
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)


def test_nan_advantages_are_excluded(tmp_path, model_path):
    trainer = make(model_path, tmp_path, max_steps=2, steps_per_generation=2)
    original = trainer._generate_and_score_completions

    def corrupt(inputs):
        out = original(inputs)
        out["advantages"][:3] = float("nan")
        return out

    trainer._generate_and_score_completions = corrupt
    trainer.train()
    excluded = sum(h.get("rpg/excluded_tokens", 0) for h in trainer.state.log_history)
    assert excluded > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_non_finite_gradient_skips_the_optimizer_step(tmp_path, model_path):
    trainer = make(model_path, tmp_path, max_steps=3, steps_per_generation=3, max_grad_norm=0.0)

    class PoisonGradients(TrainerCallback):
        """Stands in for a numerical blow-up in the backward pass at step 2."""

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == 1:
                next(p for p in trainer.model.parameters() if p.grad is not None).grad[0] = float("nan")

    # must run before the guard: insert it first in the callback list
    trainer.callback_handler.callbacks.insert(0, PoisonGradients())
    snapshots = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            snapshots.append([p.detach().clone() for p in trainer.model.parameters()])

    trainer.add_callback(Snapshot())
    trainer.train()
    assert trainer._rpg_skipped_steps == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(snapshots[0], snapshots[1]))  # step 2 changed nothing
    assert any(not torch.equal(a, b) for a, b in zip(snapshots[1], snapshots[2]))  # step 3 trained again
    assert any("rpg/skipped_steps" in h for h in trainer.state.log_history)
