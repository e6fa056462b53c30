"""A run whose rewards are never scored trains on nothing: it warns once, at the first such batch, and fails at the
end instead of exiting 0 as if it had learnt something."""

import logging

import pytest
from _tiny import cpu_args, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer

WARNING = "no reward function scored any completion"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def unscored(completions, **kwargs):
    return [None] * len(completions)


def test_a_run_with_no_scored_reward_fails_after_one_warning(tmp_path, model_path, caplog):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=4, steps_per_generation=2))  # 2 generation batches
    trainer = RPGTrainer(model=model_path, reward_funcs=unscored, args=args, train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainer"):
        with pytest.raises(RuntimeError, match=r"none of the 2 training batches had a single scored reward.*"
                                               r"trained on nothing.*\['unscored'\].*\['prompt'\]"):
            trainer.train()
    assert sum(WARNING in r.getMessage() for r in caplog.records) == 1


def test_a_run_with_some_unscored_batches_warns_once_and_trains(tmp_path, model_path, caplog):
    calls = []

    def scored_after_first_batch(completions, **kwargs):
        calls.append(len(completions))
        return [None] * len(completions) if len(calls) == 1 else [float(len(c)) for c in completions]

    args = RPGConfig(**cpu_args(tmp_path, max_steps=6, steps_per_generation=2))  # 3 generation batches
    trainer = RPGTrainer(model=model_path, reward_funcs=scored_after_first_batch, args=args,
                         train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainer"):
        trainer.train()
    assert len(calls) == 3 and trainer.state.global_step == 6
    assert sum(WARNING in r.getMessage() for r in caplog.records) == 1


def test_reward_functions_that_cannot_find_their_columns_fail_before_the_model_loads(tmp_path):
    from trl_rpg.rewards import math_reward

    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, steps_per_generation=2))
    with pytest.raises(ValueError, match=r"'math_reward' reads one of the columns \['ground_truth', 'reward_model', "
                                         r"'answer'\].*has the columns \['prompt'\]"):
        RPGTrainer(model="no-model-is-loaded", reward_funcs=math_reward, args=args, train_dataset=tiny_dataset())
