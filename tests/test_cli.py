"""The `trl-rpg` command line: help texts, `trl-rpg train` through `accelerate launch`, `python -m trl_rpg train`."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _tiny import save_tiny_model

from trl_rpg import cli

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    return env


def _console_script() -> list[str]:
    """The installed `trl-rpg` script next to this interpreter (else the same entry point through python -c)."""
    script = Path(sys.executable).with_name("trl-rpg")
    if script.exists():
        return [str(script)]
    found = shutil.which("trl-rpg")
    return [found] if found else [sys.executable, "-c", "import sys; from trl_rpg.cli import main; sys.exit(main())"]


def _run(cmd, cwd, timeout=300):
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A tiny local model and a local parquet file in the DAPO-Math format (prompt + reward_model.ground_truth)."""
    root = tmp_path_factory.mktemp("cli")
    model = save_tiny_model(str(root / "model"))
    rows = [{"prompt": [{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}],
             "reward_model": {"ground_truth": str(i % 10 + (3 * i) % 10), "style": "rule"}} for i in range(16)]
    data = root / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    return root, model, data


def _train_args(model, data, out):
    return ["--model_name_or_path", model, "--dataset_name", str(data), "--output_dir", str(out),
            "--reward_funcs", "math_reward", "_tiny.length_reward",
            "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--max_completion_length", "8", "--learning_rate", "1e-2", "--logging_steps", "1",
            "--save_strategy", "steps", "--save_steps", "2", "--report_to", "none", "--use_cpu", "True",
            "--bf16", "False", "--seed", "0", "--rpg_divergence", "fkl"]


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
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert (out / "tokenizer_config.json").exists()
    card = (out / "README.md").read_text()
    assert "2505.17508" in card and "| divergence | `fkl` |" in card


def test_top_level_help_lists_commands(tmp_path):
    proc = _run(_console_script() + ["--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train" in proc.stdout and "demo" in proc.stdout
    assert "arXiv:2505.17508" in proc.stdout
    bad = _run(_console_script() + ["bogus"], cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "unknown command 'bogus'" in bad.stderr


def test_train_help_lists_rpg_fields_with_help_text(tmp_path):
    proc = _run(_console_script() + ["train", "--help"], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())  # argparse wraps the help text
    from trl_rpg.config import RPGConfig

    for name in [f.name for f in RPGConfig.__dataclass_fields__.values() if f.name.startswith("rpg_")]:
        assert f"--{name}" in text, name
    fragments = ["Divergence: 'fkl' KL(ref||pi)", "Gradient estimator: 'reinforce'", "Reference policy: 'sampling'",
                 "Dual-clip bound c > 1", "--dynamic_sampling", "--model_name_or_path", "--use_peft", "--reward_funcs",
                 "soft_overlong_punishment", "(default: urkl)"]
    for fragment in fragments:
        assert fragment in text, fragment


def test_trl_rpg_train_runs_through_accelerate_launch(tiny_setup):
    root, model, data = tiny_setup
    out = root / "console"
    # `--num_processes 1` is not a training argument: it must be routed to `accelerate launch`.
    proc = _run(_console_script() + ["train", *_train_args(model, data, out), "--num_processes", "1"], cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Training completed." in proc.stdout
    _check_run(out)


def test_python_m_trl_rpg_train_runs_in_process(tiny_setup):
    root, model, data = tiny_setup
    out = root / "module"
    proc = _run([sys.executable, "-m", "trl_rpg", "train", *_train_args(model, data, out)], cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    _check_run(out)
    # the in-process path does not accept launcher arguments
    with pytest.raises(ValueError, match="--num_processes"):
        cli.main(["train", *_train_args(model, data, root / "bad"), "--num_processes", "1"], launch=False)


def test_launcher_splits_training_and_accelerate_arguments(monkeypatch):
    import accelerate.commands.launch as launch

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
    with pytest.raises(ValueError, match="no-such-config"):
        cli.resolve_accelerate_config(["--accelerate_config", "no-such-config"])


def test_reward_names_resolve_and_unknown_ones_fail():
    from trl_rpg.rewards import math_reward
    from trl_rpg.toy import toy_reward

    funcs = cli.resolve_reward_funcs(["math_reward", "toy_reward", "soft_overlong_punishment",
                                      "_tiny.length_reward"], max_completion_length=16, soft_punish_cache=4)
    assert funcs[0] is math_reward and funcs[1] is toy_reward
    assert funcs[2](completion_ids=[[1] * 12, [1] * 14]) == [0.0, -0.5]  # soft punishment from 12 to 16 tokens
    assert funcs[3](["abcd"]) == [0.5]
    assert cli.resolve_reward_funcs(None, 16, 4) == [math_reward]  # the paper's reward by default
    with pytest.raises(ValueError, match="Unknown reward function 'nope'"):
        cli.resolve_reward_funcs(["nope"], 16, 4)


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
