"""Training in this process (`python -m trl_rpg train`, what each process of `accelerate launch` runs): everything
checked and loaded before the model, then `RPGTrainer` trained, saved and carded as TRL's `grpo.py` does with
`GRPOTrainer`."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..run.checkpoint.lock import OutputDirBusy
from ..trainers.validation import check_output_dir_free
from .arguments import (
    _parser_flags,
    _unknown_arguments_message,
    check_recipe_keys,
    check_recipe_values,
    make_train_parser,
    recipe_path,
    record_error_for_launcher,
    report_usage_error,
    resume_argument,
)
from .checks import check_model_name, check_resume_path, check_training_columns
from .data import load_training_data
from .reward_funcs import resolve_reward_funcs


@dataclass
class TrainingSetup:
    """Everything `train` needs besides the model, checked before the model is loaded."""

    reward_funcs: list
    train_dataset: object
    eval_dataset: object | None


def prepare_training(script_args, training_args, model_args, dataset_args=None) -> TrainingSetup:
    """Resolve the reward functions and load the data, and check them against each other, before any model loads.

    Raises `ValueError` / `FileNotFoundError` naming what to fix: no model, a missing data file or split, an unknown
    reward function, or a data set without the columns the reward functions read.
    """
    if not model_args.model_name_or_path:
        raise ValueError("trl-rpg train needs --model_name_or_path (a Hub id or a local model folder).")
    check_resume_path(training_args.resume_from_checkpoint, training_args.output_dir)
    check_output_dir_free(training_args.output_dir)  # another run's folder: refused before the data load
    reward_funcs = []
    if script_args.reward_model_name_or_path:
        reward_funcs.append(script_args.reward_model_name_or_path)
    reward_funcs += resolve_reward_funcs(script_args.reward_funcs, training_args.max_completion_length,
                                         script_args.soft_punish_cache)
    dataset = load_training_data(script_args, dataset_args)
    if script_args.dataset_train_split not in dataset:
        raise ValueError(f"The data set has no split {script_args.dataset_train_split!r} (it has {list(dataset)}); "
                         "set --dataset_train_split.")
    train_dataset = dataset[script_args.dataset_train_split]
    check_training_columns(reward_funcs, getattr(train_dataset, "column_names", None))
    check_model_name(model_args.model_name_or_path)
    eval_dataset = None
    if training_args.eval_strategy != "no":
        eval_dataset = dataset.get(script_args.dataset_test_split)
    return TrainingSetup(reward_funcs=reward_funcs, train_dataset=train_dataset, eval_dataset=eval_dataset)


def train(script_args, training_args, model_args, dataset_args=None, setup: TrainingSetup | None = None):
    """Train with `RPGTrainer` as TRL's `grpo.py` trains with `GRPOTrainer`, ending with `trainer.end()` (finish the
    trackers, destroy the process group) however the run ends; returns the trainer."""
    from trl import get_peft_config, get_quantization_config

    from ..evaluation.plot_callback import RPGPlotCallback
    from ..trainers.trainer import RPGTrainer

    setup = setup or prepare_training(script_args, training_args, model_args, dataset_args)
    model_init_kwargs = {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code,
                         "attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype}
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    trainer = RPGTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=setup.reward_funcs,
        args=training_args,
        train_dataset=setup.train_dataset,
        eval_dataset=setup.eval_dataset,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        callbacks=[RPGPlotCallback()],  # output_dir/rpg_curves.png at each save and at the end
    )
    try:
        trainer.train(resume_from_checkpoint=resume_argument(training_args.resume_from_checkpoint))
        trainer.accelerator.print("Training completed.")
        trainer.save_model(training_args.output_dir)
        if trainer.accelerator.is_main_process:
            trainer.create_model_card(model_name=Path(training_args.output_dir).name,
                                      dataset_name=script_args.dataset_name)
        trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=script_args.dataset_name)
            trainer.accelerator.print(f"Model pushed to https://huggingface.co/{trainer.hub_model_id}.")
    finally:
        close_progress_bars(trainer)
        trainer.end()  # as TRL's grpo.py
    return trainer


def close_progress_bars(trainer) -> None:
    """Close the trainer's progress bars: a run that raised leaves them open, and tqdm prints them once more when
    the process exits, after the error (`  0%|  | 0/2`)."""
    from transformers.trainer_callback import ProgressCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, ProgressCallback):
            for name in ("training_bar", "prediction_bar"):
                if getattr(callback, name, None) is not None:
                    getattr(callback, name).close()
                    setattr(callback, name, None)


def run_train(argv: list[str], prog: str = "python -m trl_rpg train") -> int:
    """`python -m trl_rpg train`: train in this process (what each process of `accelerate launch` runs). Returns the
    exit status: 0; 2 for a mistake in the arguments; 1 for an error raised while training (its traceback, then the
    error as the last line); 130 on Ctrl-C."""
    parser = make_train_parser(prog=prog)
    try:
        check_recipe_values(recipe_path(argv), parser)
        *parsed, config_remaining, cli_remaining = parser.parse_args_and_config(
            list(argv), return_remaining_strings=True, separate_remaining_strings=True)
        check_recipe_keys(config_remaining, _parser_flags(parser), recipe_path(argv))  # its launcher keys: used
        if cli_remaining:
            raise ValueError(_unknown_arguments_message(cli_remaining, _parser_flags(parser), launcher_flags=None))
        setup = prepare_training(*parsed)
    except (ValueError, FileNotFoundError, OutputDirBusy) as error:
        return report_usage_error(prog, error)
    try:
        train(*parsed, setup=setup)
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0":  # every process gets Ctrl-C: the line once, from the first
            sys.stdout.flush()
            print(f"{prog}: interrupted (Ctrl-C).", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except Exception as error:
        return report_training_error(prog, error)
    return 0


def report_training_error(prog: str, error: BaseException) -> int:
    """An error raised while training: its traceback, then `prog: error: Type: message` (on one line, on every
    process that raised it) as the last thing printed; returns exit status 1. A designed stop (`NoLearningSignal`,
    the verdict on a run that trained on nothing) prints its line only: no traceback points at a bug."""
    from ..run.learning_signal import NoLearningSignal

    sys.stdout.flush()
    if not isinstance(error, NoLearningSignal):
        traceback.print_exception(error)
    line = f"{prog}: error: {type(error).__name__}: {' '.join(str(error).split())}"
    print(line, file=sys.stderr, flush=True)
    record_error_for_launcher(line)
    return 1
