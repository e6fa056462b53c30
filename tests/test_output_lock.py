"""One writer per output folder (issue 35, section 1): a second run meets the lock when it starts and is refused
naming the first; the lock is released however `train()` ends; a stale lock of a process that is gone is
recognised and replaced. The "other run" is a real process of this machine (a sleeping Python), whose id the lock
records."""

import json
import logging
import os
import socket
import subprocess
import sys

import pytest
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from transformers import TrainerCallback

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.checkpoint import LOCK_FILE, OutputDirBusy, output_dir_lock
from trl_rpg.checkpoint import lock as output_lock


@pytest.fixture
def other_process():
    """A live process of this machine (not this one, a `python -c sleep`), ended after the test."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def plant_lock(folder, pid, **changes):
    """A lock as the run of process `pid` writes it."""
    record = {"token": "other-run", "pid": pid, "host": socket.gethostname(), "started": 1.7e9,
              "process_start": output_lock._process_start(pid), "command": "train.py --output_dir out"}
    record.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps(record))
    return record


def test_a_second_run_is_refused_naming_the_first_until_it_ends(tmp_path, other_process, caplog):
    plant_lock(tmp_path, other_process.pid)
    with pytest.raises(OutputDirBusy) as error:
        output_lock.acquire(str(tmp_path), "this-run")
    assert f"is being written by another run (process {other_process.pid} on {socket.gethostname()}" in \
        str(error.value)
    assert "still running" in str(error.value) and "train.py --output_dir out" in str(error.value)
    other_process.kill()
    other_process.wait()
    with caplog.at_level(logging.WARNING):
        lock = output_lock.acquire(str(tmp_path), "this-run")  # the stale lock is replaced, with a warning
    assert f"replacing a stale lock of {tmp_path}: process {other_process.pid}" in caplog.text
    assert output_lock.read_holder(lock.path)["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_reused_process_id_is_recognised_as_stale(tmp_path, other_process):
    """The process id is alive, but the process started at another time than the lock's: the id was reused."""
    plant_lock(tmp_path, other_process.pid, process_start=1.0)
    output_lock.acquire(str(tmp_path), "this-run").release()


def test_a_lock_of_another_host_or_not_a_lock_is_refused_saying_what_to_do(tmp_path, other_process):
    plant_lock(tmp_path, other_process.pid, host="node-7")
    with pytest.raises(OutputDirBusy, match=r"on node-7, .*on another host, which this machine cannot check\. .*If "
                                            r"that run has ended \(a crashed node\), delete .*_rpg_writer\.lock"):
        output_lock.acquire(str(tmp_path), "this-run")
    (tmp_path / LOCK_FILE).write_text("not json")
    with pytest.raises(OutputDirBusy, match="that is not a trl-rpg lock record"):
        output_lock.acquire(str(tmp_path), "this-run")


def test_release_leaves_another_runs_lock_and_one_run_shares_its_lock(tmp_path, other_process):
    first = output_lock.acquire(str(tmp_path), "run-a")
    assert output_lock.acquire(str(tmp_path), "run-a").path == first.path  # another saving process of run-a
    plant_lock(tmp_path, other_process.pid)  # the lock was taken over (deleted by hand, then another run started)
    first.release()
    assert output_lock.read_holder(str(tmp_path / LOCK_FILE))["pid"] == other_process.pid


def test_every_process_of_a_run_refuses_when_one_could_not_take_the_lock(tmp_path, other_process):
    """Two processes, simulated by `gather`: the main process takes the lock; the other (saving on its own node)
    finds another run's lock: both raise, and the main process's lock is released."""
    plant_lock(tmp_path / "node1", other_process.pid)
    refusal = output_lock.busy_message("node1", "x", {"pid": other_process.pid, "host": "h"}, True)
    answers = iter([["main-token", "main-token"], [None, refusal]])
    with pytest.raises(OutputDirBusy, match=f"process {other_process.pid} on h"):
        with output_dir_lock(str(tmp_path / "node0"), True, lambda values: next(answers)):
            pass
    assert not (tmp_path / "node0" / LOCK_FILE).exists()
    answers = iter([["main-token", "mine"], [None, None]])
    with output_dir_lock(str(tmp_path / "node1"), False, lambda values: next(answers)) as lock:
        assert lock is None  # a process that does not save takes no lock


class CrashAtStep1(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise RuntimeError("crash at step 1")


def test_train_holds_the_lock_for_the_run_and_releases_it_however_it_ends(tmp_path, other_process):
    model = save_tiny_model(str(tmp_path / "model"))
    out = tmp_path / "out"
    args = RPGConfig(**cpu_args(out, max_steps=1, save_strategy="steps", save_steps=1, steps_per_generation=2))
    trainer = RPGTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    plant_lock(out, other_process.pid)
    with pytest.raises(OutputDirBusy, match=f"process {other_process.pid}"):
        trainer.train()  # refused before anything is written
    assert sorted(os.listdir(out)) == [LOCK_FILE]
    (out / LOCK_FILE).unlink()

    held = []

    class Holds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            held.append(output_lock.read_holder(str(out / LOCK_FILE)))

    trainer.add_callback(Holds())
    trainer.train()
    assert held and held[0]["pid"] == os.getpid()  # held while training
    assert not (out / LOCK_FILE).exists() and (out / "checkpoint-1").is_dir()  # released at the end
    trainer.add_callback(CrashAtStep1())
    with pytest.raises(RuntimeError, match="crash at step 1"):
        trainer.train()
    assert not (out / LOCK_FILE).exists()  # released on an error too


@pytest.fixture
def no_loading(monkeypatch):
    """Model and data loads recorded and stopped: a refusal must come before them."""
    import transformers

    from trl_rpg.cli import training

    loads = []

    def load(*args, **kwargs):
        loads.append(args)
        raise AssertionError("loaded before the output folder was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", load)
    monkeypatch.setattr(training, "load_training_data", load)
    return loads


def test_a_busy_output_dir_is_refused_before_the_model_loads(tmp_path, other_process, no_loading, monkeypatch):
    """The second run was refused only at `train()`, after the model and data had loaded (34 s); now in the
    constructor, before `from_pretrained`. Several processes leave it to `train()` (their lock is taken together)."""
    model = save_tiny_model(str(tmp_path / "model"))
    plant_lock(tmp_path / "out", other_process.pid)
    args = RPGConfig(**cpu_args(tmp_path / "out", max_steps=1))
    with pytest.raises(OutputDirBusy, match=f"process {other_process.pid} on {socket.gethostname()}.*still running"):
        RPGTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    assert not no_loading
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(AssertionError, match="loaded before"):
        RPGTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())


def test_a_stale_lock_lets_the_trainer_load(tmp_path, other_process, no_loading):
    model = save_tiny_model(str(tmp_path / "model"))
    plant_lock(tmp_path / "out", other_process.pid, process_start=1.0)  # a reused process id: stale
    args = RPGConfig(**cpu_args(tmp_path / "out", max_steps=1))
    with pytest.raises(AssertionError, match="loaded before"):
        RPGTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())


def test_the_command_line_refuses_a_busy_output_dir_in_one_line_before_loading(tmp_path, other_process, no_loading,
                                                                              monkeypatch, capsys):
    from accelerate.commands import launch

    from trl_rpg import cli
    from trl_rpg.cli import launcher

    launched = []
    monkeypatch.setattr(launch, "launch_command", launched.append)
    monkeypatch.setattr(launcher, "run_train", lambda argv, prog: launched.append(argv) or 0)
    plant_lock(tmp_path / "out", other_process.pid)
    argv = ["train", "--model_name_or_path", "m", "--output_dir", str(tmp_path / "out"), "--use_cpu", "True",
            "--bf16", "False"]
    for kwargs in ({}, {"launch": False, "prog": "python -m trl_rpg"}):  # the launcher, then a training process
        assert cli.main(argv, **kwargs) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert "train: error: RPGTrainer: output_dir" in last and f"process {other_process.pid}" in last, last
        assert "Traceback" not in err
    assert not launched and not no_loading
