"""GRPOTrainer features that RPG gives a meaning keep working under RPGTrainer, and training actually learns."""

import math

import pytest
import torch
from _tiny import cpu_args, digit_reward, length_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


FEATURES = {
    "sequence_level_ratio": dict(importance_sampling_level="sequence"),
    "entropy_masking": dict(top_entropy_quantile=0.5),
    "off_policy_mask": dict(off_policy_mask_threshold=0.01),
    "gradient_checkpointing": dict(gradient_checkpointing=True),
    "entropy_bonus": dict(entropy_coef=0.01),
    "reward_weights": dict(reward_weights=[1.0, 0.5]),
    "group_scaled_rewards": dict(scale_rewards="group"),
    "num_iterations": dict(num_iterations=2, steps_per_generation=1),
    "no_dual_clip": dict(rpg_dual_clip_c=None),
    "differentiable_initial_reference": dict(rpg_estimator="differentiable", rpg_reference="initial", beta=0.1),
}


@pytest.mark.parametrize("feature", list(FEATURES))
def test_grpo_feature_trains_with_finite_loss(tmp_path, model_path, feature):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, **FEATURES[feature]))
    trainer = RPGTrainer(model=model_path, reward_funcs=[length_reward, digit_reward], args=args,
                         train_dataset=tiny_dataset(conversational=True))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_sequence_level_ratio_is_shared_by_the_tokens_of_a_sequence(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, importance_sampling_level="sequence", beta=0.0,
                                epsilon=10.0, epsilon_high=10.0, rpg_dual_clip_c=None))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    assert trainer.state.log_history[-2]["rpg/w_max"] > 1.0
    # with one ratio per sequence, the token-level statistics equal the sequence-level ones
    inputs = trainer._buffered_inputs[3]
    mask = inputs["completion_mask"].float()
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, mask.size(1))
    seq = ((logps - inputs["old_per_token_logps"]) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    trainer._metrics["train"].clear()
    trainer.compute_loss(trainer.model, inputs)
    w_mean = trainer._metrics["train"]["rpg/w_mean"][-1]
    expected = (seq.exp().unsqueeze(1) * mask).sum() / mask.sum()
    assert w_mean == pytest.approx(expected.item(), rel=1e-5)


def test_reward_improves_on_a_small_task(tmp_path, model_path):
    """A tiny random model learns to emit digits (reward = digit fraction) within a few dozen CPU steps."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=32, learning_rate=3e-2, per_device_train_batch_size=16,
                                num_generations=8, steps_per_generation=2, beta=1e-3, seed=1))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args,
                         train_dataset=tiny_dataset(64))
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.2, (first, last)
