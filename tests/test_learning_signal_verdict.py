"""What `train()` does with the learning-signal verdict (issue 27 section 4), and what counts as reward spread.

- A drop-in replacement must not raise where `GRPOTrainer` returns: TRL's own
  `test_reward_metric_reflects_reward_weights` (tests/test_grpo_trainer.py, both aggregations) trains on two constant
  rewards and expects `train()` to return and the logged reward to be the weighted 0.7. RPGTrainer returns too, with
  the verdict as a warning at the end and in `TrainOutput.metrics`.
- `rpg_require_learning_signal=True` turns the verdict into `NoLearningSignal`, after saving the final model (with
  `save_strategy="no"` too), and the error says where.
- Spread: rewards any distance apart are a signal (TRL's advantages are not 0 and the parameters move); rewards that
  are all equal are not, even where TRL's float32 group mean leaves their advantages at rounding noise.
"""

import logging
import re

import pytest
import torch
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from trl import GRPOConfig

import trl_rpg.trainers.trainer as trainer_module
from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.run.learning_signal import (
    STEPS_WITH_SIGNAL,
    TRAINED_ON_NOTHING,
    TRAINED_ON_NOTHING_REASON,
    NoLearningSignal,
)

ZERO_SPREAD = r"RPGTrainer: none of the (\d+) optimizer steps carried a learning signal \(\1 steps: zero reward spread"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def constant_reward_1(completions, **kwargs):
    return [1.0] * len(completions)


def constant_reward_0(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_trl_reward_metric_test_trains_and_returns_with_the_verdict(tmp_path, model_path, caplog, aggregation):
    """TRL's test, with the tiny local model and data (no downloads) and 3 steps: it must return, log the weighted
    reward, and say at the end that the run trained on nothing."""
    args = GRPOConfig(output_dir=str(tmp_path), learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, report_to="none", reward_weights=[0.7, 0.3],
                      multi_objective_aggregation=aggregation, max_steps=3, use_cpu=True, bf16=False)
    trainer = RPGTrainer(model=model_path, reward_funcs=[constant_reward_1, constant_reward_0], args=args,
                         train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        output = trainer.train()
    assert abs(trainer.state.log_history[-1]["reward"] - 0.7) < 1e-5  # TRL's assertion
    warnings = [r.getMessage() for r in caplog.records if "carried a learning signal" in r.getMessage()]
    assert len(warnings) == 1 and "rpg_require_learning_signal=True" in warnings[0]
    assert caplog.records[-1].getMessage() == warnings[0]  # the last thing the run says
    assert output.metrics[TRAINED_ON_NOTHING] == 1.0 and output.metrics[STEPS_WITH_SIGNAL] == 0.0
    assert "train_runtime" in output.metrics  # transformers' own metrics are still there
    assert re.match(ZERO_SPREAD, output.metrics[TRAINED_ON_NOTHING_REASON])
    assert output.metrics[TRAINED_ON_NOTHING_REASON] in warnings[0]


def test_required_learning_signal_saves_the_final_model_and_says_where(tmp_path, model_path):
    out = tmp_path / "run"
    args = RPGConfig(**cpu_args(out, max_steps=2, rpg_require_learning_signal=True))  # save_strategy="no"
    trainer = RPGTrainer(model=model_path, reward_funcs=constant_reward_1, args=args, train_dataset=tiny_dataset())
    with pytest.raises(NoLearningSignal, match=ZERO_SPREAD + rf".*The final model was saved to {out} before this "
                                                              r"error"):
        trainer.train()
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    saved = RPGTrainer(model=str(out), reward_funcs=constant_reward_1, args=args, train_dataset=tiny_dataset()).model
    assert all(torch.equal(p, saved.get_parameter(n)) for n, p in trainer.model.named_parameters())  # the trained one


def test_a_run_with_signal_reports_it_in_the_metrics(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, rpg_require_learning_signal=True))
    output = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset()).train()
    assert output.metrics[TRAINED_ON_NOTHING] == 0.0 and output.metrics[STEPS_WITH_SIGNAL] == 2.0
    assert TRAINED_ON_NOTHING_REASON not in output.metrics


def record_advantages(monkeypatch):
    seen = []
    loss = trainer_module.rpg_per_token_loss

    def recording(logps, sampling_logps, advantages, mask, **kwargs):
        seen.append(float(advantages.abs().max()))
        return loss(logps, sampling_logps, advantages, mask, **kwargs)

    monkeypatch.setattr(trainer_module, "rpg_per_token_loss", recording)
    return seen


def train(tmp_path, model_path, reward, **settings):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, **settings))
    trainer = RPGTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=tiny_dataset())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    output = trainer.train()
    moved = max((p - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    return output.metrics, moved


def test_rewards_a_millionth_apart_are_a_learning_signal(tmp_path, model_path, monkeypatch):
    """Small-scale rewards (length / 8 * 1e-6, so at most 1e-6 apart): TRL's advantages are not 0 and the parameters
    move, so the run carries signal (a tolerance of 1e-6 called it zero spread)."""
    advantages = record_advantages(monkeypatch)

    def tiny_length_reward(completions, **kwargs):
        return [1e-6 * r for r in length_reward(completions)]

    metrics, moved = train(tmp_path, model_path, tiny_length_reward)
    assert 0 < max(advantages) <= 1e-6
    assert moved > 1e-3
    assert metrics[TRAINED_ON_NOTHING] == 0.0 and metrics[STEPS_WITH_SIGNAL] == 2.0


def test_identical_rewards_are_no_signal_even_when_trl_rounds_their_advantages_to_non_zero(tmp_path, model_path,
                                                                                            monkeypatch):
    """A constant 1000.7 in groups of 8 with scale_rewards='group': TRL's float32 group mean is off by rounding, so
    its advantages are not 0 (up to 0.37 after the division by std + 1e-4); the rewards do not differ, so no
    signal."""
    advantages = record_advantages(monkeypatch)

    def constant_large(completions, **kwargs):
        return [1000.7] * len(completions)

    metrics, _ = train(tmp_path, model_path, constant_large, num_generations=8, scale_rewards="group")
    assert max(advantages) > 0.1  # TRL's rounding
    assert metrics[TRAINED_ON_NOTHING] == 1.0
    assert re.match(ZERO_SPREAD, metrics[TRAINED_ON_NOTHING_REASON])
