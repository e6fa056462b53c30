"""The per-`train()` tallies through the trainer: the unscored-batch warning fires at the first unscored training
batch even when earlier batches were scored (`reward_calls.ScoringTally`), and a second `train()` on the same trainer
judges its own steps, not the first call's (`learning_signal.SignalTally`)."""

import logging
import re

import pytest
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer

UNSCORED = "no reward function scored any completion"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


class ScriptedReward:
    """`digit_reward`, or what `mode` says: "unscored" (None for every completion) or "constant" (no spread)."""

    __name__ = "scripted_reward"

    def __init__(self, modes=()):
        self.modes, self.calls = list(modes), 0

    def __call__(self, completions, **kwargs):
        mode = self.modes[self.calls] if self.calls < len(self.modes) else "informative"
        self.calls += 1
        if mode == "unscored":
            return [None] * len(completions)
        if mode == "constant":
            return [1.0] * len(completions)
        return digit_reward(completions)


def test_the_first_unscored_batch_warns_when_earlier_batches_were_scored(tmp_path, model_path, caplog):
    reward = ScriptedReward(["informative", "unscored", "unscored"])
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, steps_per_generation=1))  # a batch per step
    trainer = RPGTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=tiny_dataset())
    warned_at = []

    def record(record):
        if UNSCORED in record.getMessage():
            warned_at.append(reward.calls)
        return True

    with caplog.at_level(logging.WARNING, logger="trl_rpg.trainers.trainer"):
        logging.getLogger("trl_rpg.trainers.trainer").addFilter(record)
        try:
            trainer.train()  # batch 1 scored: the run trained on something
        finally:
            logging.getLogger("trl_rpg.trainers.trainer").removeFilter(record)
    assert reward.calls == 3
    assert warned_at == [2]  # once, at batch 2


def test_a_second_train_call_judges_only_its_own_steps(tmp_path, model_path):
    """The first call's steps carry signal; the second call's do not (a constant reward): the second call's verdict
    is "trained on nothing", whatever the first one counted."""
    reward = ScriptedReward(["informative", "constant"])
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, steps_per_generation=2))  # one batch per call
    trainer = RPGTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=tiny_dataset())
    assert trainer.train().metrics["rpg/trained_on_nothing"] == 0.0
    second = trainer.train().metrics
    assert reward.calls == 2  # the second call generated its own batch
    assert second["rpg/trained_on_nothing"] == 1.0
    assert re.search(r"none of the 2 optimizer steps carried a learning signal \(2 steps: zero reward spread in every "
                     r"group\)", second["rpg/trained_on_nothing_reason"])
