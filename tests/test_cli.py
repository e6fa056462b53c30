"""The `trl-rpg` command line: help texts, `trl-rpg train` through `accelerate launch`, `python -m trl_rpg train`, and
the newcomer's mistakes, each ending with one clear message naming what to fix, as the last line, within seconds."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from _processes import free_port as _free_port
from _tiny import console_script as _console_script
from _tiny import save_tiny_model

from trl_rpg import cli

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: Generous bound for a refused run: the launcher imports TRL (seconds), then stops before launching anything.
FAST_FAILURE_S = 90


def _env(**overrides):
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")])))  # no "" (= cwd)
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def _run(cmd, cwd, timeout=300, **env):
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=timeout, check=False)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _prompts(n):
    return [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}] for i in range(n)]


def _sums(n):
    return [str(i % 10 + (3 * i) % 10) for i in range(n)]


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A tiny local model and local parquet files: DAPO-Math format (prompt + reward_model.ground_truth), plain
    prompt + answer, and prompt + solution (a column math_reward does not read)."""
    root = tmp_path_factory.mktemp("cli")
    model = save_tiny_model(str(root / "model"))
    data = root / "train.parquet"
    pd.DataFrame({"prompt": _prompts(16),
                  "reward_model": [{"ground_truth": s, "style": "rule"} for s in _sums(16)]}).to_parquet(data)
    pd.DataFrame({"prompt": _prompts(16), "answer": _sums(16)}).to_parquet(root / "answer.parquet")
    pd.DataFrame({"prompt": _prompts(16), "solution": _sums(16)}).to_parquet(root / "solution.parquet")
    return root, model, data


def _train_args(model, data, out):
    return ["--model_name_or_path", model, "--dataset_name", str(data), "--output_dir", str(out),
            "--reward_funcs", "math_reward", "_tiny.length_reward",
            "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--max_completion_length", "8", "--learning_rate", "1e-2", "--logging_steps", "1",
            "--save_strategy", "steps", "--save_steps", "2", "--report_to", "none", "--use_cpu", "True",
            "--bf16", "False", "--seed", "0", "--rpg_divergence", "fkl"]


def _args_with_local_reward(model, data, output_dir, folder, name: str, source: str) -> list[str]:
    """`_train_args` with the reward replaced by `name` from a module `name.py` (`source`) written to `folder`, the
    working directory of the run."""
    (folder / f"{name}.py").write_text(source)
    args = _train_args(model, data, output_dir)
    args[args.index("_tiny.length_reward")] = f"{name}.{name}"
    return args


def _check_run(out: Path):
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "rpg_checkpoint_complete.json").exists()
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    logs = [h for h in state["log_history"] if "loss" in h]
    assert len(logs) == 2
    assert all("rpg/w_mean" in h for h in logs)
    rewards = [h["reward"] for h in state["log_history"] if "reward" in h]
    assert rewards and all(0.0 <= r <= 1.0 for r in rewards)  # math_reward (0) + length reward in [0, 1]
    # math_reward scored every batch (a run whose rewards are all "not scored" logs None here)
    scored = [h["rewards/math_reward/mean"] for h in state["log_history"] if "rewards/math_reward/mean" in h]
    assert scored and all(isinstance(r, float) for r in scored), scored
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert (out / "tokenizer_config.json").exists()
    card = (out / "README.md").read_text()
    assert "2505.17508" in card and "| divergence | `fkl` |" in card


# ----------------------------------------------------------------------------------------------------------------
# Help
# ----------------------------------------------------------------------------------------------------------------


def test_top_level_help_lists_commands(tmp_path):
    proc = _run(_console_script() + ["--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train" in proc.stdout and "demo" in proc.stdout
    assert "arXiv:2505.17508" in proc.stdout
    assert "--use_cpu True --bf16 False" in proc.stdout  # the CPU command is documented where the commands are
    bad = _run(_console_script() + ["bogus"], cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "unknown command 'bogus'" in bad.stderr


def test_train_help_starts_with_the_launcher_options_then_lists_rpg_fields(tmp_path):
    proc = _run(_console_script() + ["train", "--help"], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    head = "\n".join(proc.stdout.splitlines()[:20])
    assert head.startswith("usage: trl-rpg train [launcher options] [training arguments]")
    for option in ("--accelerate_config", "--num_processes", "--config_file", "--mixed_precision"):
        assert option in head, option
    assert "deepspeed_zero3" in head and "zero3" in head  # the config names --accelerate_config accepts
    text = " ".join(proc.stdout.split())  # argparse wraps the help text
    from trl_rpg.trainers.config import RPGConfig

    for name in [f.name for f in RPGConfig.__dataclass_fields__.values() if f.name.startswith("rpg_")]:
        assert f"--{name}" in text, name
    fragments = ["Divergence: 'fkl' KL(ref||pi)", "Gradient estimator: 'reinforce'", "Reference policy: 'sampling'",
                 "Dual-clip bound c > 1", "--dynamic_sampling", "--model_name_or_path", "--use_peft", "--reward_funcs",
                 "soft_overlong_punishment", "(default: urkl)"]
    for fragment in fragments:
        assert fragment in text, fragment
    assert text.count("usage:") == 1  # one short usage line, not argparse's 200-line one
    assert "--config PATH" in head and "Ignored by RPG" in text  # the in-process test below checks the layout


def test_train_help_puts_config_and_rpg_fields_first_and_tells_rpg_defaults(capsys):
    """`--config` is listed with the launcher options; every RPG field comes before the reward, data, model and
    GRPO/transformers arguments; GRPO help texts that RPG makes untrue are replaced. (`trl-rpg train --help` prints
    this text too: the subprocess test above.)"""
    assert cli.main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    first = {}
    for number, line in enumerate(lines):
        flag = line.strip().split(" ", 1)[0].rstrip(",")
        if flag.startswith("--"):
            first.setdefault(flag, number)
    assert first["--config"] < 30
    from trl_rpg.trainers.config import RPGConfig

    rpg = [f"--{name}" for name in RPGConfig.__dataclass_fields__ if name.startswith(("rpg_", "dynamic_sampling"))]
    others = ("--reward_funcs", "--dataset_name", "--model_name_or_path", "--learning_rate", "--output_dir")
    assert max(first[flag] for flag in rpg) < min(first[flag] for flag in others)
    text = " ".join(text.split())
    assert "RPG sets it to `rpg_generation_reuse * gradient_accumulation_steps` (4x by default" in text
    assert "Ignored by RPG: GRPO's weighting of its k3 KL penalty" in text
    assert "or True (also 'last'/'latest') for the newest complete checkpoint" in text
    assert cli.main(["train", "--help"], launch=False, prog="python -m trl_rpg") == 0
    in_process = capsys.readouterr().out
    assert "--rpg_divergence" in in_process and "--config PATH" in in_process
    assert "--accelerate_config" not in in_process  # no launcher there


def test_no_help_text_states_a_default_that_argparse_contradicts():
    """A field left unset (None) until RPGConfig resolves it must not read "Default 0.2 ... (default: None)" in
    `--help` (issue 36 s.3): its help says what None means instead."""
    import re

    from trl_rpg.cli.arguments import make_train_parser

    contradicted = [a.option_strings[0] for a in make_train_parser()._actions
                    if a.default is None and a.help and re.search(r"[Dd]efault:? [0-9'\"]", a.help)]
    assert contradicted == []
    parser = make_train_parser()
    for flag, value in (("--epsilon", "0.2"), ("--epsilon_high", "0.28")):
        assert f"Unset (None): {value}," in parser._option_string_actions[flag].help


# ----------------------------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------------------------


#: A module of the working directory named like a dependency: it must never be imported in place of it.
_SHADOW = ("import pathlib\npathlib.Path(__file__).with_suffix('.imported').write_text('x')\n"
           "raise ImportError('shadow')\n")


def test_trl_rpg_train_runs_through_accelerate_launch_and_resumes_with_true(tiny_setup):
    """A run through the real launcher, from a folder holding `torch.py`, `peft.py` and `datasets.py` (never
    imported: the training process runs with `PYTHONSAFEPATH=1`, so the working directory is not first on `sys.path`;
    `torch` is imported before `trl_rpg.__main__` could take it off); then `--resume_from_checkpoint True` continues
    it from its newest checkpoint (not a path called 'True')."""
    root, model, data = tiny_setup
    out = root / "console"
    cwd = root / "shadowing"
    cwd.mkdir()
    for name in ("torch", "peft", "datasets"):
        (cwd / f"{name}.py").write_text(_SHADOW)
    # `--num_processes 1` is not a training argument: it must be routed to `accelerate launch`.
    proc = _run(_console_script() + ["train", *_train_args(model, data, out), "--num_processes", "1"], cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Training completed." in proc.stdout
    assert not list(cwd.glob("*.imported"))
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr  # DeepSpeed's notice, on every CPU run
    _check_run(out)
    assert (out / "rpg_curves.png").read_bytes()[:4] == b"\x89PNG"  # the run's curves (trl_rpg.evaluation.plots)
    # no launcher noise: accelerate gets the values it would otherwise announce, and no deprecated transformers
    # argument is set by trl-rpg or warned about from TRL's own calls (_compat.TRL_INTERNAL_DEPRECATIONS)
    assert "were not passed to `accelerate launch`" not in proc.stderr
    deprecations = [line for line in proc.stderr.splitlines() if "FutureWarning:" in line and "deprecated" in line]
    assert deprecations == [], deprecations

    args = _train_args(model, data, out)
    args[args.index("--max_steps") + 1] = "3"
    resumed = _run(_console_script() + ["train", *args, "--resume_from_checkpoint", "True"], cwd=cwd)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    assert resumed.stdout.count("'loss':") == 1  # one step trained: steps 1-2 came from checkpoint-2
    assert "already holds" not in resumed.stderr  # resuming: no warning about the checkpoints it resumes
    # one line says which checkpoint, which step, verified
    files = json.loads((out / "checkpoint-2" / "rpg_checkpoint_complete.json").read_text())["files"]
    resuming = [line for line in resumed.stderr.splitlines() if "RPGTrainer: resuming from" in line]
    assert resuming == [f"RPGTrainer: resuming from {out / 'checkpoint-2'} at step 2 (verified: its {len(files)} "
                        "files match the sizes and SHA-256 checksums its manifest records)."], resuming
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3]


def test_python_m_trl_rpg_does_not_import_the_working_directory_first(tmp_path):
    """`python -m trl_rpg` run by hand (or by `accelerate launch -m trl_rpg`, without `PYTHONSAFEPATH`): a `trl.py`
    in the working directory is not imported in place of TRL."""
    (tmp_path / "trl.py").write_text(_SHADOW)
    proc = _run([sys.executable, "-m", "trl_rpg", "train", "--help"], cwd=tmp_path, timeout=180, PYTHONSAFEPATH=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "trl.imported").exists() and "--rpg_divergence" in proc.stdout


def test_resume_argument_values():
    for value in ("True", "true", "last", "latest", True):
        assert cli.resume_argument(value) is True
    for value in ("False", "None", "", None, False):
        assert cli.resume_argument(value) is None
    assert cli.resume_argument("out/checkpoint-4") == "out/checkpoint-4"


#: A CPU run of a local model on a local data file (the README's quick local run before its quick start ran the toy
#: recipe, which tests/test_readme_commands.py runs word for word).
_CPU_COMMAND = ["trl-rpg", "train", "--model_name_or_path", "./my-model", "--dataset_name", "train.parquet",
                "--output_dir", "out", "--max_steps", "2", "--use_cpu", "True", "--bf16", "False"]


def test_cpu_run_scores_a_prompt_answer_dataset(tmp_path):
    """A CPU run on a data set with `prompt` + `answer` columns: it trains, and the default `math_reward` scores
    every batch (as the example scores such data), instead of "not scored"."""
    argv = _CPU_COMMAND
    save_tiny_model(str(tmp_path / "my-model"))
    pd.DataFrame({"prompt": _prompts(16), "answer": _sums(16)}).to_parquet(tmp_path / "train.parquet")
    # plus a length reward: a tiny random model never solves a problem, and a run whose rewards never differ
    # within a group (no learning signal) is refused at its end
    proc = _run(_console_script() + argv[1:] + ["--reward_funcs", "math_reward", "_tiny.length_reward"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (tmp_path / "out" / "model.safetensors").exists()
    import re

    scored = re.findall(r"'rewards/math_reward/mean': ('[0-9.e+-]+'|None)", proc.stdout)
    assert scored and "None" not in scored, scored
    assert "All reward functions returned None" not in proc.stderr


def test_launcher_splits_training_and_accelerate_arguments(monkeypatch):
    from accelerate.commands import launch

    seen = {}
    monkeypatch.setattr(launch, "launch_command", lambda args: seen.setdefault("args", args))
    argv = ["--model_name_or_path", "m", "--output_dir", "o", "--num_processes", "8", "--rpg_divergence", "rkl",
            "--accelerate_config", "deepspeed_zero3", "--beta", "0.001", "--use_cpu", "True"]
    assert cli.main(["train", *argv]) == 0
    args = seen["args"]
    assert args.module and args.training_script == "trl_rpg"
    assert args.training_script_args == ["train", "--model_name_or_path", "m", "--output_dir", "o",
                                         "--rpg_divergence", "rkl", "--beta", "0.001", "--use_cpu", "True"]
    assert args.num_processes == 8
    assert Path(args.config_file).resolve() == (ROOT / "accelerate_configs" / "deepspeed_zero3.yaml").resolve()
    assert args.num_machines is None and args.mixed_precision is None  # a config file: accelerate reads it there


def test_launcher_passes_accelerate_the_values_it_would_pick(monkeypatch, tmp_path):
    import accelerate.commands.config as accelerate_config
    from accelerate.commands import launch

    monkeypatch.setattr(accelerate_config, "default_config_file", str(tmp_path / "absent.yaml"))
    monkeypatch.setattr(cli.launcher, "_local_device_count", lambda: 0)
    seen = []
    monkeypatch.setattr(launch, "launch_command", seen.append)
    # one process trains in the launcher's process, with the arguments accelerate completes
    monkeypatch.setattr(cli.launcher, "train_in_this_process", lambda args, prog: seen.append(args) or 0)
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True"]) == 0
    args = seen[-1]
    assert (args.num_processes, args.num_machines, args.mixed_precision, args.dynamo_backend) == (1, 1, "no", "no")
    assert not args.multi_gpu
    monkeypatch.setattr(cli.launcher, "_local_device_count", lambda: 4)  # as accelerate does on a 4-GPU machine
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True"]) == 0
    assert seen[-1].num_processes == 4 and seen[-1].multi_gpu
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True",
                     "--num_processes", "2"]) == 0
    assert seen[-1].num_processes == 2 and seen[-1].multi_gpu  # the user's value wins
    monkeypatch.setattr(cli.launcher, "_local_device_count", lambda: 0)  # no GPU: several CPU processes (DDP, gloo)
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True",
                     "--num_processes", "2"]) == 0
    assert seen[-1].num_processes == 2 and seen[-1].multi_gpu  # accelerate's simple launcher would start one
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True"]) == 0
    assert seen[-1].num_processes == 1 and not seen[-1].multi_gpu


def test_launcher_exits_with_the_training_process_status(tiny_setup):
    """A training process that fails: the launcher exits with its status and prints nothing after its error (no
    accelerate `CalledProcessError` traceback)."""
    root, model, data = tiny_setup
    # a module of the working directory
    args = _args_with_local_reward(model, data, root / "failing", root, "exiting_reward", (
        "import os, sys\n\n\ndef exiting_reward(completions, **kwargs):\n"
        "    print('exiting_reward: the reward server is down', file=sys.stderr, flush=True)\n"
        "    os._exit(3)\n"))  # a process that dies with status 3 (a reward's sys.exit is a reward error: status 1)
    (root / "failing" / "checkpoint-7").mkdir(parents=True)  # an earlier run's checkpoint
    proc = _run(_console_script() + ["train", *args], cwd=root)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "CalledProcessError" not in proc.stderr and "Traceback" not in proc.stderr
    tail = [line for line in proc.stderr.splitlines() if line.strip()][-3:]
    assert any("the reward server is down" in line for line in tail), tail
    # the trainer's warning about another run's checkpoints, said once (the CLI adds none of its own)
    warnings = [line for line in proc.stderr.splitlines() if "already holds" in line]
    assert len(warnings) == 1 and "already holds 1 checkpoint(s) of another run (checkpoint-7)" in warnings[0]


@pytest.mark.distributed
def test_two_processes_on_cpu_run_and_the_failing_ones_status_is_returned(tiny_setup, tmp_path):
    """`--num_processes 2` without GPU starts two training processes (not one, silently); when one of them fails
    with status 3, the launcher exits 3 (not 1)."""
    root, model, data = tiny_setup
    args = _args_with_local_reward(model, data, tmp_path / "out", tmp_path, "rank_reward", (
        "import os, pathlib, sys, time\n\n\ndef rank_reward(completions, **kwargs):\n"
        "    rank = os.environ.get('RANK', '0')\n"
        "    pathlib.Path(f'rank{rank}.seen').write_text(os.environ.get('WORLD_SIZE', '1'))\n"
        "    if rank == '1':\n"
        "        os._exit(3)\n"
        "    time.sleep(30)\n"
        "    os._exit(4)\n"))
    args[args.index("--per_device_train_batch_size") + 1] = "4"
    proc = _run(_console_script() + ["train", *args, "--num_processes", "2", "--main_process_port", str(_free_port())],
                cwd=tmp_path, HF_HOME=str(tmp_path / "hf"))  # no accelerate default config of this machine
    assert sorted(p.name for p in tmp_path.glob("rank*.seen")) == ["rank0.seen", "rank1.seen"], proc.stderr[-3000:]
    assert (tmp_path / "rank1.seen").read_text() == "2"
    assert proc.returncode == 3, proc.stderr[-3000:]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


#: A stand-in for the launcher of several training processes: it starts `python -m trl_rpg train ARGS` as
#: `trl-rpg train` does (telling it its pid), then waits.
_WAITING_LAUNCHER = ("import os, subprocess, sys, time\n"
                     "env = dict(os.environ, TRL_RPG_LAUNCHER_PID=str(os.getpid()))\n"
                     "subprocess.Popen([sys.executable, '-m', 'trl_rpg', 'train', *sys.argv[1:]], env=env)\n"
                     "time.sleep(600)\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_launcher_with_sigkill_ends_the_training_process(tiny_setup, tmp_path):
    """`kill -9` of the launcher (no chance to forward anything): a training process it started ends too, instead
    of going on writing checkpoints (and holding GPUs) as an orphan. (One process trains in `trl-rpg train`'s own
    process; several are its children, as the training process here, which waits in its reward module's import
    until it is killed. tests/test_cli_launcher.py checks that `trl-rpg train` tells them its pid.)"""
    import signal

    root, model, data = tiny_setup
    (tmp_path / "pid_reward.py").write_text("import os, pathlib, time\npathlib.Path('child.pid').write_text("
                                            "str(os.getpid()))\ntime.sleep(300)\n\n\ndef pid_reward(**kwargs):\n"
                                            "    return []\n")
    args = _train_args(model, data, tmp_path / "out")
    args[args.index("_tiny.length_reward")] = "pid_reward.pid_reward"
    launcher = subprocess.Popen([sys.executable, "-c", _WAITING_LAUNCHER, *args], cwd=tmp_path, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file, child = tmp_path / "child.pid", None
    try:
        deadline = time.monotonic() + 240
        while not pid_file.exists() or not pid_file.read_text():
            assert launcher.poll() is None and time.monotonic() < deadline, "the training never imported its reward"
            time.sleep(0.5)
        child = int(pid_file.read_text())
        assert child != launcher.pid and not _gone(child)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(child), "the training process outlived its launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------------------
# Mistakes: one clear message naming the thing to fix, as the last line, within seconds
# ----------------------------------------------------------------------------------------------------------------


def _refused(tiny_setup, *args, expect_status=2, **env):
    """Run `trl-rpg train` with a mistake; check that it is refused quickly with status 2, before anything is
    launched; return the last line."""
    root, model, data = tiny_setup
    tripwire = root / "tripwire.yaml"  # an accelerate config that cannot be read: reaching the launch would crash
    tripwire.write_text("compute_environment: [this is not yaml\n")
    base = ["--model_name_or_path", model, "--output_dir", str(root / "never"), "--use_cpu", "True", "--bf16", "False",
            "--config_file", str(tripwire)]
    if "--dataset_name" not in args:
        base += ["--dataset_name", str(data)]
    start = time.monotonic()
    proc = _run(_console_script() + ["train", *base, *args], cwd=root, timeout=FAST_FAILURE_S * 2, **env)
    elapsed = time.monotonic() - start
    assert proc.returncode == expect_status, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert elapsed < FAST_FAILURE_S, elapsed
    assert "Traceback" not in proc.stderr and "usage: accelerate" not in proc.stderr + proc.stdout
    assert not (root / "never").exists()  # nothing was trained or saved
    last = _last_line(proc.stderr)
    assert last.startswith("trl-rpg train: error: "), last
    return last


def test_misspelled_flag_is_refused_with_the_closest_name(tiny_setup):
    last = _refused(tiny_setup, "--rpg_divergnce", "urkl")
    assert "--rpg_divergnce" in last and "did you mean --rpg_divergence?" in last


def test_missing_local_data_file_is_reported_at_once_without_asking_the_hub(tiny_setup):
    # with the Hub reachable in principle (not offline), at an address that refuses connections: a Hub attempt would
    # end in a connection error, not in "no such file"
    last = _refused(tiny_setup, "--dataset_name", "nope.parquet", HF_HUB_OFFLINE=None, HF_DATASETS_OFFLINE=None,
                    HF_ENDPOINT="http://127.0.0.1:9")
    assert "--dataset_name 'nope.parquet': no such file" in last


def test_mistyped_local_model_path_is_reported_at_once(tiny_setup):
    last = _refused(tiny_setup, "--model_name_or_path", "./my-modle")
    assert "--model_name_or_path './my-modle': no such folder" in last and "Hub model id" in last


def test_data_without_a_prompt_column_is_refused_naming_the_example(tiny_setup):
    root = tiny_setup[0]
    pd.DataFrame({"problem": ["1+1", "2+2"], "answer": ["2", "4"]}).to_parquet(root / "problems.parquet")
    last = _refused(tiny_setup, "--dataset_name", str(root / "problems.parquet"))
    assert "no 'prompt' column (its columns: ['problem', 'answer'])" in last and "examples/rpg_math.py" in last


def test_resume_path_that_does_not_exist_is_reported_at_once(capsys):
    last = _refused_in_process(capsys, "--resume_from_checkpoint", "out/checkpoint-9")
    assert "--resume_from_checkpoint 'out/checkpoint-9': no such folder" in last


def test_a_dotted_name_that_is_not_a_reward_function_is_refused_at_launch(tiny_setup, capsys):
    last = _refused(tiny_setup, "--reward_funcs", "os.system")
    assert "--reward_funcs 'os.system': does not accept **kwargs (its arguments: (command))" in last
    for name, why in (("builtins.eval", "positional-only"), ("builtins.print", "does not accept **kwargs"),
                      ("collections.OrderedDict", "is a class"), ("math.pi", "not callable (a float)")):
        last = _refused_in_process(capsys, "--reward_funcs", name)
        assert f"--reward_funcs {name!r}: " in last and why in last, last


def test_one_process_asked_twice_is_refused_not_run_once(capsys):
    """`--num_processes 2` with a config of one process (`distributed_type: NO`) would silently start one."""
    last = _refused_in_process(capsys, "--accelerate_config", "single_process", "--num_processes", "2")
    assert "--num_processes 2 with the accelerate config" in last and "would start one process" in last
    assert "--accelerate_config multi_gpu" in last


def test_unknown_accelerate_config_lists_the_names(tiny_setup):
    last = _refused(tiny_setup, "--accelerate_config", "deepspeed_zero4")
    assert "'deepspeed_zero4'" in last
    for name in ("deepspeed_zero3", "single_process", "zero3", "fsdp2"):  # this repository's and TRL's
        assert f"'{name}'" in last, name
    assert "Did you mean 'deepspeed_zero3'?" in last


def test_indivisible_generation_batch_says_where_it_comes_from(tiny_setup):
    last = _refused(tiny_setup, "--per_device_train_batch_size", "4", "--num_generations", "3")
    assert ("generation batch of 16 completions = per_device_train_batch_size 4 x steps_per_generation 4 "
            "(= rpg_generation_reuse 4 x gradient_accumulation_steps 1) x 1 process(es)") in last
    assert "num_generations (3)" in last and "per_device_train_batch_size to a multiple of 3" in last


def _refused_in_process(capsys, *args):
    """The launcher's checks, called in this process (as the console script calls them): status and last line."""
    status = cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", *args])
    assert status == 2
    return _last_line(capsys.readouterr().err)


def test_misspelled_launcher_option_and_unknown_reward_function(capsys):
    last = _refused_in_process(capsys, "--num_proceses", "2")
    assert last.startswith("trl-rpg train: error: unknown argument --num_proceses (did you mean --num_processes?)")
    last = _refused_in_process(capsys, "--num_processes", "two")
    assert last.startswith("trl-rpg train: error: launcher option argument --num_processes")
    assert last.endswith("invalid int value: 'two'.")
    last = _refused_in_process(capsys, "stray")
    assert last.startswith("trl-rpg train: error: unexpected argument 'stray'")
    last = _refused_in_process(capsys, "--reward_funcs", "math_rewrd")
    assert "'math_rewrd'" in last and "Did you mean 'math_reward'?" in last and "'toy_reward'" in last


def test_dataset_without_the_reward_columns_is_refused_before_launch(tiny_setup):
    root = tiny_setup[0]
    last = _refused(tiny_setup, "--dataset_name", str(root / "solution.parquet"))
    assert "'math_reward'" in last
    assert "['ground_truth', 'reward_model', 'answer']" in last  # looked for
    assert "['prompt', 'solution']" in last  # present


def test_in_process_train_checks_columns_before_loading_the_model(tiny_setup):
    """`python -m trl_rpg train` (each launched process) checks the data against the reward functions before the
    model: a model path that does not exist is never reached."""
    root = tiny_setup[0]
    start = time.monotonic()
    proc = _run([sys.executable, "-m", "trl_rpg", "train", "--model_name_or_path", str(root / "no-such-model"),
                 "--dataset_name", str(root / "solution.parquet"), "--output_dir", str(root / "never"),
                 "--use_cpu", "True", "--bf16", "False"], cwd=root, timeout=FAST_FAILURE_S * 2)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert time.monotonic() - start < FAST_FAILURE_S
    last = _last_line(proc.stderr)
    assert last.startswith("python -m trl_rpg train: error: The data set lacks the columns"), last
    assert "['prompt', 'solution']" in last and "no-such-model" not in proc.stderr


# ----------------------------------------------------------------------------------------------------------------
# Pieces
# ----------------------------------------------------------------------------------------------------------------


def test_in_process_train_refuses_launcher_options(tiny_setup, capsys):
    root, model, data = tiny_setup
    status = cli.main(["train", *_train_args(model, data, root / "bad"), "--num_processes", "1"], launch=False)
    assert status == 2
    last = _last_line(capsys.readouterr().err)
    assert "unknown argument --num_processes" in last and "accelerate launch" in last


def test_accelerate_config_names_and_errors(tmp_path):
    own = cli.resolve_accelerate_config(["--accelerate_config", "single_process", "--num_processes", "1"])
    assert own[0] == "--config_file" and own[1].endswith("accelerate_configs/single_process.yaml")
    assert own[2:] == ["--num_processes", "1"]
    trl_shipped = cli.resolve_accelerate_config(["--accelerate_config", "zero2"])  # one of TRL's own configs
    assert Path(trl_shipped[1]).name == "zero2.yaml" and Path(trl_shipped[1]).is_file()
    path = tmp_path / "mine.yaml"
    path.write_text("num_processes: 1\n")
    assert cli.resolve_accelerate_config(["--accelerate_config", str(path)])[:2] == ["--config_file", str(path)]
    assert cli.resolve_accelerate_config(["--num_processes", "2"]) == ["--num_processes", "2"]
    names = cli.available_accelerate_configs()
    assert {"deepspeed_zero3", "single_process", "zero3"} <= set(names)
    with pytest.raises(ValueError, match=r"'no-such-config'.*'deepspeed_zero3'"):
        cli.resolve_accelerate_config(["--accelerate_config", "no-such-config"])


def test_launcher_argument_check():
    training_flags = ["--beta", "--rpg_divergence"]
    cli.check_launcher_arguments(["--num_processes", "2", "--config_file", "c.yaml", "--main_process_port=29500"],
                                 training_flags)
    with pytest.raises(ValueError, match=r"--rpg_divergnce \(did you mean --rpg_divergence\?\)"):
        cli.check_launcher_arguments(["--rpg_divergnce", "urkl"], training_flags)
    with pytest.raises(ValueError, match=r"--zzz, --betaa \(did you mean --beta\?\)"):
        cli.check_launcher_arguments(["--zzz", "-1", "--betaa=2"], training_flags)


def test_reward_names_resolve_and_unknown_ones_fail():
    from trl_rpg.rewards import math_reward
    from trl_rpg.toy import toy_reward

    funcs = cli.resolve_reward_funcs(["math_reward", "toy_reward", "soft_overlong_punishment",
                                      "_tiny.length_reward"], max_completion_length=16, soft_punish_cache=4)
    assert funcs[0] is math_reward and funcs[1] is toy_reward
    assert funcs[2](completion_ids=[[1] * 12, [1] * 14]) == [0.0, -0.5]  # soft punishment from 12 to 16 tokens
    assert funcs[3](["abcd"]) == [0.5]
    assert cli.resolve_reward_funcs(None, 16, 4) == [math_reward]  # 1 / 0 by default (paper_math_reward: +1 / -1)
    with pytest.raises(ValueError, match="Unknown reward function 'nope'"):
        cli.resolve_reward_funcs(["nope"], 16, 4)
    with pytest.raises(ValueError, match="cannot import 'fn' from 'no_such_module'"):
        cli.resolve_reward_funcs(["no_such_module.fn"], 16, 4)
    # the help of --reward_funcs lists every registered name
    help_text = cli.RPGScriptArguments.__dataclass_fields__["reward_funcs"].metadata["help"]
    from trl_rpg.rewards import REWARD_FUNCS

    assert all(f"'{name}'" in help_text for name in REWARD_FUNCS)


def test_local_data_files_are_loaded_as_the_train_split(tmp_path):
    rows = [{"prompt": "1+1", "ground_truth": "2"}, {"prompt": "2+2", "ground_truth": "4"}]
    pd.DataFrame(rows).to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    script_args = cli.RPGScriptArguments(dataset_name=str(tmp_path / "d.jsonl"))
    data = cli.load_training_data(script_args)
    assert list(data) == ["train"] and data["train"]["ground_truth"] == ["2", "4"]
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported file type"):
        cli.load_training_data(cli.RPGScriptArguments(dataset_name=str(tmp_path / "d.txt")))
    with pytest.raises(ValueError, match="No training data"):
        cli.load_training_data(cli.RPGScriptArguments(dataset_name=None))
    for missing in ("nope.parquet", "./data/nope.jsonl", "sub/x.CSV"):
        with pytest.raises(FileNotFoundError, match="no such file"):
            cli.load_training_data(cli.RPGScriptArguments(dataset_name=missing))
    cli.check_dataset_name("org/hub-dataset")  # a Hub id is left to `datasets`


def test_cpu_machine_without_use_cpu_is_told_the_flags(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("bf16 is supported on this machine")
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o"]) == 2
    last = _last_line(capsys.readouterr().err)
    assert "bf16" in last and "pass --use_cpu True --bf16 False" in last
