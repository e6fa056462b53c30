"""GRPOConfig fields RPG ignores (`upgrade_guard.GRPO_FIELDS`, verdict "ignored") warn when set to a non-default value,
naming each field, its value and why, as TRL's own trainers warn about arguments they do not use (issue 34 section 5).
Before, they were ignored silently."""

import warnings

import pytest
from _tiny import cpu_args
from trl import GRPOConfig

from trl_rpg import RPGConfig
from trl_rpg.upgrade.guard import GRPO_FIELDS

IGNORED = [name for name, rule in GRPO_FIELDS.items() if rule.verdict == "ignored"]


def test_the_ignored_fields_are_the_issues():
    assert set(IGNORED) == {"use_bias_correction_kl", "ref_model_mixup_alpha", "ref_model_sync_steps",
                            "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos",
                            "vespo_k_neg", "vespo_lambda_neg"}


@pytest.mark.parametrize("name", IGNORED)
def test_an_ignored_field_set_to_a_non_default_value_warns_naming_it(tmp_path, name):
    value = not GRPOConfig.use_bias_correction_kl if name == "use_bias_correction_kl" else 0.123
    with pytest.warns(UserWarning, match="RPG ignores these GRPOConfig fields") as record:
        RPGConfig(**cpu_args(tmp_path, **{name: value}))
    [text] = [str(r.message) for r in record if "RPG ignores" in str(r.message)]
    assert f"`{name}`={value!r} ({GRPO_FIELDS[name].reason})" in text
    assert sum(f"`{other}`" in text for other in IGNORED) == 1


def test_an_upgraded_grpo_config_warns_once_naming_every_ignored_field_it_sets(tmp_path):
    grpo = GRPOConfig(**cpu_args(tmp_path, use_bias_correction_kl=False, sapo_temperature_pos=2.0, vespo_k_neg=1.0))
    with pytest.warns(UserWarning, match="RPG ignores") as record:
        RPGConfig.from_grpo_config(grpo)
    [text] = [str(r.message) for r in record if "RPG ignores" in str(r.message)]
    for part in ("`use_bias_correction_kl`=False", "`sapo_temperature_pos`=2.0", "`vespo_k_neg`=1.0"):
        assert part in text


def test_defaults_do_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*RPG ignores", category=UserWarning)
        RPGConfig(**cpu_args(tmp_path))
        RPGConfig.from_grpo_config(GRPOConfig(**cpu_args(tmp_path)))
