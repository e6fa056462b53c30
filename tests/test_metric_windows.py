"""Generation-time metrics over a logging window of several optimizer steps (TRL's default `logging_steps=10`; every
other metrics test logs each step): a window's `reward` and `completions/*` are the mean over the batches generated
in it, as under GRPOTrainer; a window in which no batch is generated carries forward the generation-time metrics of
the batch it trained on, and nothing logged at loss time (`trl_rpg.objectives.loss.appended_means` /
`carry_forward`)."""

import pytest
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from transformers import TrainerCallback

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.objectives.loss import appended_means, carry_forward


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


class RecordingReward:
    """`length_reward`, recording each call's mean reward and mean completion length (in tokens, as TRL counts)."""

    __name__ = "recording_reward"

    def __init__(self):
        self.batches = []

    def __call__(self, completions, completion_ids, **kwargs):
        rewards = length_reward(completions)
        self.batches.append({"reward": sum(rewards) / len(rewards),
                             "completions/mean_length": sum(map(len, completion_ids)) / len(completion_ids)})
        return rewards


def mean(values):
    return sum(values) / len(values)


def test_a_window_of_default_logging_steps_logs_the_mean_over_its_batches(tmp_path, model_path):
    """TRL's default `logging_steps=10` with RPG's default batch reuse (4 steps): batches are generated at steps 1, 5
    and 9, all in the first window, whose `reward` and `completions/mean_length` are their mean (not the last
    batch's, which `carry_forward` must not write over the window's values)."""
    settings = cpu_args(tmp_path, max_steps=10)
    del settings["logging_steps"]
    args = RPGConfig(**settings)
    assert (args.logging_steps, args.steps_per_generation) == (10, 4)
    reward = RecordingReward()
    trainer = RPGTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    assert len(reward.batches) == 3
    (window,) = [h for h in trainer.state.log_history if "loss" in h]
    for key in ("reward", "completions/mean_length"):
        values = [batch[key] for batch in reward.batches]
        assert len(set(values)) > 1, key  # the batches differ: the mean and the last value can be told apart
        assert window[key] == pytest.approx(mean(values), rel=1e-6), key
    assert window["rewards/recording_reward/mean"] == pytest.approx(window["reward"], rel=1e-6)


def poison_step(trainer, step):
    """Make the gradient of optimizer step `step` (1-based) NaN: the guard skips it and logs `rpg/skipped_steps`."""
    active = {"on": False}
    trainer.model.lm_head.weight.register_hook(lambda grad: grad * float("nan") if active["on"] else grad)

    class Switch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            active["on"] = state.global_step + 1 == step

    trainer.add_callback(Switch())


def test_a_window_without_a_generation_carries_forward_only_generation_metrics(tmp_path, model_path):
    """`logging_steps` below the batch reuse (here 2 and 3; the paper's 16 steps per batch with TRL's default
    `logging_steps=10` makes the same pattern): batches are generated at steps 1, 4 and 7. The batch of step 4 is
    generated in the window of steps 3-4, after step 3 logged its loss-time metrics (`entropy`, `policy_loss` and,
    as step 3 is skipped, `rpg/skipped_steps`). The window of steps 5-6 generates nothing: it logs the reward of the
    batch it trained on (step 4's) and its own loss-time metrics, never step 3's skipped-step count."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=6, logging_steps=2, rpg_generation_reuse=3))
    reward = RecordingReward()
    trainer = RPGTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=tiny_dataset())
    poison_step(trainer, 3)
    trainer.train()
    assert len(reward.batches) == 2 and trainer.skipped_steps == 1
    windows = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(windows) == [2, 4, 6]
    assert windows[4]["rpg/skipped_steps"] == 1.0  # step 3, in its own window
    assert "rpg/skipped_steps" not in windows[6]  # no step of steps 5-6 was skipped
    assert windows[6]["reward"] == pytest.approx(reward.batches[1]["reward"], rel=1e-6)  # the batch trained on
    assert windows[6]["completions/mean_length"] == pytest.approx(reward.batches[1]["completions/mean_length"])


def test_the_batch_metrics_are_what_its_generation_appended():
    """What `_generate_and_score_completions` hands to `log` for a generation in the middle of a window: the mean of
    the values the generation appended; metrics logged earlier in the window (loss-time ones, and a previous batch's
    generation-time ones) are left out."""
    window = {"entropy": [3.0, 3.2], "policy_loss": [0.1, 0.3], "reward": [1.0], "completions/mean_length": [4.0]}
    before = {key: len(values) for key, values in window.items()}
    window["reward"].append(2.0)  # the new batch
    window["completions/mean_length"].append(6.0)
    window["rewards/f/mean"] = [float("nan")]  # not scored by `f`: no value to carry
    assert appended_means(before, window) == {"reward": 2.0, "completions/mean_length": 6.0}


def test_carry_forward_fills_only_metrics_the_window_lacks():
    window = {"reward": [1.0, 3.0], "entropy": [3.0]}
    carry_forward(window, {"reward": 5.0, "completions/mean_length": 6.0})
    assert window == {"reward": [1.0, 3.0], "entropy": [3.0], "completions/mean_length": [6.0]}
