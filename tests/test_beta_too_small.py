"""The construction warning for a beta too small to act against std-normalised advantages (issue 43 item 5):
`describe.beta_too_small_warning`, said by `RPGConfig` and `AsyncRPGConfig`, with the threshold `BETA_ACTS_FROM`
measured by benchmarks/beta_effect.py."""

import warnings

import pytest
from _tiny import cpu_args

from trl_rpg import RPGConfig
from trl_rpg.trainers.async_config import AsyncRPGConfig
from trl_rpg.trainers.describe import BETA_ACTS_FROM, beta_too_small_warning

ASYNC_BASE = dict(output_dir="/tmp/trl-rpg-beta-too-small-test", use_cpu=True, report_to="none")


def said(build) -> list[str]:
    """The too-small-beta warnings `build()` says (every other warning left aside)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    return [str(w.message) for w in caught if "too small to act" in str(w.message) and w.category is UserWarning]


def test_rpg_config_defaults_keep_the_rewards_scale_and_say_nothing(tmp_path):
    """RPGConfig's own default is scale_rewards="none" (the reward's scale, the paper's): beta=1e-4 is its to judge."""
    args = RPGConfig(**cpu_args(tmp_path))
    assert (args.beta, args.scale_rewards) == (1e-4, "none")
    assert said(lambda: RPGConfig(**cpu_args(tmp_path))) == []


def test_rpg_config_default_beta_under_group_std_warns_once_naming_beta_threshold_and_what_to_do(tmp_path):
    messages = said(lambda: RPGConfig(**cpu_args(tmp_path, scale_rewards="group")))
    assert len(messages) == 1
    assert messages[0].startswith(f"RPGConfig: beta=0.0001 is below {BETA_ACTS_FROM}, too small to act")
    assert "|A| ~ 1" in messages[0] and "beta=0" in messages[0] and "0.1-1" in messages[0]


def test_async_rpg_config_default_beta_warns_once():
    messages = said(lambda: AsyncRPGConfig(**ASYNC_BASE))
    assert len(messages) == 1 and messages[0].startswith("AsyncRPGConfig: beta=0.0001 is below")


@pytest.mark.parametrize("beta", [0.0, BETA_ACTS_FROM, 0.1, 1.0])
def test_no_warning_at_beta_zero_or_at_and_above_the_threshold(tmp_path, beta):
    assert said(lambda: RPGConfig(**cpu_args(tmp_path, beta=beta, scale_rewards="group"))) == []
    assert said(lambda: AsyncRPGConfig(**ASYNC_BASE, beta=beta)) == []


def test_just_below_the_threshold_warns_just_at_it_does_not():
    """Catches a flipped or non-strict comparison (`beta <= threshold`, `beta > threshold`)."""
    below = type("Args", (), dict(beta=BETA_ACTS_FROM * 0.999, scale_rewards="group", rpg_reference="sampling",
                                  steps_per_generation=2, num_iterations=1, gradient_accumulation_steps=1))
    at = type("Args", (), {**vars(below), "beta": BETA_ACTS_FROM})
    assert beta_too_small_warning(below) is not None
    assert beta_too_small_warning(at) is None


@pytest.mark.parametrize("scale", ["none", False])
def test_no_warning_when_the_advantages_keep_the_rewards_scale(tmp_path, scale):
    assert said(lambda: RPGConfig(**cpu_args(tmp_path, scale_rewards=scale))) == []
    assert len(said(lambda: RPGConfig(**cpu_args(tmp_path, scale_rewards="group")))) == 1


def test_batch_std_normalisation_warns_too(tmp_path):
    assert len(said(lambda: RPGConfig(**cpu_args(tmp_path, scale_rewards="batch")))) == 1


def test_no_double_warning_where_the_kl_term_is_inert(tmp_path):
    """Every micro-batch on-policy with the sampler as reference: the inert-KL warning speaks, this one does not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RPGConfig(**cpu_args(tmp_path, steps_per_generation=1, scale_rewards="group"))
    texts = [str(w.message) for w in caught]
    assert any("regularises nothing here" in t for t in texts)
    assert not any("too small to act" in t for t in texts)
