"""What users bring with them stays theirs, and what they name is taken as they mean it (issue 33 section 1): a Hub
model id at launch, a reward model on the command line, a local folder named like a Hub id in the model card, fp16
against the launcher's precision, and the environment variables and signal handlers of the process they run in.
Nothing is trained or launched; each test restores what it touches."""

import os
import signal

import pandas as pd
import pytest
import torch

from trl_rpg import cli
from trl_rpg.cli import launcher
from trl_rpg.run import checkpoint as ckpt

_BASE = ["train", "--output_dir", "o", "--use_cpu", "True", "--bf16", "False"]


@pytest.fixture
def launched(monkeypatch):
    """Every `accelerate launch` and in-process training the launcher starts (recorded, nothing runs)."""
    from accelerate.commands import launch

    seen = []
    monkeypatch.setattr(launch, "launch_command", seen.append)
    monkeypatch.setattr(launcher, "run_train", lambda argv, prog: seen.append(argv) or 0)
    return seen


@pytest.fixture
def environment():
    """`os.environ` as it was, put back after the test whatever the code under test left."""
    before = dict(os.environ)
    yield before
    os.environ.clear()
    os.environ.update(before)


# ----------------------------------------------------------------------------------------------------------------
# What the user names: a Hub id, a reward model, a local folder
# ----------------------------------------------------------------------------------------------------------------


def test_a_hub_model_id_is_launched_not_refused_as_a_missing_folder(launched, tmp_path, monkeypatch, capsys):
    """`org/name` is a Hub id (looked up by the training process), not a local path; a path that looks local
    (`./name`, more than one `/`) and does not exist is refused at launch."""
    monkeypatch.chdir(tmp_path)  # no folder named Qwen here
    assert cli.main(_BASE + ["--model_name_or_path", "Qwen/Qwen3-1.7B"]) == 0
    assert len(launched) == 1
    assert cli.main(_BASE + ["--model_name_or_path", "./Qwen/Qwen3-1.7B"]) == 2
    assert "no such folder" in capsys.readouterr().err.strip().splitlines()[-1]
    assert len(launched) == 1


def test_a_reward_model_on_the_command_line_is_handed_to_the_trainer(tmp_path):
    """`--reward_model_name_or_path` is a reward function of the run (TRL loads it), beside `--reward_funcs`."""
    from trl_rpg.cli.training import prepare_training

    data = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": ["1+1", "2+2"], "answer": ["2", "4"]}).to_parquet(data)
    *parsed, _, _ = cli.make_train_parser("x").parse_args_and_config(
        _BASE[1:] + ["--model_name_or_path", "Qwen/Qwen3-1.7B", "--dataset_name", str(data),
                     "--reward_model_name_or_path", "org/reward-model", "--reward_funcs", "math_reward"],
        return_remaining_strings=True, separate_remaining_strings=True)
    funcs = prepare_training(*parsed).reward_funcs
    assert funcs[0] == "org/reward-model" and [f.__name__ for f in funcs[1:]] == ["math_reward"]


def test_a_local_folder_named_like_a_hub_id_is_not_linked_to_the_hub(tmp_path, monkeypatch):
    """A model trained from `./qwen-sft` records `qwen-sft` as its name: the card names the local model, it does
    not link https://huggingface.co/qwen-sft (someone else's repository, or none)."""
    from trl_rpg.trainers.model_card import hub_repo_id

    monkeypatch.chdir(tmp_path)
    assert hub_repo_id("qwen-sft") == "qwen-sft"  # no such folder: a Hub id
    (tmp_path / "qwen-sft").mkdir()
    assert hub_repo_id("qwen-sft") is None


# ----------------------------------------------------------------------------------------------------------------
# The launcher: precision, environment, signal handlers
# ----------------------------------------------------------------------------------------------------------------


def test_fp16_from_the_launcher_with_float32_training_is_refused(launched, capsys):
    """`--mixed_precision fp16` while the training arguments ask for float32: transformers would train in fp16
    autocast anyway (as with bf16)."""
    assert cli.main(_BASE + ["--model_name_or_path", "m", "--num_processes", "2", "--mixed_precision", "fp16"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--mixed_precision fp16 trains in fp16" in last and "Pass --mixed_precision no" in last, last
    assert not launched


def test_an_in_process_run_leaves_the_environment_as_it_found_it(launched, environment, monkeypatch):
    """One process trains in the launcher's own process with the environment accelerate gives its child
    (`ACCELERATE_*`...); afterwards (a notebook, a script calling `cli.main` twice) the environment is the one before,
    a user's own value of those variables included."""
    seen = {}
    monkeypatch.setattr(launcher, "run_train", lambda argv, prog: seen.update(os.environ) or 0)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "users-own")
    before = dict(os.environ)
    assert cli.main(_BASE + ["--model_name_or_path", "m", "--num_processes", "1"]) == 0
    given = {name for name in seen if name.startswith("ACCELERATE_") and seen[name] != before.get(name)}
    assert len(given) >= 3, given  # the launcher's environment was in force while it trained
    assert dict(os.environ) == before


def test_torchruns_signal_handlers_are_taken_down_after_a_launch(monkeypatch):
    """torchrun's agent installs handlers that raise its `SignalException` and leaves them: after `trl-rpg train`
    returns (a script or notebook goes on), SIGTERM / SIGINT are handled as before the launch."""
    from accelerate.commands import launch

    names = [name for name in launcher._AGENT_SIGNALS if hasattr(signal, name)]
    before = {name: signal.getsignal(getattr(signal, name)) for name in names}

    def agent_handler(signum, frame):
        raise RuntimeError("torchrun's handler")

    def launch_command(args):
        for name in names:
            signal.signal(getattr(signal, name), agent_handler)

    monkeypatch.setattr(launch, "launch_command", launch_command)
    try:
        assert cli.run_accelerate_launch(object()) == 0
        assert {name: signal.getsignal(getattr(signal, name)) for name in names} == before
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)


# ----------------------------------------------------------------------------------------------------------------
# torch's weights-only settings around a DeepSpeed resume
# ----------------------------------------------------------------------------------------------------------------


def test_a_users_torch_load_settings_survive_a_deepspeed_resume(tmp_path, environment, monkeypatch):
    """While DeepSpeed loads a resumed checkpoint every `torch.load` is weights-only. A user's
    `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` (torch refuses it together with the forced weights-only setting) is lifted
    within and back after; a user's own `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1` stays set after."""
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"exp_avg": torch.ones(3)}, path)
    monkeypatch.setenv(ckpt.safe_loading.USER_NO_WEIGHTS_ONLY, "1")
    monkeypatch.delenv(ckpt.safe_loading.FORCE_WEIGHTS_ONLY, raising=False)
    with ckpt.deepspeed_loads_weights_only(str(tmp_path)):
        loaded = torch.load(path, weights_only=False)  # as DeepSpeed's loader calls it
    assert torch.equal(loaded["exp_avg"], torch.ones(3))
    assert os.environ.get(ckpt.safe_loading.USER_NO_WEIGHTS_ONLY) == "1"
    assert ckpt.safe_loading.FORCE_WEIGHTS_ONLY not in os.environ

    monkeypatch.delenv(ckpt.safe_loading.USER_NO_WEIGHTS_ONLY)
    monkeypatch.setenv(ckpt.safe_loading.FORCE_WEIGHTS_ONLY, "1")
    with ckpt.deepspeed_loads_weights_only(str(tmp_path)):
        torch.load(path, weights_only=False)
    assert os.environ.get(ckpt.safe_loading.FORCE_WEIGHTS_ONLY) == "1"
