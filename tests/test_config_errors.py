"""Bad configuration raises a ValueError that names the field, the value and what is allowed, before any compute."""

import pytest
from trl import GRPOConfig

from trl_rpg import RPGConfig, RPGTrainer

BASE = dict(output_dir="/tmp/trl-rpg-config-test", use_cpu=True, report_to="none")

CASES = [
    # (overrides, field named in the message, a fragment of what is allowed)
    (dict(rpg_divergence="kl"), "rpg_divergence", "fkl"),
    (dict(rpg_estimator="ppo"), "rpg_estimator", "reinforce"),
    (dict(rpg_reference="ema"), "rpg_reference", "periodic"),
    (dict(epsilon=-0.1), "epsilon", "> 0"),
    (dict(epsilon=0.0), "epsilon", "no gradient"),
    (dict(epsilon_high=-0.1), "epsilon_high", "> 0"),
    (dict(epsilon=0.2, epsilon_high=0.0), "epsilon_high", "no gradient"),
    (dict(rpg_dual_clip_c=1.0), "rpg_dual_clip_c", "> 1"),
    (dict(rpg_dual_clip_c=0.5), "rpg_dual_clip_c", "> 1"),
    (dict(beta=-1e-4), "beta", ">= 0"),
    (dict(beta=float("inf")), "beta", "finite"),
    (dict(rpg_reference="periodic", beta=1e-4), "rpg_reference_update_steps", "integer >= 1"),
    (dict(rpg_reference="periodic", rpg_reference_update_steps=0), "rpg_reference_update_steps", "integer >= 1"),
    (dict(rpg_reference="periodic", rpg_reference_update_steps=10, beta=0.0), "rpg_reference", "beta"),
    (dict(rpg_reference="initial", beta=0.0), "rpg_reference", "beta"),
    (dict(rpg_reference="adaptive"), "rpg_reference_kl_target", "> 0"),
    (dict(rpg_reference="adaptive", rpg_reference_kl_target=-1.0), "rpg_reference_kl_target", "> 0"),
    (dict(rpg_reference_update_steps=5), "rpg_reference_update_steps", "only used with"),
    (dict(rpg_reference_kl_target=0.1), "rpg_reference_kl_target", "only used with"),
    (dict(rpg_reference_kl_decay=1.0), "rpg_reference_kl_decay", "[0, 1)"),
    (dict(rpg_generation_reuse=0), "rpg_generation_reuse", "integer >= 1"),
    (dict(dynamic_sampling_max_rounds=0), "dynamic_sampling_max_rounds", "integer >= 1"),
    (dict(dynamic_sampling_on_exhausted="skip"), "dynamic_sampling_on_exhausted", "raise"),
    # settings GRPO allows but RPG cannot honour
    (dict(loss_type="cispo"), "loss_type", "dapo"),
    (dict(loss_type="sapo"), "loss_type", "dapo"),
    (dict(loss_type="vespo"), "loss_type", "dapo"),
    (dict(loss_type="luspo", importance_sampling_level="sequence"), "loss_type", "dapo"),
    (dict(sync_ref_model=True), "sync_ref_model", "periodic"),
    (dict(delta=2.0), "delta", "rpg_dual_clip_c"),
    (dict(dynamic_sampling_metric=""), "dynamic_sampling_metric", "name of a reward function"),
]


@pytest.mark.parametrize("overrides,field,allowed", CASES, ids=[c[1] + ":" + repr(c[0]) for c in CASES])
def test_invalid_rpg_config_names_field_value_and_allowed(overrides, field, allowed):
    with pytest.raises(ValueError) as error:
        RPGConfig(**BASE, **overrides)
    message = str(error.value)
    assert f"`{field}`" in message
    assert allowed in message


def test_grpo_config_with_a_loss_rpg_cannot_honour_is_rejected_by_the_trainer():
    args = GRPOConfig(**BASE, loss_type="cispo", epsilon_high=5.0)
    with pytest.raises(ValueError, match="`loss_type`"):
        RPGTrainer(model="unused-because-config-fails-first", reward_funcs=[], args=args)


def test_valid_schedules_are_accepted():
    RPGConfig(**BASE, rpg_reference="periodic", rpg_reference_update_steps=8)
    RPGConfig(**BASE, rpg_reference="adaptive", rpg_reference_kl_target=0.05)
    RPGConfig(**BASE, rpg_reference="initial")
    RPGConfig(**BASE, rpg_dual_clip_c=None)
    RPGConfig(**BASE, beta=0.0)  # no KL at all: plain clipped policy gradient, reference = sampler


@pytest.mark.parametrize("given,expected", [
    ({}, (0.2, 0.28)),  # the paper's clip-higher trust region
    ({"epsilon": 0.1}, (0.1, 0.1)),  # only epsilon: symmetric, as GRPOConfig
    ({"epsilon": 0.2}, (0.2, 0.2)),
    ({"epsilon_high": 0.4}, (0.2, 0.4)),
    ({"epsilon": 0.1, "epsilon_high": 0.3}, (0.1, 0.3)),
])
def test_clip_widths_follow_grpo_when_only_epsilon_is_set(given, expected):
    args = RPGConfig(**BASE, **given)
    assert (args.epsilon, args.epsilon_high) == expected
    # what a GRPO user who set the same fields gets, after the trainer upgrades the config
    grpo = GRPOConfig(**BASE, **given)
    upgraded = RPGConfig.from_grpo_config(grpo)
    grpo_high = grpo.epsilon_high if grpo.epsilon_high is not None else grpo.epsilon
    assert (upgraded.epsilon, upgraded.epsilon_high) == (grpo.epsilon, grpo_high)
