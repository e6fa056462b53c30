"""The checks of what a run trains on, made before anything is launched or loaded (the model path, the checkpoint to
resume from, the columns the reward functions read). `trl-rpg train` makes them before launching; each training
process makes them again. (A new run in an `output_dir` that holds checkpoints is warned about by the trainer:
`trl_rpg.run.checkpoint.runs`.)"""

from __future__ import annotations

import os
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


def check_resume_path(value, output_dir: str | None = None) -> None:
    """Refuse at once a `--resume_from_checkpoint` path that does not exist, and `True` (`last`, `latest`) when
    `output_dir` (if given) holds no complete checkpoint (one with a manifest; it is verified when the run resumes)."""
    resume = resume_argument(value)
    if isinstance(resume, str) and not Path(resume).expanduser().is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {value!r}: no such folder. Give a checkpoint folder "
                                f"(output_dir/checkpoint-N), or {'/'.join(RESUME_LATEST[:2])} for the newest complete "
                                "checkpoint of --output_dir.")
    if resume is not True or output_dir is None:
        return
    from ..run.checkpoint import (  # lazy: the checkpoint package imports TRL's model code
        checkpoint_folders,
        is_complete,
    )

    folders = checkpoint_folders(output_dir)
    if any(is_complete(folder) for folder in folders):
        return
    names = ", ".join(os.path.basename(folder) for folder in folders)
    found = (f"{names} {'is' if len(folders) == 1 else 'are'} incomplete: the save was interrupted" if folders
             else "it has no checkpoint-N folder" if os.path.isdir(output_dir) else "it does not exist")
    raise FileNotFoundError(f"--resume_from_checkpoint {value}: --output_dir {output_dir!r} holds no complete "
                            f"checkpoint ({found}). Start a new run without --resume_from_checkpoint, or give the "
                            "--output_dir of the run to continue.")


def check_local_data_columns(script_args, max_completion_length: int, batch_layout=None) -> None:
    """For a local data file, check its columns against the registered reward functions before launching (the
    training process checks again, dotted-path reward functions included), and, given the `batch_layout` the
    training processes will have (`validation.validate_dataset_size`'s fields), that it holds the prompts of one
    generation batch; a Hub data set is left to the training process."""
    path = Path(script_args.dataset_name or "").expanduser()
    if not (script_args.dataset_name and path.is_file() and looks_like_data_file(path.name)):
        return
    names = [name for name in script_args.reward_funcs or DEFAULT_REWARD_FUNCS if not _is_import_path(name)]
    funcs = resolve_reward_funcs(names, max_completion_length, script_args.soft_punish_cache) if names else []
    dataset = load_training_data(script_args)
    if script_args.dataset_train_split in dataset:
        check_training_columns(funcs, dataset[script_args.dataset_train_split].column_names)
        if batch_layout is not None:
            from ..trainers.validation import validate_dataset_size  # lazy: it imports TRL's trainer utilities

            validate_dataset_size(dataset[script_args.dataset_train_split], batch_layout)


def check_training_columns(reward_funcs, columns) -> None:
    """The training data needs a `prompt` column (as for TRL's GRPO) and the columns its reward functions read."""
    if columns is not None and "prompt" not in columns:
        raise ValueError(f"The data set has no 'prompt' column (its columns: {list(columns)}). trl-rpg train, like "
                         "`trl grpo`, trains on a 'prompt' column of strings or chat messages; for data with "
                         "'problem' (or 'question') and 'answer' columns use examples/rpg_math.py, which wraps each "
                         "problem in the paper's prompt, or add a 'prompt' column.")
    check_reward_columns(reward_funcs, columns)
