"""What differs between the transformers versions pyproject.toml admits (5.10.4, vllm 0.31's oldest, to the newest),
shimmed in `trl_rpg._compat` (issue 47): no deprecated argument set by trl-rpg's own configs or defaults, `end()` on
every version, the policy adapter of a LoRA run resumed where transformers < 5.23 skips it, TRL's own deprecated calls
quiet. CI's smoke subset runs these on the oldest and the newest sets (tests/conftest.py SMOKE_TESTS)."""

import warnings

import pytest

from trl_rpg import RPGConfig, RPGTrainer, _compat
from trl_rpg.cli.smollm2_demo import smollm2_config_kwargs
from trl_rpg.cli.toy_demo import demo_config_kwargs
from trl_rpg.toy.build import RECOMMENDED_RL_ARGS


def _built_without_future_warnings(**kwargs) -> RPGConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # above pytest's filters (pyproject.toml)
        return RPGConfig(**kwargs)


def test_trl_rpgs_own_configs_and_grpos_default_set_no_deprecated_argument(tmp_path):
    """transformers >= 5.24 warns whenever `gradient_checkpointing` (now an alias of `activation_checkpointing`) is
    set: GRPOConfig's default sets it, and so did the toy's and SmolLM2's settings."""
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert _built_without_future_warnings(**base).gradient_checkpointing is True  # TRL's default, kept
    toy = {k: v for k, v in RECOMMENDED_RL_ARGS.items() if not k.startswith(("gradient_", "activation_"))}
    for kwargs in ({**base, **toy, **_compat.no_activation_checkpointing()}, demo_config_kwargs(str(tmp_path)),
                   smollm2_config_kwargs(str(tmp_path))):
        assert _built_without_future_warnings(**kwargs).gradient_checkpointing is False
    assert RECOMMENDED_RL_ARGS[_compat.ACTIVATION_CHECKPOINTING] is False


def test_a_users_own_deprecated_argument_still_warns_where_transformers_deprecates_it(tmp_path):
    if _compat.ACTIVATION_CHECKPOINTING == "gradient_checkpointing":
        pytest.skip("transformers < 5.24: gradient_checkpointing is the only name")
    with pytest.warns(FutureWarning, match="`gradient_checkpointing` is deprecated"):
        RPGConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False)


def test_trls_own_deprecated_calls_are_quiet_and_other_future_warnings_are_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compat.quiet_trl_internal_deprecations()
        warnings.warn("`gradient_checkpointing_enable` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("`gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
    assert [str(w.message) for w in caught] == ["`gradient_checkpointing` is deprecated and will be removed in v6."]


def test_every_admitted_transformers_gives_the_trainer_end():
    """`trainer.end()` (the quick start's last line, TRL's grpo.py's on transformers >= 5.18) on every version."""
    assert callable(getattr(RPGTrainer, "end", None))
    ended = []

    class Accelerator:
        def end_training(self):
            ended.append(True)

    _compat.trainer_end(type("Trainer", (), {"accelerator": Accelerator()})())
    assert ended == [True]


class _PeftModel:
    def __init__(self):
        self.active_adapters, self.calls = ["default"], []

    def load_adapter(self, path, name, is_trainable):
        self.calls.append(("load_adapter", path, name, is_trainable))

    def set_adapter(self, name):
        self.calls.append(("set_adapter", name))


@pytest.mark.parametrize("transformers_fixed_it", [False, True])
def test_the_policy_adapter_is_loaded_on_resume_where_transformers_skips_it(monkeypatch, tmp_path,
                                                                           transformers_fixed_it):
    """transformers < 5.23 loads only the adapter subfolders of a checkpoint (RPG's reference adapter) when there are
    some, not the policy's at its root (tests/test_resume.py's LoRA resume shows the damage on 5.10.4)."""
    monkeypatch.setattr(_compat, "_transformers_at_least", lambda release: transformers_fixed_it)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    model = _PeftModel()
    assert _compat.resume_policy_adapter(model, str(tmp_path)) is False  # no subfolder: transformers loads it
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "adapter_model.safetensors").write_bytes(b"")
    (tmp_path / "other").mkdir()  # a folder without an adapter is not one
    assert _compat.resume_policy_adapter(model, str(tmp_path)) is (not transformers_fixed_it)
    expected = [("load_adapter", str(tmp_path), "default", True), ("set_adapter", "default")]
    assert model.calls == ([] if transformers_fixed_it else expected)
    assert _compat.resume_policy_adapter(object(), str(tmp_path)) is False  # not a PEFT model
