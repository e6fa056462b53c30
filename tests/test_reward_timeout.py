"""`rpg_reward_timeout`: a reward function that never returns ends `train()` with an error naming it (issue 20 s.3)."""

import threading

import pytest
from _tiny import cpu_args, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer


def test_a_stuck_reward_function_ends_train_with_its_name(tmp_path):
    release = threading.Event()

    def stuck_reward(completions, **kwargs):
        release.wait(60)  # without the limit train() would finish after 60 s, and the test fail
        return [0.0] * len(completions)

    model = save_tiny_model(str(tmp_path / "model"))
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1), rpg_reward_timeout=0.5)
    trainer = RPGTrainer(model=model, reward_funcs=stuck_reward, args=args, train_dataset=tiny_dataset())
    try:
        with pytest.raises(TimeoutError, match=r"`stuck_reward` did not return within 0.5 s on a batch of 32"):
            trainer.train()
    finally:
        release.set()
