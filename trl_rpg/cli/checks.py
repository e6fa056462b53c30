"""The checks of what a run trains on, made before anything is launched or loaded (the model path, the checkpoint to
resume from, the columns the reward functions read), and the warning for a new run in an `output_dir` that holds
checkpoints. `trl-rpg train` makes them before launching; each training process makes them again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..rewards import check_reward_columns
from .arguments import RESUME_LATEST, resume_argument
from .data import load_training_data, looks_like_data_file
from .reward_funcs import DEFAULT_REWARD_FUNCS, _is_import_path, resolve_reward_funcs


def looks_like_local_path(name: str) -> bool:
    """Whether `name` is written as a local path rather than a Hub id (`org/name`): it starts with `.`, `/` or `~`,
    holds a backslash, or has more than one `/`."""
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1


def check_model_name(name: str | None) -> None:
    """Refuse at once a `--model_name_or_path` written as a local path (`./my-modle`) that does not exist, rather
    than asking the Hub for it after the data and the libraries load."""
    if name and looks_like_local_path(name) and not Path(name).expanduser().exists():
        raise FileNotFoundError(f"--model_name_or_path {name!r}: no such folder (looked for "
                                f"{Path(name).expanduser().absolute()}). Give an existing local model folder or a Hub "
                                "model id such as 'Qwen/Qwen3-1.7B'.")


def check_resume_path(value) -> None:
    """Refuse at once a `--resume_from_checkpoint` path that does not exist."""
    resume = resume_argument(value)
    if isinstance(resume, str) and not Path(resume).expanduser().is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {value!r}: no such folder. Give a checkpoint folder "
                                f"(output_dir/checkpoint-N), or {'/'.join(RESUME_LATEST[:2])} for the newest complete "
                                "checkpoint of --output_dir.")


def check_local_data_columns(script_args, max_completion_length: int) -> None:
    """For a local data file, check its columns against the registered reward functions before launching (the
    training process checks again, dotted-path reward functions included); a Hub data set is left to it."""
    path = Path(script_args.dataset_name or "").expanduser()
    if not (script_args.dataset_name and path.is_file() and looks_like_data_file(path.name)):
        return
    names = [name for name in script_args.reward_funcs or DEFAULT_REWARD_FUNCS if not _is_import_path(name)]
    funcs = resolve_reward_funcs(names, max_completion_length, script_args.soft_punish_cache) if names else []
    dataset = load_training_data(script_args)
    if script_args.dataset_train_split in dataset:
        check_training_columns(funcs, dataset[script_args.dataset_train_split].column_names)


def check_training_columns(reward_funcs, columns) -> None:
    """The training data needs a `prompt` column (as for TRL's GRPO) and the columns its reward functions read."""
    if columns is not None and "prompt" not in columns:
        raise ValueError(f"The data set has no 'prompt' column (its columns: {list(columns)}). trl-rpg train, like "
                         "`trl grpo`, trains on a 'prompt' column of strings or chat messages; for data with "
                         "'problem' (or 'question') and 'answer' columns use examples/rpg_math.py, which wraps each "
                         "problem in the paper's prompt, or add a 'prompt' column.")
    check_reward_columns(reward_funcs, columns)


def warn_if_output_dir_holds_checkpoints(prog: str, training_args) -> None:
    """A new run (not resuming) in an `output_dir` that holds checkpoints: say so, naming them (first process only):
    a later `--resume_from_checkpoint True` resumes the newest checkpoint there, whichever run wrote it."""
    from ..checkpoint import checkpoint_folders  # lazy: the checkpoint package imports TRL's model code

    if resume_argument(training_args.resume_from_checkpoint) is not None or not _is_first_process():
        return
    names = [os.path.basename(path) for path in reversed(checkpoint_folders(training_args.output_dir or ""))]
    if names:
        shown = ", ".join(names if len(names) <= 6 else names[:2] + ["..."] + names[-3:])
        sys.stdout.flush()
        print(f"{prog}: warning: --output_dir {training_args.output_dir!r} already holds {len(names)} checkpoint(s) "
              f"({shown}) that this run does not resume; its own checkpoints go beside them, and a later "
              "--resume_from_checkpoint True resumes the newest there. Pass --resume_from_checkpoint True to continue "
              "that run, or choose another --output_dir.", file=sys.stderr, flush=True)


def _is_first_process() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0"
