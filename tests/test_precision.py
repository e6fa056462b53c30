"""The precision a run trains in: a launcher's mixed precision (`ACCELERATE_MIXED_PRECISION`, what `accelerate launch
--config_file accelerate_configs/multi_gpu.yaml` sets) that the arguments do not ask for is warned about from the
Python API too (`trl-rpg train` refuses it), and the start-up line states the precision the run really uses
(issue 36 section 3)."""

import logging

import pytest
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.trainers.precision import MIXED_PRECISION_ENV, clash_warning, precision_clause


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("precision") / "model"))


def test_a_launcher_bf16_under_bf16_false_trains_in_bf16_warned_and_said(model_path, tmp_path, monkeypatch, caplog):
    """bf16=False in a script started by `accelerate launch` with a bf16 config: transformers trains in bf16 (the
    accelerator's mixed precision comes from the launcher), so the trainer warns at construction and the start-up
    line says bf16, naming where it came from."""
    monkeypatch.setenv(MIXED_PRECISION_ENV, "bf16")  # what accelerate launch sets from multi_gpu.yaml
    args = RPGConfig(**cpu_args(tmp_path / "out", max_steps=1, steps_per_generation=2))
    assert not args.bf16 and not args.fp16
    with caplog.at_level(logging.WARNING, logger="trl_rpg"):
        trainer = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
        assert trainer.accelerator.mixed_precision == "bf16"  # the run really is bf16, as the warning says
        warned = [r.getMessage() for r in caplog.records if "the launcher asks for mixed precision" in r.getMessage()]
        assert len(warned) == 1
        assert f"{MIXED_PRECISION_ENV}=bf16" in warned[0] and "float32 (bf16=False, fp16=False)" in warned[0]
        assert "this run trains in bf16" in warned[0]
        trainer.train()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("RPGTrainer: optimising")]
    assert line.endswith(" Precision: bf16 autocast over float32 trained parameters (bf16 from "
                         "ACCELERATE_MIXED_PRECISION=bf16; the arguments ask for float32 (bf16=False, fp16=False)).")


def test_agreeing_settings_are_not_warned_and_are_said_plainly():
    assert clash_warning(False, False, "no", None) is None
    assert clash_warning(False, False, "no", "no") is None
    assert clash_warning(True, False, "bf16", "bf16") is None
    assert precision_clause(False, False, "no", ["torch.float32"], None) == \
        "float32 trained parameters, no mixed precision"
    assert precision_clause(True, False, "bf16", ["torch.float32"], "bf16") == \
        "bf16 autocast over float32 trained parameters"


def test_arguments_that_ask_for_another_mixed_precision_win_and_are_warned():
    """bf16=True under a launcher that asks for fp16: the arguments' bf16 is used (transformers' rule), said so."""
    warning = clash_warning(True, False, "bf16", "fp16")
    assert "this run trains in bf16, the arguments'" in warning and "--mixed_precision bf16" in warning
    assert precision_clause(True, False, "bf16", ["torch.bfloat16"], "fp16") == \
        "bf16 autocast over bfloat16 trained parameters"
