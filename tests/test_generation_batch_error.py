"""`RPGConfig` refuses a generation batch that cannot hold whole prompt groups, saying where its size comes from
(per-device batch x steps per generation x processes, with RPG's `rpg_generation_reuse`) and what to change, exactly
where TRL's `GRPOConfig` would refuse it."""

import itertools
import warnings

import pytest
from trl import GRPOConfig

from trl_rpg import RPGConfig
from trl_rpg.trainers import config as config_module


def _config(cls, tmp_path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return cls(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **kwargs)


def test_the_reported_case_names_the_product_and_the_fixes(tmp_path):
    with pytest.raises(ValueError) as excinfo:
        _config(RPGConfig, tmp_path, per_device_train_batch_size=4, num_generations=3)
    message = str(excinfo.value)
    assert message.startswith("RPGConfig: the generation batch of 16 completions = per_device_train_batch_size 4 x "
                              "steps_per_generation 4 (= rpg_generation_reuse 4 x gradient_accumulation_steps 1) x "
                              "1 process(es) is not a multiple of num_generations (3)")
    assert "`generation_batch_size (16) must be divisible by num_generations (3)`" in message  # TRL's words
    assert ("set per_device_train_batch_size to a multiple of 3, or num_generations to a divisor of 16 (2, 4, 8, 16), "
            "or rpg_generation_reuse to a multiple of 3.") in message
    # each suggested fix works
    _config(RPGConfig, tmp_path, per_device_train_batch_size=3, num_generations=3)
    _config(RPGConfig, tmp_path, per_device_train_batch_size=4, num_generations=4)
    _config(RPGConfig, tmp_path, per_device_train_batch_size=4, num_generations=3, rpg_generation_reuse=3)


def test_other_sources_of_steps_per_generation(tmp_path):
    expected = r"= per_device_train_batch_size 4 x steps_per_generation 2 x 1 process\(es\)"
    with pytest.raises(ValueError, match=expected):
        _config(RPGConfig, tmp_path, per_device_train_batch_size=4, num_generations=3, steps_per_generation=2)
    with pytest.raises(ValueError, match=r"steps_per_generation 2 \(= gradient_accumulation_steps, TRL's default "
                                         r"when num_iterations > 1\)"):
        _config(RPGConfig, tmp_path, per_device_train_batch_size=4, num_generations=3, num_iterations=2,
                gradient_accumulation_steps=2)
    # a generation_batch_size the user set keeps TRL's own message (it names the number the user gave)
    with pytest.raises(ValueError, match=r"^generation_batch_size \(8\) must be divisible by num_generations \(3\)"):
        _config(RPGConfig, tmp_path, per_device_train_batch_size=4, num_generations=3, generation_batch_size=8)


def test_processes_come_from_the_launcher_before_devices_are_set_up(monkeypatch):
    from accelerate.state import PartialState

    monkeypatch.setattr(PartialState, "_shared_state", {})
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert config_module._expected_num_processes() == 8
    monkeypatch.delenv("WORLD_SIZE")
    assert config_module._expected_num_processes() == 1


def test_refuses_exactly_where_trl_refuses(tmp_path):
    """Over a grid of batch layouts, RPGConfig raises its message if and only if GRPOConfig, given the same
    steps_per_generation, raises `generation_batch_size (...) must be divisible by num_generations (...)`."""
    for per_device, accumulation, groups, reuse in itertools.product((1, 2, 3, 4), (1, 2, 3), (2, 3, 4, 6), (1, 3)):
        layout = {"per_device_train_batch_size": per_device, "gradient_accumulation_steps": accumulation,
                  "num_generations": groups}
        try:
            _config(GRPOConfig, tmp_path, steps_per_generation=reuse * accumulation, **layout)
            trl_refuses = False
        except ValueError as error:
            assert "must be divisible by num_generations" in str(error)
            trl_refuses = True
        try:
            args = _config(RPGConfig, tmp_path, rpg_generation_reuse=reuse, **layout)
            assert args.generation_batch_size == per_device * reuse * accumulation
            rpg_refuses = False
        except ValueError as error:
            assert str(error).startswith("RPGConfig: the generation batch of"), error
            rpg_refuses = True
        assert rpg_refuses == trl_refuses, layout | {"rpg_generation_reuse": reuse}
