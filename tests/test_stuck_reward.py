"""A reward function that never returns on one of two processes (issue 35, section 2): without `rpg_reward_timeout`
the other process waited in the reward gather for gloo's 30 minutes without a word (`--ddp_timeout` is not applied
on CPU by transformers). The stuck process now ends the run after `ddp_timeout` seconds, naming the function; the
launcher prints its line last. One `trl-rpg train --num_processes 2` run on CPU."""

import subprocess
import textwrap
import threading
import time

import pandas as pd
import pytest
from _tiny import console_script, save_tiny_model

from trl_rpg.run.reward_exits import StuckRewardWatchdog

STUCK_REWARD = textwrap.dedent("""
    import os
    import threading


    def reward(completions, **kwargs):
        if os.environ.get("RANK") == "1":
            threading.Event().wait()  # never returns
        return [float(len(c)) for c in completions]
""")


@pytest.mark.distributed
def test_a_reward_stuck_on_one_of_two_processes_ends_the_run_naming_it(tmp_path):
    (tmp_path / "stuck_rewards.py").write_text(STUCK_REWARD)
    model = save_tiny_model(str(tmp_path / "model"))
    pd.DataFrame({"prompt": [f"{i % 10}+{(3 * i) % 10}" for i in range(32)]}).to_parquet(tmp_path / "train.parquet")
    proc = subprocess.run(
        console_script() + ["train", "--model_name_or_path", model, "--dataset_name", str(tmp_path / "train.parquet"),
                            "--output_dir", str(tmp_path / "out"), "--max_steps", "2",
                            "--per_device_train_batch_size", "4", "--num_generations", "4",
                            "--rpg_generation_reuse", "1", "--max_completion_length", "4", "--report_to", "none",
                            "--save_strategy", "no", "--use_cpu", "True", "--bf16", "False",
                            "--reward_funcs", "stuck_rewards.reward", "--num_processes", "2", "--ddp_timeout", "5"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)  # a hang guard: the run ends in about a minute
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert last.startswith("RPGTrainer: error: reward function `reward` has not returned after 5 s on process 1 of "
                           "2 (a batch of 4 completions)"), last
    assert "ddp_timeout=5" in last


def test_the_watchdog_ends_only_a_call_that_outlives_its_bound():
    """`StuckRewardWatchdog` with a recording `end` in place of ending the process: a call that outlives the bound is
    reported naming the function and the process; one that returned in time never is (its timer is cancelled)."""
    ended = threading.Event()
    lines = []

    def end(line):
        lines.append(line)
        ended.set()

    watchdog = StuckRewardWatchdog(0.2, 1, 2, end=end)
    with watchdog.watch("fast", {"completions": ["a"]}):
        pass
    with watchdog.watch("slow", {"completions": ["a", "b"]}):
        assert ended.wait(60)  # a hang guard: the bound is 0.2 s
    time.sleep(0.5)
    assert lines == [lines[0]] and lines[0].startswith(
        "RPGTrainer: error: reward function `slow` has not returned after 0.2 s on process 1 of 2 (a batch of 2 "
        "completions)")
