"""A run that trains on nothing never exits 0 in silence: rewards never scored (a warning at the first such batch,
then an error at the end), a configuration with no training step (an error naming the field), no optimizer step
taken (an error); a resume from a checkpoint already at the last step says what happens (a warning)."""

import logging

import pytest
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset

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


@pytest.mark.parametrize("max_steps,epochs", [(-1, 0), (0, 0.0), (-1, float("nan"))])
def test_a_configuration_with_no_training_step_is_refused(tmp_path, max_steps, epochs):
    with pytest.raises(ValueError, match=rf"RPGConfig: `num_train_epochs`={epochs!r} is not allowed; with "
                                         rf"max_steps={max_steps} the run would train nothing"):
        RPGConfig(**cpu_args(tmp_path, max_steps=max_steps, num_train_epochs=epochs))
    RPGConfig(**cpu_args(tmp_path, max_steps=-1, num_train_epochs=0.5))  # a fraction of an epoch trains


def test_a_run_that_takes_no_optimizer_step_fails(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.args.max_steps, trainer.args.num_train_epochs = -1, 0  # changed after the config's own check
    with pytest.raises(RuntimeError, match="the run took no optimizer step"):
        trainer.train()


def test_resuming_a_finished_run_says_that_transformers_takes_one_more_step(tmp_path, model_path, caplog):
    """transformers' Trainer, under GRPOTrainer as under RPGTrainer, takes one optimizer step past `max_steps` when
    it resumes a checkpoint already at `max_steps`; RPGTrainer keeps that behaviour (drop-in) and says so."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2))
    RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset()).train()
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainer"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 3
    assert any("is already at step 2 (max_steps=2); transformers' Trainer still takes one more optimizer step"
               in r.getMessage() for r in caplog.records)
