"""A GRPO user's metrics and dashboards keep working: RPG logs TRL's metric names (with their closest RPG meaning)
as well as `rpg/*`, and where RPG reduces to GRPO (beta = 0, differentiable estimator, no dual clip) TRL's names carry
TRL's values. TRL's adaptive entropy controller works under RPG as under GRPO."""

import pytest
from _equivalence import (
    FixedGRPOTrainer,
    FixedRPGTrainer,
    base_settings,
    config_pair,
    logged,
    make_trainer,
    max_difference,
    parameters,
    prompts,
)
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer

TRL_NAMES = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
             "clip_ratio/high_max", "entropy", "policy_loss", "entropy_coef")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def train_pair(tmp_path, model_dir, **overrides):
    grpo_args, rpg_args = config_pair(tmp_path, base_settings(**overrides))
    grpo = make_trainer(FixedGRPOTrainer, model_dir, grpo_args, prompts(32))
    grpo.train()
    rpg = make_trainer(FixedRPGTrainer, model_dir, rpg_args, prompts(32))
    rpg.train()
    return grpo, rpg


def test_trl_metric_names_carry_trl_values_where_rpg_reduces_to_grpo(tmp_path, model_dir):
    # asymmetric advantages (scale_rewards="none") and a large step: ratios leave the trust region on both sides
    grpo, rpg = train_pair(tmp_path, model_dir, entropy_coef=0.01, scale_rewards="none", learning_rate=1.0)
    for key in TRL_NAMES:
        want, got = logged(grpo, key), logged(rpg, key)
        assert want and got.keys() == want.keys(), key
        for step in want:
            assert got[step] == pytest.approx(want[step], rel=1e-4, abs=1e-6), (key, step)
    assert max(logged(grpo, "clip_ratio/region_mean").values()) > 0  # the comparison saw clipped tokens
    assert max(logged(grpo, "clip_ratio/high_max").values()) > 0
    assert max_difference(parameters(grpo), parameters(rpg)) < 1e-5


def test_rpg_metrics_and_their_trl_names(tmp_path, model_dir):
    """Default RPG (REINFORCE, URKL, beta > 0): TRL's names are logged next to `rpg/*` and mean the same thing."""
    args = RPGConfig(**{**base_settings(scale_rewards="none", learning_rate=1.0, beta=0.05),
                        "output_dir": str(tmp_path / "rpg")})
    trainer = make_trainer(FixedRPGTrainer, model_dir, args, prompts(32))
    trainer.train()
    for entry in (e for e in trainer.state.log_history if "rpg/divergence" in e):
        for key in ("rpg/w_mean", "rpg/w_max", "rpg/clip_frac_high", "rpg/clip_frac_low", "rpg/clip_frac_dual",
                    "rpg/excluded_tokens", "rpg/reference_updates", "entropy", "policy_loss", "kl",
                    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
                    "clip_ratio/high_max"):
            assert key in entry, key
        assert entry["kl"] == entry["rpg/divergence"]
        assert entry["clip_ratio/high_mean"] == entry["rpg/clip_frac_high"]
        assert entry["clip_ratio/low_mean"] == entry["rpg/clip_frac_low"]
        clipped = entry["rpg/clip_frac_high"] + entry["rpg/clip_frac_low"]
        assert entry["clip_ratio/region_mean"] == pytest.approx(clipped)
        assert entry["clip_ratio/high_max"] >= entry["clip_ratio/high_mean"]
        assert entry["clip_ratio/low_min"] <= entry["clip_ratio/low_mean"]
        assert entry["rpg/w_p01"] <= entry["rpg/w_mean"] <= entry["rpg/w_max"]
        assert entry["rpg/w_p99"] <= entry["rpg/w_max"]
    assert max(e.get("clip_ratio/high_mean", 0) for e in trainer.state.log_history) > 0


def test_kl_is_logged_only_with_a_kl_term(tmp_path, model_dir):
    args = RPGConfig(**{**base_settings(max_steps=2), "output_dir": str(tmp_path / "rpg")})  # beta = 0
    trainer = make_trainer(FixedRPGTrainer, model_dir, args, prompts(32))
    trainer.train()
    assert not any("kl" in e for e in trainer.state.log_history)


def test_adaptive_entropy_controller_works_as_in_grpo(tmp_path, model_dir):
    """`use_adaptive_entropy` (TRL's controller) is independent of the policy loss: the coefficient follows the same
    trajectory and the model trains to the same parameters as under GRPOTrainer."""
    grpo, rpg = train_pair(tmp_path, model_dir, use_adaptive_entropy=True, entropy_coef=0.01, entropy_target=3.7,
                           entropy_coef_delta=0.005, entropy_coef_min=0.0, entropy_coef_max=0.05)
    coefficients = logged(grpo, "entropy_coef")
    assert logged(rpg, "entropy_coef") == pytest.approx(coefficients)
    assert len(set(coefficients.values())) > 1  # the controller did move the coefficient
    assert max_difference(parameters(grpo), parameters(rpg)) < 1e-5


def test_ratio_quantiles_are_nearest_rank_over_valid_tokens():
    import torch

    from trl_rpg.objectives.per_token import rpg_per_token_loss

    w = torch.arange(1, 202, dtype=torch.float64) / 100  # 0.01 .. 2.01, 201 tokens
    logp = w.log().reshape(1, -1)
    mask = torch.ones_like(logp)
    mask[0, -1] = 0  # the largest ratio is masked out: 200 valid tokens, 0.01 .. 2.00
    _, stats = rpg_per_token_loss(logp, torch.zeros_like(logp), torch.zeros(1, dtype=torch.float64), mask)
    assert stats["w_p01"].item() == pytest.approx(0.03)  # rank round(0.01 * 199) = 2
    assert stats["w_p99"].item() == pytest.approx(1.98)  # rank round(0.99 * 199) = 197
    _, empty = rpg_per_token_loss(logp, torch.zeros_like(logp), torch.zeros(1, dtype=torch.float64),
                                  torch.zeros_like(logp))
    assert torch.isnan(empty["w_p01"]) and torch.isnan(empty["w_p99"])


def test_reward_of_the_batch_trained_on_is_logged_at_every_step(tmp_path, model_dir):
    """With each generation batch reused for 4 optimizer steps, TRL logs `reward`, `completions/*` and `num_tokens`
    only on the step that generated the batch; RPGTrainer logs them on every step, with the values of the batch that
    step trained on (so reward curves are not sparse)."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=8, rpg_generation_reuse=4, logging_steps=1))
    trainer = RPGTrainer(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 8
    for key in ("reward", "reward_std", "rewards/length_reward/mean", "completions/mean_length", "num_tokens"):
        assert all(h.get(key) is not None for h in steps), key
    for first in (0, 4):  # steps 1-4 train on the first batch, 5-8 on the second
        assert len({steps[i]["reward"] for i in range(first, first + 4)}) == 1
    assert steps[0]["num_tokens"] < steps[4]["num_tokens"]


def test_dynamic_sampling_events_are_logged_once_per_batch(tmp_path, model_dir):
    """`dynamic_sampling/*` counts what one generation step did (rounds, exhausted...): it is not repeated on the
    steps that reuse the batch, so summing it over log lines counts each batch once."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=8, rpg_generation_reuse=4, logging_steps=1, dynamic_sampling=True,
                                dynamic_sampling_max_rounds=2))
    trainer = RPGTrainer(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    with_rounds = [h["step"] for h in trainer.state.log_history if "dynamic_sampling/rounds" in h]
    assert with_rounds == [1, 5]
