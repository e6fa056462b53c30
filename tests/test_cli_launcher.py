"""`trl-rpg train`'s launcher: the exit status it reports for its training processes (their own code, 128 + N for a
death by signal N, the first failure of several, 130 on Ctrl-C, 143 on SIGTERM, without a traceback of its own), the
environment it gives them, and where one process trains. The rules are checked with tiny fake training scripts
(`python script.py`, no model) started by accelerate's real launchers, or with accelerate's `launch_command` replaced;
the real runs are in tests/test_cli.py."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _processes import free_port as _free_port

from trl_rpg import cli
from trl_rpg.cli import launcher


def _fake_launch(script: Path, *options: str):
    """accelerate launch's arguments for running `script` (a plain Python file) with `options`."""
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser().parse_args(
        [*options, "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)])


def _script(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_a_training_process_killed_by_signal_n_is_reported_as_128_plus_n(tmp_path):
    """A training process killed by SIGTERM (15) or SIGKILL (9) is reported as 143 / 137, as a shell reports it
    (subprocess's return code is -15 / -9); one that exits 3 is reported as 3, one that succeeds as 0."""
    statuses = {}
    for name, body in (("sigterm", "os.kill(os.getpid(), signal.SIGTERM)"),
                       ("sigkill", "os.kill(os.getpid(), signal.SIGKILL)"),
                       ("three", "sys.exit(3)"), ("fine", "pass")):
        script = _script(tmp_path, name, f"import os, signal, sys\n{body}\n")
        statuses[name] = cli.run_accelerate_launch(_fake_launch(script, "--num_processes", "1"))
    assert statuses == {"sigterm": 128 + 15, "sigkill": 128 + 9, "three": 3, "fine": 0}


def test_of_several_failed_processes_the_first_ones_status_is_reported(monkeypatch):
    """torchrun's `ChildFailedError` lists every failed process; the one that failed first (the cause: the others
    are usually stopped because of it) gives the status, whichever rank it has."""
    from accelerate.commands import launch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def failures(first_rank):
        found = {}
        for rank, exitcode in ((0, 4), (1, -15), (2, 3)):
            failure = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file="")
            failure.timestamp = 100 if rank == first_rank else 200 + rank
            found[rank] = failure
        return found

    for first_rank, status in ((2, 3), (1, 143), (0, 4)):
        def failing(args, first_rank=first_rank):
            raise ChildFailedError(name="trl_rpg", failures=failures(first_rank))

        monkeypatch.setattr(launch, "launch_command", failing)
        assert cli.run_accelerate_launch(object()) == status, first_rank


def test_the_first_failed_processs_error_line_is_printed_last(monkeypatch, tmp_path, capsys):
    """Several processes: each training process records its `error:` line in the error file torchrun gives it; the
    launcher prints the first failing one's last, after torchrun's own log of the failure ("failed (exitcode: 1)
    local_rank: 1 ..."). A process that left no line (killed by a signal) adds nothing."""
    from accelerate.commands import launch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from trl_rpg.cli.arguments import record_error_for_launcher

    for rank in (0, 1):
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error-{rank}.json"))
        record_error_for_launcher(f"trl-rpg train: error: RuntimeError: the reward server is down (rank {rank})")
    failures = {rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=1,
                                     error_file=str(tmp_path / f"error-{rank}.json")) for rank in (0, 1)}
    failures[1].timestamp = failures[0].timestamp - 1  # rank 1 failed first
    failures[2] = ProcessFailure(local_rank=2, pid=1002, exitcode=-15, error_file=str(tmp_path / "none.json"))

    def failing(args):
        print("E1202 api.py:911] failed (exitcode: 1) local_rank: 1 (pid: 1001) of binary: python", file=sys.stderr)
        raise ChildFailedError(name="trl_rpg", failures=failures)

    monkeypatch.setattr(launch, "launch_command", failing)
    assert cli.run_accelerate_launch(object()) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == "trl-rpg train: error: RuntimeError: the reward server is down (rank 1)", lines
    failures[2].timestamp = 0  # the first to fail was killed by a signal: it recorded nothing
    assert cli.run_accelerate_launch(object()) == 143
    assert "error:" not in capsys.readouterr().err.strip().splitlines()[-1]


def test_an_accelerate_that_exits_itself_on_a_signal_gives_its_status_without_a_traceback(monkeypatch):
    """accelerate >= 1.16 turns a signal to its launcher into `sys.exit(128 + N)` itself (130 on Ctrl-C, 1 for a
    failure under `--quiet`); the launcher returns that status instead of letting `SystemExit` unwind through the
    training command (`SystemExit(None)` is success)."""
    from accelerate.commands import launch

    for code, status in ((143, 143), (130, 130), (1, 1), (None, 0), ("stopped", 1)):
        def exiting(args, code=code):
            raise SystemExit(code)

        monkeypatch.setattr(launch, "launch_command", exiting)
        assert cli.run_accelerate_launch(object()) == status, code


def test_ctrl_c_exits_130(monkeypatch, tmp_path):
    """Ctrl-C (KeyboardInterrupt) while the launcher waits for its training processes, or while it trains one
    itself: exit status 130, as a shell reports a program interrupted by SIGINT."""
    from accelerate.commands import launch

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "launch_command", interrupted)
    assert cli.run_accelerate_launch(object()) == 130
    monkeypatch.setattr(launcher, "run_train", interrupted)
    argv = ["train", "--model_name_or_path", "m", "--output_dir", str(tmp_path / "o"), "--use_cpu", "True",
            "--bf16", "False"]
    assert cli.main(argv + ["--num_processes", "1"]) == 130  # trained in the launcher's process
    assert cli.main(argv + ["--num_processes", "2"]) == 130  # through accelerate's multi-process launcher


#: A launcher of two fake training processes that signal it: its exit status for each signal, as JSON.
_TWO_PROCESS_LAUNCHER = """
import json, os, sys
from pathlib import Path
from accelerate.commands.launch import launch_command_parser
from trl_rpg.cli import run_accelerate_launch

statuses = {}
for name, port in zip(sys.argv[1::2], sys.argv[2::2]):
    args = launch_command_parser().parse_args(
        ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
         "--dynamo_backend", "no", "--main_process_port", port, "--monitor_interval", "0.1", "child.py", name])
    statuses[name] = run_accelerate_launch(args)
print("STATUSES " + json.dumps(statuses), flush=True)
"""

#: Each fake training process records its pid; once both have, rank 0 sends the launcher (its parent) the signal
#: named on its command line. Both then wait to be stopped, and leave quietly when they are. Named ERROR, rank 1
#: fails instead, its error line in the error file torchrun gives it (as `record_error_for_launcher` writes it).
_CHILD = """
import json, os, signal, sys, time
from pathlib import Path
name, rank = sys.argv[1], os.environ["RANK"]
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: os._exit(0))
Path(f"{name}-{rank}.pid").write_text(str(os.getpid()))
if name == "ERROR" and rank == "1":
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as file:
        json.dump({"message": "trl-rpg train: error: RuntimeError: boom", "timestamp": int(time.time())}, file)
    sys.exit(1)
if rank == "0" and name != "ERROR":
    while not Path(f"{name}-1.pid").exists():
        time.sleep(0.05)
    os.kill(os.getppid(), getattr(signal, name))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.distributed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_or_sigint_to_the_launcher_of_two_processes_exits_143_or_130_without_a_traceback(tmp_path):
    """SIGTERM or SIGINT to the launcher of a two-process run (torchrun's agent, which turns them into a
    `SignalException` and stops the training processes): exit status 143 / 130, as a Python program interrupted
    that way, with no traceback; both training processes are gone. And a process that fails: its error line, read
    from the error file torchrun gave it, is printed last (after torchrun's log of the failure). One subprocess for
    the three launches (the fake training processes import nothing)."""
    (tmp_path / "launcher.py").write_text(_TWO_PROCESS_LAUNCHER)
    (tmp_path / "child.py").write_text(_CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["HF_HOME"] = str(tmp_path / "hf")  # no accelerate default config of this machine
    proc = subprocess.run([sys.executable, "launcher.py", "SIGTERM", str(_free_port()), "SIGINT", str(_free_port()),
                           "ERROR", str(_free_port())],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    import accelerate
    import torch

    versions = f"accelerate {accelerate.__version__}, torch {torch.__version__}: "  # whose launch internals changed
    assert proc.returncode == 0, versions + proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("STATUSES "))
    statuses = json.loads(line.removeprefix("STATUSES "))
    assert statuses == {"SIGTERM": 143, "SIGINT": 130, "ERROR": 1}, versions + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "SignalException" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "trl-rpg train: error: RuntimeError: boom", proc.stderr[-2000:]
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("*-*.pid"))]
    assert len(pids) == 6 and not any(_alive(pid) for pid in pids)


# ----------------------------------------------------------------------------------------------------------------
# The environment of the training processes
# ----------------------------------------------------------------------------------------------------------------


def _launch_environment(monkeypatch, *extra) -> dict:
    """The environment `accelerate launch` sees when `trl-rpg train` starts two training processes."""
    from accelerate.commands import launch

    seen = []
    monkeypatch.setattr(launch, "launch_command", lambda args: seen.append(dict(os.environ)))
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", "--bf16",
                     "False", "--num_processes", "2", *extra]) == 0
    return seen[-1]


def test_pythonsafepath_is_for_the_training_processes_only_and_a_users_own_setting_is_kept(monkeypatch):
    """The training processes get `PYTHONSAFEPATH=1` (a `peft.py` in the working directory is not imported) and
    take it out again for the processes they start (a reward function's scripts get the ordinary `sys.path`);
    a user's own `PYTHONSAFEPATH` is passed on untouched, to the training processes and theirs. The launcher's own
    environment is as it was after the launch."""
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    child = _launch_environment(monkeypatch)
    assert child["PYTHONSAFEPATH"] == "1" and "PYTHONSAFEPATH" not in os.environ
    assert child["TRL_RPG_LAUNCHER_PID"] == str(os.getpid())  # each training process ends with the launcher
    monkeypatch.setattr(os, "environ", child)  # what the training process does with it
    launcher._take_safe_path_setting()
    assert "PYTHONSAFEPATH" not in os.environ  # not for its own children
    monkeypatch.undo()

    monkeypatch.setenv("PYTHONSAFEPATH", "yes")
    child = _launch_environment(monkeypatch)
    assert child["PYTHONSAFEPATH"] == "1"
    monkeypatch.setattr(os, "environ", child)
    launcher._take_safe_path_setting()
    assert os.environ.get("PYTHONSAFEPATH") == "1"  # the user's: kept for the training process's children
    monkeypatch.undo()
    assert os.environ.get("PYTHONSAFEPATH") is None


def test_one_process_trains_in_the_launchers_process_with_the_environment_accelerate_would_give_it(monkeypatch):
    """One training process: trained in the launcher's own process (torch, transformers and TRL are imported once,
    not again in a child), with the environment accelerate's one-process launcher gives its child; what the launch
    set in the launcher's environment is restored afterwards. Nothing is started: accelerate's one-process launcher
    is watched (the command and environment it would start its child with, from accelerate's own
    `prepare_simple_launcher_cmd_env`; how it then starts the child, `subprocess.Popen` before accelerate 1.16 and
    `psutil.Popen` since, is not this test's)."""
    from accelerate.commands import launch
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    started = []
    monkeypatch.setattr(launch, "simple_launcher", lambda args: started.append(prepare_simple_launcher_cmd_env(args)))
    training = ["--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", "--bf16", "False"]
    assert cli.run_accelerate_launch(cli.parse_launch_arguments(["--num_processes", "1"], training)) == 0
    (cmd, accelerate_env), = started
    assert cmd[1:4] == ["-m", "trl_rpg", "train"]

    seen = []
    monkeypatch.setattr(launcher, "run_train", lambda argv, prog: seen.append((argv, prog, dict(os.environ))) or 0)
    before = dict(os.environ)
    assert cli.main(["train", *training, "--num_processes", "1"]) == 0
    assert len(started) == 1, "a process was started"
    (argv, prog, env), = seen
    assert argv == training and prog == "trl-rpg train"
    keys = {k for k in accelerate_env if k.startswith(("ACCELERATE_", "KMP_", "OMP_"))} | {"MASTER_ADDR"}
    assert {k: env.get(k) for k in keys} == {k: accelerate_env.get(k) for k in keys}
    # restored: each variable of the launch environment. One that a library imported during the run sets for itself
    # (torch 2.14 sets TORCHINDUCTOR_CACHE_DIR) is its own, and stays: the library already read it in this process
    after = dict(os.environ)
    assert {k: after.get(k) for k in accelerate_env} == {k: before.get(k) for k in accelerate_env}
    assert set(after) - set(before) <= {"TORCHINDUCTOR_CACHE_DIR"} and not set(before) - set(after)


def test_num_processes_1_with_a_one_process_config_is_accepted(tmp_path):
    """`--num_processes 1` with a config of one process (`distributed_type: NO`) is what the user asked for; only
    more processes than such a config starts are refused."""
    def checked(count):
        args = cli.parse_launch_arguments(
            cli.resolve_accelerate_config(["--accelerate_config", "single_process", "--num_processes", count]), [])
        cli.check_process_count(args)

    checked("1")
    with pytest.raises(ValueError, match="would start one process, not 2"):
        checked("2")
