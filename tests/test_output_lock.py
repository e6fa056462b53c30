"""One writer per output folder (issue 35, section 1): a second run meets the lock when it starts and is refused
naming the first; the lock is released however `train()` ends; a stale lock of a process that is gone is
recognised and replaced. The "other run" is a real process of this machine (a sleeping Python), whose id the lock
records."""

import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from transformers import TrainerCallback

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.run.checkpoint import LOCK_FILE, OutputDirBusy, output_dir_lock
from trl_rpg.run.checkpoint import lock as output_lock


@pytest.fixture
def other_process():
    """A live process of this machine (not this one, a `python -c sleep`), ended after the test."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def plant_lock(folder, pid, name=f"{LOCK_FILE}.other-run", **changes):
    """A lock as the run of process `pid` of this machine writes it (its own file, `name`)."""
    record = {"token": "other-run", "pid": pid, "host": socket.gethostname(), "namespace": output_lock._namespace(),
              "started": 1.7e9, "process_start": output_lock._process_start(pid),
              "command": "train.py --output_dir out"}
    record.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(record))
    return record


def held_locks(folder):
    """The records of the lock files in `folder`."""
    return [output_lock.read_holder(path) for path in output_lock.lock_files(str(folder))]


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
    assert [holder["pid"] for holder in held_locks(tmp_path)] == [os.getpid()]
    lock.release()
    assert held_locks(tmp_path) == []


def test_a_reused_process_id_is_recognised_as_stale(tmp_path, other_process):
    """The process id is alive, but the process started at another time than the lock's: the id was reused."""
    plant_lock(tmp_path, other_process.pid, process_start=output_lock._process_start(other_process.pid) + 5)
    output_lock.acquire(str(tmp_path), "this-run").release()


def test_a_lock_of_another_host_or_not_a_lock_is_refused_saying_what_to_do(tmp_path, other_process):
    plant_lock(tmp_path, other_process.pid, host="node-7")
    with pytest.raises(OutputDirBusy, match=r"on node-7, .*on another host, which this machine cannot check\. .*If "
                                            r"that run has ended \(a crashed node\), delete .*_rpg_writer\.lock"):
        output_lock.acquire(str(tmp_path), "this-run")
    (tmp_path / f"{LOCK_FILE}.other-run").write_text("not json")
    with pytest.raises(OutputDirBusy, match="that is not a trl-rpg lock record"):
        output_lock.acquire(str(tmp_path), "this-run")
    assert len(held_locks(tmp_path)) == 1  # the refused run's own file is gone


def test_release_leaves_another_runs_lock_and_one_run_shares_its_lock(tmp_path, other_process):
    first = output_lock.acquire(str(tmp_path), "run-a")
    second = output_lock.acquire(str(tmp_path), "run-a")  # another saving process of run-a
    assert second.path != first.path and len(held_locks(tmp_path)) == 2
    second.release()
    plant_lock(tmp_path, other_process.pid, name=os.path.basename(first.path))  # replaced by hand
    first.release()
    assert [holder["pid"] for holder in held_locks(tmp_path)] == [other_process.pid]


def test_every_process_of_a_run_refuses_when_one_could_not_take_the_lock(tmp_path, other_process):
    """Two processes, simulated by `gather`: the main process takes the lock; the other (saving on its own node)
    finds another run's lock: both raise, and the main process's lock is released."""
    plant_lock(tmp_path / "node1", other_process.pid)
    refusal = output_lock.busy_message("node1", "x", {"pid": other_process.pid, "host": "h"}, True)
    answers = iter([["main-token", "main-token"], [None, refusal]])
    with pytest.raises(OutputDirBusy, match=f"process {other_process.pid} on h"):
        with output_dir_lock(str(tmp_path / "node0"), True, lambda values: next(answers)):
            pass
    assert held_locks(tmp_path / "node0") == []
    answers = iter([["main-token", "mine"], [None, None]])
    with output_dir_lock(str(tmp_path / "node1"), False, lambda values: next(answers)) as lock:
        assert lock is None  # a process that does not save takes no lock


class CrashAtStep1(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise RuntimeError("crash at step 1")


def test_train_and_a_save_model_alone_hold_the_lock_and_release_it_however_they_end(tmp_path, other_process):
    model = save_tiny_model(str(tmp_path / "model"))
    out = tmp_path / "out"
    args = RPGConfig(**cpu_args(out, max_steps=1, save_strategy="steps", save_steps=1, steps_per_generation=2))
    trainer = RPGTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    plant_lock(out, other_process.pid)
    with pytest.raises(OutputDirBusy, match=f"process {other_process.pid}"):
        trainer.train()  # refused before anything is written
    with pytest.raises(OutputDirBusy, match=f"process {other_process.pid}"):
        trainer.save_model()  # a script's own save, outside train(): refused too
    assert sorted(os.listdir(out)) == [f"{LOCK_FILE}.other-run"]
    (out / f"{LOCK_FILE}.other-run").unlink()

    held = []

    class Holds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            held.append(held_locks(out))

    trainer.add_callback(Holds())
    trainer.train()
    assert held and [holder["pid"] for holder in held[0]] == [os.getpid()]  # held (once) while training
    assert held_locks(out) == [] and (out / "checkpoint-1").is_dir()  # released at the end
    trainer.save_model()
    assert held_locks(out) == [] and (out / "model.safetensors").is_file()
    trainer.add_callback(CrashAtStep1())
    with pytest.raises(RuntimeError, match="crash at step 1"):
        trainer.train()
    assert held_locks(out) == []  # released on an error too


def test_a_live_lock_of_another_pid_namespace_is_not_judged_stale(tmp_path):
    """The holder's process id means another process here (pid 1 of its container is this host's init, alive but
    started at another time): the lock cannot be checked from here and is refused, never replaced."""
    plant_lock(tmp_path, 1, namespace="boot x, pid namespace 0:1, time namespace -", process_start=12)
    with pytest.raises(OutputDirBusy, match=r"process 1 on .*in another container \(PID namespace\) of this host "
                                            r"or before this machine restarted.*If that run has ended, delete .*"
                                            r"_rpg_writer\.lock\.other-run"):
        output_lock.acquire(str(tmp_path), "this-run")
    plant_lock(tmp_path, 1, namespace=None, process_start=12)  # unknown (a record without it): the same
    with pytest.raises(OutputDirBusy, match="in another container"):
        output_lock.acquire(str(tmp_path), "this-run")
    assert len(held_locks(tmp_path)) == 1


LOCK_IN_A_NEW_NAMESPACE = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("lock", sys.argv[1])
lock = sys.modules["lock"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
lock.acquire(sys.argv[2], "container-run")
print("held", flush=True)
time.sleep(600)
"""


def test_a_live_lock_taken_in_a_real_pid_namespace_is_refused(tmp_path):
    """Two containers sharing a volume and a hostname: the holder runs as pid 1 of a new PID namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    holder = subprocess.Popen(["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child",
                               sys.executable, "-c", LOCK_IN_A_NEW_NAMESPACE, output_lock.__file__, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if holder.stdout.readline().strip() != "held":
            pytest.skip("new PID namespaces are not permitted here")
        assert [record["pid"] for record in held_locks(tmp_path)] == [1]
        with pytest.raises(OutputDirBusy, match="process 1 on .*in another container"):
            output_lock.acquire(str(tmp_path), "this-run")
    finally:
        holder.kill()
        holder.wait()


def test_a_live_process_of_another_user_holds_its_lock(tmp_path, other_process, monkeypatch):
    """`os.kill(pid, 0)` raises PermissionError for another user's process: it exists."""
    plant_lock(tmp_path, other_process.pid)

    def kill(pid, signal):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(output_lock.os, "kill", kill)
    with pytest.raises(OutputDirBusy, match="still running"):
        output_lock.acquire(str(tmp_path), "this-run")


@pytest.mark.parametrize("plant, problem", [
    (lambda path: path.write_text(json.dumps({"token": "t", "pid": 2 ** 70, "host": "h"})),
     "its pid, 1180591620717411303424, is not a process id"),
    (lambda path: path.symlink_to(path.parent / "missing"), "it is a symbolic link"),
    (lambda path: path.write_text('{"token": "t", "pid": 1'), "it is not a JSON lock record"),
    (lambda path: path.write_text("[" * 30_000 + "]" * 30_000), "it is not a JSON lock record"),
    (lambda path: os.mkfifo(path), "it is not a regular file"),
    (lambda path: path.mkdir(), "it is not a regular file"),
    (lambda path: path.write_text(json.dumps({"token": "t", "pid": True, "host": "h"})), "its pid, True, is not"),
])
def test_an_odd_lock_file_is_a_clear_error_naming_it(tmp_path, plant, problem):
    plant(tmp_path / LOCK_FILE)
    with pytest.raises(OutputDirBusy) as error:
        output_lock.acquire(str(tmp_path), "this-run")  # no hang on a FIFO, no OverflowError, no RecursionError
    assert f"holds a lock file, {tmp_path / LOCK_FILE}, that is not a trl-rpg lock record ({problem}" in \
        str(error.value)
    assert "If none is, delete that file; or choose another output_dir." in str(error.value)


def test_a_stale_lock_replaced_while_another_run_starts_is_held_by_one_run_only(tmp_path, other_process,
                                                                               monkeypatch):
    """Run A pauses after judging the stale lock gone; meanwhile run B starts, whole. One of them holds the folder."""
    other_process.kill()
    other_process.wait()
    plant_lock(tmp_path, other_process.pid)  # stale
    judge, outcomes = output_lock.holder_running, []

    def pausing(holder):
        verdict = judge(holder)
        if not outcomes:  # A's pause: B starts and runs its whole acquire
            outcomes.append("b started")
            try:
                outcomes.append(output_lock.acquire(str(tmp_path), "run-b"))
            except OutputDirBusy as error:
                outcomes.append(error)
        return verdict

    monkeypatch.setattr(output_lock, "holder_running", pausing)
    try:
        outcomes.append(output_lock.acquire(str(tmp_path), "run-a"))
    except OutputDirBusy as error:
        outcomes.append(error)
    held = [outcome for outcome in outcomes[1:] if isinstance(outcome, output_lock.OutputLock)]
    assert len(held) == 1, outcomes
    assert [holder["token"] for holder in held_locks(tmp_path)] == [held[0].token]


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
