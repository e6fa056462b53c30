"""Issue 19 section 1: a GRPO user's `beta` keeps its meaning after the swap, and a run says what it optimises.

- `RPGTrainer(..., args=GRPOConfig(beta > 0))` regularises towards the initial model, as GRPOTrainer does: it
  trains to other parameters than `beta = 0`, and to exactly those of an explicit `rpg_reference="initial"`.
  (Before: the upgraded config took RPG's sampler reference with GRPO's on-policy layout, so w = 1, log r = 0 and
  `beta` changed nothing: max parameter difference 0.0.)
- An `RPGConfig` whose KL term has zero expected gradient by construction warns at construction, naming the fields.
- `train()` logs one line with the divergence, estimator, beta, reference, batch reuse, clip and advantage scaling.
"""

import logging
import warnings

import pytest
import torch
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from trl import GRPOConfig

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.trainers.describe import describe_objective, kl_term_is_inert


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def train(tmp_path, model_path, args):
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    return trainer, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def max_difference(a, b):
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_upgraded_grpo_beta_regularises_towards_the_initial_model(tmp_path, model_path):
    settings = dict(max_steps=3, learning_rate=0.1, save_strategy="no")
    trainer, with_beta = train(tmp_path, model_path, GRPOConfig(**cpu_args(tmp_path / "a", beta=0.5, **settings)))
    assert trainer.args.rpg_reference == "initial" and trainer.args.beta == 0.5
    assert trainer.args.steps_per_generation == trainer.args.gradient_accumulation_steps  # GRPO's layout is kept
    _, without_beta = train(tmp_path, model_path, GRPOConfig(**cpu_args(tmp_path / "b", beta=0.0, **settings)))
    assert max_difference(with_beta, without_beta) > 1e-3  # beta acts (it was 0.0 before the fix)
    explicit = RPGConfig.from_grpo_config(GRPOConfig(**cpu_args(tmp_path / "c", beta=0.0, **settings)))
    explicit.beta, explicit.rpg_reference = 0.5, "initial"
    _, reference = train(tmp_path, model_path, explicit)
    assert max_difference(with_beta, reference) < 1e-6


def test_upgraded_grpo_config_without_beta_keeps_the_sampler_reference(tmp_path):
    args = RPGConfig.from_grpo_config(GRPOConfig(**cpu_args(tmp_path, beta=0.0)))
    assert args.rpg_reference == "sampling" and not kl_term_is_inert(args)


@pytest.mark.parametrize("layout", [dict(rpg_generation_reuse=1), dict(steps_per_generation=2,
                                                                        gradient_accumulation_steps=2)])
def test_inert_kl_term_warns_naming_the_fields(tmp_path, layout):
    with pytest.warns(UserWarning, match="beta=0.1 regularises nothing") as record:
        RPGConfig(**cpu_args(tmp_path, beta=0.1, **layout))
    [text] = [str(r.message) for r in record if "regularises nothing" in str(r.message)]
    for name in ("rpg_reference='sampling'", "steps_per_generation", "num_iterations", "rpg_generation_reuse",
                 "'initial'"):
        assert name in text


@pytest.mark.parametrize("settings", [dict(beta=0.1), dict(beta=0.1, rpg_generation_reuse=1, num_iterations=2,
                                                           steps_per_generation=None),
                                      dict(beta=0.1, rpg_generation_reuse=1, rpg_reference="initial"),
                                      dict(beta=0.0, rpg_generation_reuse=1)])
def test_kl_term_that_acts_does_not_warn(tmp_path, settings):
    settings = {k: v for k, v in settings.items() if v is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        RPGConfig(**cpu_args(tmp_path, **settings))


def test_training_starts_with_one_line_saying_what_is_optimised(tmp_path, model_path, caplog):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1, beta=0.05, rpg_divergence="rkl", rpg_estimator="differentiable",
                                scale_rewards="group", epsilon=0.1, epsilon_high=0.3))
    with caplog.at_level(logging.WARNING, logger="trl_rpg"):
        train(tmp_path, model_path, args)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("RPGTrainer: optimising")]
    assert len(lines) == 1
    for part in ("KL(pi_theta || pi_ref)", "rpg_divergence='rkl'", "rpg_estimator='differentiable'", "beta=0.05",
                 "rpg_reference='sampling'", "used for 4 optimizer step(s)", "[1 - 0.1, 1 + 0.3]",
                 "dual clip c=10.0", "/ group std", "loss_type='dapo'"):
        assert part in lines[0], part


def test_start_line_says_when_settings_are_grpo_equivalent(tmp_path):
    grpo_like = RPGConfig(**cpu_args(tmp_path, beta=0.0, rpg_estimator="differentiable", rpg_dual_clip_c=None))
    assert "trains exactly as GRPOTrainer" in describe_objective(grpo_like)
    assert "GRPOTrainer" not in describe_objective(RPGConfig(**cpu_args(tmp_path)))
    with pytest.warns(UserWarning):
        inert = RPGConfig(**cpu_args(tmp_path, beta=0.1, rpg_generation_reuse=1))
    assert "The KL term is 0 at every token here" in describe_objective(inert)  # urkl (tests/test_kl_claims.py)
    assert torch.__version__  # the module imports torch for the parameter comparisons above


def test_start_line_makes_no_grpo_claim_with_the_dual_clip_on(tmp_path):
    """The dual clip (any c) zeroes tokens GRPO's clipped surrogate keeps (A < 0, w >= c): with it on, the line must
    not say the run trains exactly as GRPOTrainer; nor with RPG-REINFORCE, whose loss values differ."""
    for settings in (dict(rpg_estimator="differentiable"), dict(rpg_estimator="differentiable", rpg_dual_clip_c=2.0),
                     dict(rpg_estimator="reinforce", rpg_dual_clip_c=None)):
        line = describe_objective(RPGConfig(**cpu_args(tmp_path, beta=0.0, **settings)))
        assert "GRPOTrainer" not in line and "beta=0: no KL regularisation" in line, settings
