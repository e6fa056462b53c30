"""How a `trl-rpg train` run ends: every way (success, an error raised while training, no learning signal, Ctrl-C;
the CLI and examples/rpg_math.py) goes through `trainer.end()` as TRL's `grpo.py` does (trackers finished, process
group destroyed); an error is the last line printed, naming the reward function's file and line; what
`trl-rpg train` hands `RPGTrainer` (the eval split, `--model_init_kwargs`)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _tiny import console_script as _console_script
from _tiny import save_tiny_model

from trl_rpg import cli
from trl_rpg.run.reward_calls import checked_reward_function

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _prompts(n):
    return [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}] for i in range(n)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    model = save_tiny_model(str(root / "model"))
    data = root / "train.parquet"
    pd.DataFrame({"prompt": _prompts(16), "answer": [str(i % 10) for i in range(16)]}).to_parquet(data)
    return root, model, data


def _train_args(model, data, out, *extra):
    return ["--model_name_or_path", model, "--dataset_name", str(data), "--output_dir", str(out),
            "--max_steps", "1", "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--rpg_generation_reuse", "1", "--max_completion_length", "8", "--report_to", "none",
            "--save_strategy", "no", "--use_cpu", "True", "--bf16", "False", "--seed", "0", *extra]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture
def ends(monkeypatch):
    """Each `Accelerator.end_training()` call (what `Trainer.end()` runs: finish the trackers, destroy the process
    group)."""
    from accelerate import Accelerator

    calls = []
    original = Accelerator.end_training

    def recorded(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(Accelerator, "end_training", recorded)
    return calls


# ----------------------------------------------------------------------------------------------------------------
# Every way a run ends goes through trainer.end()
# ----------------------------------------------------------------------------------------------------------------


def test_every_way_a_cli_run_ends_goes_through_trainer_end(tiny, ends, monkeypatch, capsys):
    """Success, an error raised in training, Ctrl-C: `trainer.end()` once each (training itself is replaced, the
    trainer is real); the error and the interruption are the last line, with their exit status. The error line also
    goes to the error file torchrun gives a training process, for the launcher to print last."""
    from trl_rpg.trainers.trainer import RPGTrainer

    root, model, data = tiny
    error_file = root / "torchelastic-error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    outcomes = {"fine": None, "error": RuntimeError("the reward server is down"), "ctrl-c": KeyboardInterrupt()}
    statuses = {}
    for name, outcome in outcomes.items():
        def train(self, outcome=outcome, **kwargs):
            if outcome is not None:
                raise outcome

        monkeypatch.setattr(RPGTrainer, "train", train)
        before = len(ends)
        statuses[name] = cli.main(["train", *_train_args(model, data, root / name)], launch=False,
                                  prog="python -m trl_rpg")
        assert len(ends) == before + 1, name
        statuses[name, "last"] = _last_line(capsys.readouterr().err)
    assert (statuses["fine"], statuses["error"], statuses["ctrl-c"]) == (0, 1, 130)
    assert statuses["error", "last"] == "python -m trl_rpg train: error: RuntimeError: the reward server is down"
    assert json.loads(error_file.read_text())["message"] == statuses["error", "last"]
    assert statuses["ctrl-c", "last"].startswith("python -m trl_rpg train: interrupted")
    assert (root / "fine" / "model.safetensors").exists()


def test_ctrl_c_is_said_once_over_several_processes(tiny, monkeypatch, capsys):
    """Every training process gets Ctrl-C (the terminal signals the whole process group): the first one (`RANK` 0)
    says so, the others only exit 130, so a two-process run prints the line once (issue 36 s.3)."""
    from trl_rpg.cli import training

    root, model, data = tiny

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "prepare_training", lambda *args: None)
    monkeypatch.setattr(training, "train", interrupted)
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        status = training.run_train(_train_args(model, data, root / "ctrl-c"), prog="trl-rpg train")
        said[rank] = capsys.readouterr().err.count("trl-rpg train: interrupted (Ctrl-C).")
        assert status == 130, rank
    assert said == {"0": 1, "1": 0}


def _load_rpg_math():
    spec = importlib.util.spec_from_file_location("rpg_math_example", ROOT / "examples" / "rpg_math.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


def test_every_way_an_example_run_ends_goes_through_trainer_end(tiny, ends, monkeypatch):
    from trl_rpg.trainers.trainer import RPGTrainer

    root, model, data = tiny
    example = _load_rpg_math()
    for name, outcome in (("fine", None), ("error", RuntimeError("the reward server is down"))):
        def train(self, outcome=outcome, **kwargs):
            if outcome is not None:
                raise outcome

        monkeypatch.setattr(RPGTrainer, "train", train)
        parsed = example.make_parser().parse_args_and_config(
            _train_args(model, data, root / f"example-{name}", "--eval_benchmarks", "none", "--dynamic_sampling",
                        "False"))
        before = len(ends)
        if outcome is None:
            example.main(*parsed)
        else:
            with pytest.raises(RuntimeError, match="the reward server is down"):
                example.main(*parsed)
        assert len(ends) == before + 1, name


def test_a_run_without_learning_signal_fails_with_the_final_model_saved_and_its_reason_last(tiny, ends, capsys):
    """`trl-rpg train` asks for a learning signal (`rpg_require_learning_signal=True`): a run whose rewards never
    differ within a group exits non-zero, its final model saved (`save_strategy="no"`: the only copy), the verdict
    as the last line, through `trainer.end()`."""
    root, model, data = tiny
    out = root / "no-signal"
    # math_reward (the default) on a tiny random model: 0 for every completion
    status = cli.main(["train", *_train_args(model, data, out)], launch=False, prog="python -m trl_rpg")
    err = capsys.readouterr().err
    last = _last_line(err)
    assert status == 1
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    assert last.startswith("python -m trl_rpg train: error: NoLearningSignal: RPGTrainer: none of the 1 optimizer "
                           "steps carried a learning signal"), last
    assert "Traceback" not in err  # a designed stop, not a bug: its line only (issue 36 s.3)
    assert len(ends) == 1


# ----------------------------------------------------------------------------------------------------------------
# An error raised while training: the last line, with the reward function's file and line
# ----------------------------------------------------------------------------------------------------------------

_BAD_REWARDS = """\
def raising_reward(completions, **kwargs):
    scores = []
    for completion in completions:
        scores.append(1 / 0)
    return scores


def dict_reward(completions, **kwargs):
    return {"score": [1.0] * len(completions)}


def short_reward(completions, **kwargs):
    return [1.0] * (len(completions) - 1)
"""


@pytest.fixture
def bad_rewards(tmp_path, monkeypatch):
    (tmp_path / "bad_rewards.py").write_text(_BAD_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import bad_rewards

    yield bad_rewards
    sys.modules.pop("bad_rewards", None)


@pytest.mark.parametrize("name, where", [("raising_reward", "It raised at {}:4, in raising_reward."),
                                         ("dict_reward", "`dict_reward` is defined at {}:8."),
                                         ("short_reward", "`short_reward` is defined at {}:12.")])
def test_a_reward_functions_error_names_its_file_and_line(bad_rewards, name, where):
    """Where it raised (the line in the reward function's file), or, for a result of the wrong shape, where the
    function is defined: in the message itself, which `trl-rpg train` prints as its last line (a file outside the
    working directory by its full path)."""
    wrapped = checked_reward_function(getattr(bad_rewards, name), name)
    with pytest.raises((RuntimeError, ValueError)) as raised:
        wrapped(prompts=["p"] * 4, completions=["c"] * 4, completion_ids=[[1]] * 4)
    message = str(raised.value)
    assert message.startswith(f"Reward function `{name}`")
    assert where.format(bad_rewards.__file__) in message, message


def test_an_error_raised_in_training_is_the_last_line_printed_with_the_reward_functions_line(tiny, tmp_path):
    """Through the console script: a reward function with a bug. Its traceback is printed, then the error as the last
    line (no progress bar after it), naming the file and line where it raised; exit status 1."""
    root, model, data = tiny
    (tmp_path / "bad_rewards.py").write_text(_BAD_REWARDS)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(_console_script() + ["train", *_train_args(model, data, tmp_path / "out", "--reward_funcs",
                                                                     "bad_rewards.raising_reward")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    last = _last_line(proc.stderr)
    assert last.startswith("trl-rpg train: error: RuntimeError: Reward function `raising_reward` raised "
                           "ZeroDivisionError: division by zero"), proc.stderr[-3000:]
    assert last.endswith("It raised at bad_rewards.py:4, in raising_reward.")  # relative to the working directory
    assert "Traceback" in proc.stderr and 'bad_rewards.py", line 4, in raising_reward' in proc.stderr


# ----------------------------------------------------------------------------------------------------------------
# What trl-rpg train hands RPGTrainer
# ----------------------------------------------------------------------------------------------------------------


def test_train_evaluates_on_the_test_split_and_passes_model_init_kwargs(tmp_path, monkeypatch):
    """A folder data set with train and test files: training on `train`, evaluation on `test` (never on the train
    split); `--model_init_kwargs` reach the model's `from_pretrained` beside ModelConfig's settings."""
    import trl_rpg.trainers.trainer

    folder = tmp_path / "data"
    folder.mkdir()
    pd.DataFrame({"prompt": _prompts(16), "answer": ["1"] * 16}).to_parquet(folder / "train.parquet")
    pd.DataFrame({"prompt": _prompts(4), "answer": ["2"] * 4}).to_parquet(folder / "test.parquet")
    parser = cli.make_train_parser("python -m trl_rpg train")
    *parsed, _ = parser.parse_args_and_config(
        ["--model_name_or_path", str(tmp_path), "--dataset_name", str(folder), "--output_dir", str(tmp_path / "o"),
         "--use_cpu", "True", "--bf16", "False", "--eval_strategy", "steps", "--eval_steps", "1",
         "--model_init_kwargs", '{"low_cpu_mem_usage": true}', "--model_revision", "v2"],
        return_remaining_strings=True)
    setup = cli.prepare_training(*parsed)
    assert setup.train_dataset["answer"] == ["1"] * 16 and setup.eval_dataset["answer"] == ["2"] * 4

    class Stop(Exception):
        pass

    def recorded(self, model, reward_funcs, args, train_dataset, eval_dataset, **kwargs):
        self.seen = {"args": args, "eval_dataset": eval_dataset}
        raise Stop(self)

    monkeypatch.setattr(trl_rpg.trainers.trainer.RPGTrainer, "__init__", recorded)
    with pytest.raises(Stop) as stopped:
        cli.train(*parsed, setup=setup)
    seen = stopped.value.args[0].seen
    assert seen["eval_dataset"]["answer"] == ["2"] * 4
    kwargs = seen["args"].model_init_kwargs
    assert kwargs["low_cpu_mem_usage"] is True and kwargs["revision"] == "v2"
