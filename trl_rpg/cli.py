"""The `trl-rpg` command line: `trl-rpg train ...` (TRL's `trl grpo`, with RPG) and `trl-rpg demo`.

* `trl-rpg train [launcher options] [training arguments]` checks the arguments here, with TRL's `TrlParser` (script
  arguments, `RPGConfig`, `ModelConfig`, `DatasetMixtureConfig`; `--config recipe.yaml` works as in TRL), then starts
  `accelerate launch [launcher options] -m trl_rpg train [training arguments]`, as `trl grpo` launches TRL's GRPO
  script. Launcher options (`--num_processes 8`, `--config_file ...`, `--accelerate_config zero3`) are the options of
  `accelerate launch`; an argument that is neither is refused before anything is launched, with the closest valid
  name. The launcher exits with the training process's exit status, its error being the last thing printed.
* `python -m trl_rpg train ...` (and so `accelerate launch [...] -m trl_rpg train ...`) trains in the current process.
  Every check that needs no model (settings, data file, reward functions, the columns they read) runs before the
  model is loaded; a mistake ends the run with one `error:` line naming what to fix.
* `trl-rpg demo` trains a tiny bundled model on a toy arithmetic task on CPU (see `trl_rpg.toy.demo`).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path


class _WithoutDeepSpeedCpuNotice(logging.Filter):
    """Drops DeepSpeed's "Setting accelerator to CPU ..." line, printed on every CPU run when TRL imports DeepSpeed
    (torch sees no GPU, so the run is on CPU anyway; `--use_cpu True` says so)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Setting accelerator to CPU")


logging.getLogger("DeepSpeed").addFilter(_WithoutDeepSpeedCpuNotice())  # before TRL (and so DeepSpeed) is imported

from trl import ScriptArguments  # noqa: E402

from .rewards import REWARD_FUNCS, check_reward_columns, get_reward_func, register_reward  # noqa: E402

#: File extensions of local data files and the `datasets` builder that reads them.
DATA_FILE_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}

#: The reward function used when `--reward_funcs` is not given.
DEFAULT_REWARD_FUNCS = ("math_reward",)

#: Exit status of a run refused because of its arguments (argparse's).
USAGE_ERROR = 2

#: Environment variable through which `trl-rpg train` tells the processes it launches its command name.
_PROG_ENV = "TRL_RPG_PROG"
#: Environment variable through which `trl-rpg train` tells the processes it launches its own process id: each of them
#: ends when that process ends, by any signal (`stop_with_launcher`).
_LAUNCHER_PID_ENV = "TRL_RPG_LAUNCHER_PID"
#: Set by `trl-rpg train` beside `PYTHONSAFEPATH=1`, so that the training process takes the variable out again (the
#: processes it starts in turn, such as a reward function's scripts, get the ordinary `sys.path`).
_SAFE_PATH_ENV = "TRL_RPG_SET_SAFE_PATH"

#: `--resume_from_checkpoint` values that mean "the newest complete checkpoint of output_dir" (TRL's and
#: transformers' users' habits), and those that mean "do not resume".
RESUME_LATEST = ("true", "last", "latest")
RESUME_NEVER = ("false", "none", "")


@register_reward("toy_reward", columns=("answer",), help="the bundled toy arithmetic task (reads `answer`)")
def _build_toy_reward(**settings):
    """The toy task's reward, a name of the command line only: the training API does not depend on the toy."""
    from .toy import toy_reward  # lazy: the toy imports the trainer

    return toy_reward


def _reward_funcs_help() -> str:
    names = "; ".join(f"'{entry.name}' ({entry.help})" for entry in REWARD_FUNCS.values())
    return (f"Reward functions, by name: {names}; or any dotted import path such as 'my_lib.rewards.custom_reward'. "
            f"Default: {' '.join(DEFAULT_REWARD_FUNCS)}.")


@dataclass
class RPGScriptArguments(ScriptArguments):
    """Script arguments of `trl-rpg train` (TRL's `ScriptArguments` plus the reward settings).

    `dataset_name` may also be a local file (`.parquet`, `.json`, `.jsonl`, `.csv`, `.arrow`) or a directory of them;
    a single file becomes the `train` split.
    """

    reward_funcs: list[str] | None = field(default=None, metadata={"help": _reward_funcs_help()})
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A reward model (Hub id or local path), used in addition to `reward_funcs`."},
    )
    soft_punish_cache: int = field(
        default=4096,
        metadata={"help": "Length of the soft-punishment interval of 'soft_overlong_punishment' (DAPO uses 4096 with "
                          "max_completion_length=20480; the paper's 4K-context runs 1024 of 8192)."},
    )


# ----------------------------------------------------------------------------------------------------------------
# Data: the one loader of `trl-rpg train` and `examples/rpg_math.py`
# ----------------------------------------------------------------------------------------------------------------


def looks_like_data_file(name: str) -> bool:
    """Whether `name` names a local data file (it ends with one of `DATA_FILE_BUILDERS`' extensions)."""
    return Path(name).suffix.lower() in DATA_FILE_BUILDERS


def check_dataset_name(name: str | None) -> None:
    """Refuse at once a `--dataset_name` that names a local data file that does not exist (rather than asking the Hub
    for a data set called `nope.parquet`)."""
    if name and looks_like_data_file(name) and not Path(name).expanduser().exists():
        looked_for = Path(name).expanduser().absolute()
        raise FileNotFoundError(f"--dataset_name {name!r}: no such file (looked for {looked_for}"
                                "). Give the path of an existing .parquet/.json/.jsonl/.csv/.arrow file, a folder of "
                                "them, or a Hub data set id.")


def load_training_data(script_args, dataset_args=None):
    """The `DatasetDict` to train on: a dataset mixture (`--datasets`), a local file or folder, or a Hub data set.

    A local file becomes the `script_args.dataset_train_split` split. Used by `trl-rpg train` and by
    `examples/rpg_math.py` alike.
    """
    from datasets import DatasetDict, load_dataset

    if dataset_args is not None and dataset_args.datasets:
        from trl import get_dataset

        return get_dataset(dataset_args)
    name = script_args.dataset_name
    if not name:
        raise ValueError("No training data: pass --dataset_name (a Hub data set, a local .parquet/.json/.jsonl/.csv "
                         "file or a folder of them) or --datasets.")
    check_dataset_name(name)
    path = Path(name).expanduser()
    if path.is_file():
        builder = DATA_FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"--dataset_name={name!r}: unsupported file type {path.suffix!r}; use one of "
                             f"{sorted(DATA_FILE_BUILDERS)}.")
        dataset = load_dataset(builder, data_files={script_args.dataset_train_split: str(path)})
    else:
        dataset = load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
    if not isinstance(dataset, DatasetDict) and not hasattr(dataset, "keys"):
        dataset = DatasetDict({script_args.dataset_train_split: dataset})
    return dataset


# ----------------------------------------------------------------------------------------------------------------
# Reward functions
# ----------------------------------------------------------------------------------------------------------------


def _is_import_path(name: str) -> bool:
    return "." in name


def check_reward_names(names) -> None:
    """Refuse reward-function names that are neither registered (`trl_rpg.rewards.REWARD_FUNCS`) nor dotted import
    paths to a reward function (`check_reward_callable`), before anything is launched. A dotted path is imported
    here (the training process imports it again)."""
    for name in names or DEFAULT_REWARD_FUNCS:
        if _is_import_path(name):
            _import_reward_func(name)
        elif name not in REWARD_FUNCS:
            get_reward_func(name)  # raises the ValueError naming the registered functions and the closest one


#: Keyword arguments TRL passes to every reward function (besides the data set's columns).
REWARD_KEYWORDS = ("prompts", "completions", "completion_ids")


def check_reward_callable(path: str, func) -> None:
    """Refuse what `--reward_funcs path` resolved to unless it is a function TRL can call as a reward function:
    `func(prompts=..., completions=..., completion_ids=..., **columns)`, so it must take keyword arguments and accept
    any (`**kwargs`), as TRL's reward functions do. `os.system`, `builtins.eval` or a class are refused."""
    def refuse(why: str):
        raise ValueError(f"--reward_funcs {path!r}: {why}. A reward function takes keyword arguments "
                         "`prompts`, `completions`, `completion_ids` and the data set's columns, and returns one "
                         "float (or None) per completion: `def my_reward(completions, **kwargs)`.")

    if inspect.isclass(func) or not callable(func):
        refuse(f"is {'a class' if inspect.isclass(func) else f'not callable (a {type(func).__name__})'}")
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        refuse("is a callable whose arguments cannot be inspected (a built-in), not a reward function")
    parameters = list(signature.parameters.values())
    positional_only = [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        refuse(f"takes positional-only arguments ({', '.join(positional_only)}), not a reward function's keywords")
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        refuse(f"does not accept **kwargs (its arguments: {signature})")


def _import_reward_func(path: str):
    """Import `module.function`; the working directory is searched after the installed packages (appended to
    `sys.path`, never first: a file such as `peft.py` there must not replace a dependency)."""
    module_path, func_name = path.rsplit(".", 1)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        func = getattr(importlib.import_module(module_path), func_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--reward_funcs {path!r}: cannot import {func_name!r} from {module_path!r} ({error}).") \
            from error
    check_reward_callable(path, func)
    return func


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


def resume_argument(value):
    """`--resume_from_checkpoint` as `Trainer.train` takes it: `True` for `True`/`last`/`latest` (the newest
    complete checkpoint of `output_dir`), `None` for `False`/`None`/empty, otherwise the path given."""
    if value is None or isinstance(value, bool):
        return value or None
    text = str(value).strip()
    if text.lower() in RESUME_LATEST:
        return True
    if text.lower() in RESUME_NEVER:
        return None
    return text


def check_resume_path(value) -> None:
    """Refuse at once a `--resume_from_checkpoint` path that does not exist."""
    resume = resume_argument(value)
    if isinstance(resume, str) and not Path(resume).expanduser().is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {value!r}: no such folder. Give a checkpoint folder "
                                f"(output_dir/checkpoint-N), or {'/'.join(RESUME_LATEST[:2])} for the newest complete "
                                "checkpoint of --output_dir.")


def existing_checkpoints(output_dir: str | None) -> list[str]:
    """The `checkpoint-N` folders already in `output_dir`, in step order."""
    path = Path(output_dir or "")
    if not output_dir or not path.is_dir():
        return []
    found = [p for p in path.iterdir() if p.is_dir() and p.name.startswith("checkpoint-")
             and p.name.removeprefix("checkpoint-").isdigit()]
    return [p.name for p in sorted(found, key=lambda p: int(p.name.removeprefix("checkpoint-")))]


def warn_if_output_dir_holds_checkpoints(prog: str, training_args) -> None:
    """A new run (not resuming) in an `output_dir` that holds checkpoints: say so, naming them (first process only):
    a later `--resume_from_checkpoint True` resumes the newest checkpoint there, whichever run wrote it."""
    if resume_argument(training_args.resume_from_checkpoint) is not None or not _is_first_process():
        return
    names = existing_checkpoints(training_args.output_dir)
    if names:
        shown = ", ".join(names if len(names) <= 6 else names[:2] + ["..."] + names[-3:])
        sys.stdout.flush()
        print(f"{prog}: warning: --output_dir {training_args.output_dir!r} already holds {len(names)} checkpoint(s) "
              f"({shown}) that this run does not resume; its own checkpoints go beside them, and a later "
              "--resume_from_checkpoint True resumes the newest there. Pass --resume_from_checkpoint True to continue "
              "that run, or choose another --output_dir.", file=sys.stderr, flush=True)


def _is_first_process() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0"


def resolve_reward_funcs(names, max_completion_length: int, soft_punish_cache: int) -> list:
    """Turn `--reward_funcs` names (`trl_rpg.rewards.REWARD_FUNCS`) and dotted import paths into reward callables."""
    return [_import_reward_func(name) if _is_import_path(name) else
            get_reward_func(name, max_completion_length=max_completion_length, soft_punish_cache=soft_punish_cache)
            for name in names or DEFAULT_REWARD_FUNCS]


# ----------------------------------------------------------------------------------------------------------------
# Training in this process (`python -m trl_rpg train`)
# ----------------------------------------------------------------------------------------------------------------

_TRAIN_USAGE = "{prog} [launcher options] [training arguments]"


def make_train_parser(prog: str = "trl-rpg train"):
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    from .config import RPGConfig

    usage = _TRAIN_USAGE.format(prog=prog) if prog.startswith("trl-rpg") else f"{prog} [training arguments]"
    parser = TrlParser((RPGScriptArguments, RPGConfig, ModelConfig, DatasetMixtureConfig), prog=prog, usage=usage)
    for flag, help_text in _RPG_HELP.items():  # GRPOConfig fields whose TRL help is not true under RPG
        parser._option_string_actions[flag].help = help_text
    return parser


#: Help texts of `GRPOConfig` fields that RPG resolves, ignores or refuses (TRL's own text says otherwise).
_RPG_HELP = {
    "--steps_per_generation": "Optimizer micro-steps per generation batch. If `None` (and neither "
                              "`generation_batch_size` nor `num_iterations > 1` is set), RPG sets it to "
                              "`rpg_generation_reuse * gradient_accumulation_steps` (4x by default: each generation "
                              "batch is reused for 4 optimizer steps); GRPO's default is "
                              "`gradient_accumulation_steps`.",
    "--use_bias_correction_kl": "Ignored by RPG: GRPO's weighting of its k3 KL penalty by the importance ratio; RPG's "
                                "KL term (rpg_divergence, beta) is exact off-policy by construction.",
    "--sync_ref_model": "Refused by RPG (TRL's reference-model sync): use --rpg_reference periodic with "
                        "--rpg_reference_update_steps.",
    "--delta": "Refused by RPG (GRPO's two-sided clipping): RPG bounds large ratios with --rpg_dual_clip_c.",
    "--resume_from_checkpoint": "A checkpoint folder to resume from, or True (also 'last'/'latest') for the newest "
                                "complete checkpoint of --output_dir.",
}


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
    check_resume_path(training_args.resume_from_checkpoint)
    eval_dataset = None
    if training_args.eval_strategy != "no":
        eval_dataset = dataset.get(script_args.dataset_test_split)
    return TrainingSetup(reward_funcs=reward_funcs, train_dataset=train_dataset, eval_dataset=eval_dataset)


def train(script_args, training_args, model_args, dataset_args=None, setup: TrainingSetup | None = None):
    """Train with `RPGTrainer` as TRL's `grpo.py` trains with `GRPOTrainer`; returns the trainer."""
    from trl import get_peft_config, get_quantization_config

    from .trainer import RPGTrainer

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
    )
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
    return trainer


def run_train(argv: list[str], prog: str = "python -m trl_rpg train") -> int:
    """`python -m trl_rpg train`: train in this process (what each process of `accelerate launch` runs)."""
    parser = make_train_parser(prog=prog)
    try:
        *parsed, remaining = parser.parse_args_and_config(list(argv), return_remaining_strings=True)
        if remaining:
            raise ValueError(_unknown_arguments_message(remaining, _parser_flags(parser), launcher_flags=None))
        setup = prepare_training(*parsed)
    except (ValueError, FileNotFoundError) as error:
        return report_usage_error(prog, error)
    warn_if_output_dir_holds_checkpoints(prog, parsed[1])
    train(*parsed, setup=setup)
    return 0


#: What to do about upstream errors whose message does not say it in command-line terms: (fragment, advice).
_ADVICE = (
    ("doesn't support bf16/gpu",
     "On a machine without GPU pass --use_cpu True --bf16 False (RPGConfig keeps TRL's default bf16=True)."),
)


def report_usage_error(prog: str, error: BaseException) -> int:
    """Print `prog: error: message` as the last line (on the first process only: every process fails alike) and
    return the usage-error exit status."""
    message = str(error)
    message += "".join(f" {advice}" for fragment, advice in _ADVICE if fragment in message)
    if os.environ.get("LOCAL_RANK", "0") == "0":
        sys.stdout.flush()
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return USAGE_ERROR


# ----------------------------------------------------------------------------------------------------------------
# Launching through accelerate (as `trl grpo` does)
# ----------------------------------------------------------------------------------------------------------------

_CONFIG_HELP = """\
training arguments from a file:
  --config PATH         A YAML file of training arguments (TRL's `--config`): its keys are the flags below without
                        `--`; flags given on the command line win. Launcher options may be in it too.
"""

_LAUNCHER_HELP = """\
usage: {usage}

Train with RPGTrainer: checks the arguments, then runs `accelerate launch [launcher options] -m trl_rpg train
[training arguments]` (`python -m trl_rpg train` trains in the current process instead).

launcher options (given to `accelerate launch`):
  --accelerate_config NAME_OR_PATH
{configs}
  --num_processes N     Processes to launch, one per GPU (default: every GPU of this machine; 1 without GPU).
  --config_file PATH    An accelerate config file (as `accelerate launch --config_file`).
  --mixed_precision {{no,fp16,bf16,fp8}}
                        Passed to accelerate; the training's own precision is --bf16 / --fp16.
  --num_machines N, --machine_rank N, --main_process_ip IP, --main_process_port PORT
                        Multi-node runs.
  Any other `accelerate launch` option: `accelerate launch --help` lists them.

{config_help}
training arguments (`RPGConfig`, `ModelConfig`, data set and reward settings), the RPG ones first:"""


def _parser_flags(parser) -> list[str]:
    return sorted(flag for flag in parser._option_string_actions if flag.startswith("--"))


def _launcher_flags() -> list[str]:
    from accelerate.commands.launch import launch_command_parser

    return sorted({*_parser_flags(launch_command_parser()), "--accelerate_config"})


def _unknown_arguments_message(unknown: list[str], training_flags: list[str], launcher_flags: list[str] | None) -> str:
    """`unknown argument --rpg_divergnce (did you mean --rpg_divergence?)`, for each unknown flag in `unknown`."""
    flags = [item.split("=", 1)[0] for item in unknown if item.startswith("-") and not _is_number(item)]
    known = training_flags + (launcher_flags or [])
    parts = []
    for flag in flags or unknown[:1]:
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        parts.append(f"{flag} (did you mean {close[0]}?)" if close else flag)
    where = ("a training argument (`trl-rpg train --help`) nor an `accelerate launch` option" if launcher_flags
             else "a training argument (launcher options such as --num_processes belong to `trl-rpg train` or "
                  "`accelerate launch`)")
    noun = "argument" if len(parts) == 1 else "arguments"
    return f"unknown {noun} {', '.join(parts)}: neither {where}."


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_launcher_arguments(launch_args: list[str], training_flags: list[str]) -> None:
    """Refuse arguments that are neither training arguments nor `accelerate launch` options, before launching."""
    launcher_flags = set(_launcher_flags())
    unknown = [item for item in launch_args
               if item.startswith("-") and not _is_number(item) and item.split("=", 1)[0] not in launcher_flags]
    if unknown:
        raise ValueError(_unknown_arguments_message(unknown, training_flags, sorted(launcher_flags)))


def parse_launch_arguments(launch_args: list[str], training_argv: list[str]):
    """`accelerate launch`'s arguments for `launch_args -m trl_rpg train training_argv`; a bad launcher value or a
    stray word raises `ValueError` (instead of accelerate's usage text)."""
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    parser.exit_on_error = False
    try:
        args = parser.parse_args(launch_args + ["-m", "trl_rpg", "train", *training_argv])
    except argparse.ArgumentError as error:
        raise ValueError(f"launcher option {error}.") from error
    if args.training_script != "trl_rpg":
        raise ValueError(f"unexpected argument {args.training_script!r}: every argument of `trl-rpg train` is a "
                         "`--flag value` pair (`trl-rpg train --help` lists them).")
    return args


def _accelerate_config_dirs() -> list[Path]:
    import trl

    return [Path.cwd() / "accelerate_configs", Path(__file__).resolve().parent / "accelerate_configs",
            Path(trl.__file__).resolve().parent / "accelerate_configs"]


def available_accelerate_configs() -> list[str]:
    """Names `--accelerate_config` accepts: the configs of `accelerate_configs/` (in the working directory and those
    shipped in this package, `trl_rpg/accelerate_configs`) and those shipped with TRL."""
    return sorted({p.stem for d in _accelerate_config_dirs() if d.is_dir() for p in d.glob("*.yaml")})


def resolve_accelerate_config(launch_args: list[str]) -> list[str]:
    """`--accelerate_config NAME_OR_PATH` -> `--config_file PATH`: a file, a config of this package's
    `accelerate_configs/` (e.g. `deepspeed_zero3`), or one shipped with TRL (e.g. `zero3`)."""
    if "--accelerate_config" not in launch_args:
        return launch_args
    i = launch_args.index("--accelerate_config")
    if i + 1 >= len(launch_args):
        names = available_accelerate_configs()
        raise ValueError(f"Expected a value after --accelerate_config: a file or one of {names}.")
    name = launch_args[i + 1]
    candidates = [Path(name)] + [d / f"{name}.yaml" for d in _accelerate_config_dirs()]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        names = available_accelerate_configs()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"--accelerate_config {name!r} is neither a file nor a known config name; the names are "
                         f"{names}.{hint}")
    return ["--config_file", str(path)] + launch_args[:i] + launch_args[i + 2:]


def _local_device_count() -> int:
    """The number of accelerators `accelerate launch` would use by default (its own order of device types)."""
    import accelerate.utils as accelerate_utils
    import torch

    for kind in ("xpu", "mlu", "sdaa", "musa", "npu", "hpu", "neuron"):
        is_available = getattr(accelerate_utils, f"is_{kind}_available", None)
        if is_available is not None and is_available():
            return getattr(torch, kind).device_count()
    return torch.cuda.device_count()


def complete_launch_defaults(args) -> None:
    """Without an accelerate config file, give `accelerate launch` the values it would pick itself (one process per
    device, at least one; one machine; no extra mixed precision; no dynamo), so it does not print a notice for each.

    Several processes without an accelerate config run under accelerate's multi-process (torchrun) launcher, on GPUs
    as accelerate does itself and also on a machine without GPU (`--num_processes 2 --use_cpu True`: DDP over gloo),
    where `accelerate launch` alone would start one process and train on it alone."""
    from accelerate.commands.config import default_config_file

    if args.config_file is not None or os.path.isfile(default_config_file):
        return
    devices = _local_device_count()
    if args.num_processes is None:
        args.num_processes = max(devices, 1)
    if args.num_processes > 1 and not _launches_distributed(args) and devices != 1:
        args.multi_gpu = True  # what accelerate does for several devices (with a notice); on CPU, DDP over gloo
    for name, value in (("num_machines", 1), ("mixed_precision", "no"), ("dynamo_backend", "no")):
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def _launches_distributed(args) -> bool:
    return any(getattr(args, flag, False) for flag in ("multi_gpu", "use_deepspeed", "use_fsdp", "tpu", "cpu"))


def check_process_count(args) -> None:
    """Refuse a launch that would silently run fewer processes than asked: `--num_processes N > 1` with an accelerate
    config whose `distributed_type` is `NO` (accelerate then starts one process), or with one GPU only."""
    from accelerate.commands.config import default_config_file
    from accelerate.commands.config.config_args import load_config_from_file

    if args.num_processes is None or args.num_processes <= 1 or _launches_distributed(args):
        return
    config_file = args.config_file or (default_config_file if os.path.isfile(default_config_file) else None)
    if config_file is None:
        if _local_device_count() == 1:
            raise ValueError(f"--num_processes {args.num_processes} on a machine with one GPU: accelerate would start "
                             "one process. Use --num_processes 1, or --multi_gpu with --gpu_ids and devices to match.")
        return
    try:
        distributed_type = str(load_config_from_file(config_file).distributed_type.value)
    except Exception:  # an unreadable config: accelerate says why when it reads it
        return
    if distributed_type == "NO":
        raise ValueError(f"--num_processes {args.num_processes} with the accelerate config {config_file} "
                         "(distributed_type: NO) would start one process, not "
                         f"{args.num_processes}. Use --accelerate_config multi_gpu (data parallel; on a machine "
                         "without GPU add --use_cpu True), a DeepSpeed/FSDP config, or --multi_gpu.")


def _exit_status(code: int | None) -> int:
    """A child's exit status as a shell reports it: its own code, 128 + N for a death by signal N, never 0."""
    if code is None or code == 0:
        return 1
    return 128 - code if code < 0 else code


def run_accelerate_launch(args) -> int:
    """Run `accelerate launch` with parsed `args`; return the training processes' exit status (0, or the status of
    the first one that failed) without a traceback of the launcher's own: the child's error stays the last thing
    printed."""
    from accelerate.commands.launch import launch_command

    try:
        launch_command(args)
    except subprocess.CalledProcessError as error:
        return _exit_status(error.returncode)
    except KeyboardInterrupt:  # Ctrl-C: the training processes got it too and stop
        return 128 + signal.SIGINT
    except Exception as error:  # torchrun's ChildFailedError (several processes)
        failures = getattr(error, "failures", None)
        if not failures:
            raise
        first = min(failures.values(), key=lambda failure: failure.timestamp)
        return _exit_status(first.exitcode)
    return 0


def stop_with_launcher() -> None:
    """In a process started by `trl-rpg train`: end when the launcher ends, by any signal, `kill -9` included (an
    orphaned training process would go on writing checkpoints and holding GPUs). On Linux the kernel sends SIGTERM
    when the launcher dies (`prctl(PR_SET_PDEATHSIG)`); elsewhere a daemon thread checks the parent every second."""
    launcher = os.environ.pop(_LAUNCHER_PID_ENV, None)  # not for the processes this one starts
    if not launcher or not launcher.isdigit():
        return
    launcher_pid = int(launcher)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) == 0:
            if os.getppid() != launcher_pid:  # the launcher died before the call
                os.kill(os.getpid(), signal.SIGTERM)
            return

    def watch():
        while True:
            if os.getppid() != launcher_pid:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            threading.Event().wait(1.0)

    threading.Thread(target=watch, name="trl-rpg-launcher-watch", daemon=True).start()


def _take_safe_path_setting() -> None:
    """`trl-rpg train` starts this process with `PYTHONSAFEPATH=1` (the working directory is not put first on
    `sys.path`); the processes this one starts get the ordinary setting back."""
    if os.environ.pop(_SAFE_PATH_ENV, None):
        os.environ.pop("PYTHONSAFEPATH", None)


def train_help_sections(parser) -> list[tuple[str, list]]:
    """The training arguments of `trl-rpg train --help`, grouped: RPG's own fields (and the GRPO defaults RPG changes),
    then reward and data settings, the model, and every other training argument (GRPOConfig, TrainingArguments)."""
    from dataclasses import fields

    from trl import DatasetMixtureConfig, ModelConfig

    from .config import RPGConfig

    rpg = set(vars(RPGConfig).get("__annotations__", {}))
    script = {f.name for f in fields(RPGScriptArguments)} | {f.name for f in fields(DatasetMixtureConfig)}
    model = {f.name for f in fields(ModelConfig)}
    sections = {"RPG (RPGConfig's own fields, and the GRPOConfig defaults it changes)": [],
                "reward functions and data": [], "model (TRL's ModelConfig)": [],
                "every other training argument (TRL's GRPOConfig, transformers' TrainingArguments)": []}
    groups = list(sections.values())
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        dest = action.dest
        groups[0 if dest in rpg else 1 if dest in script else 2 if dest in model else 3].append(action)
    return list(sections.items())


def print_train_help(prog: str = "trl-rpg train", launcher: bool = True) -> None:
    """`trl-rpg train --help`: the launcher options and `--config` first, then the RPG fields, the reward and data
    settings, the model, and every other training argument (`launcher=False`, for `python -m trl_rpg train`: no
    launcher options)."""
    parser = make_train_parser(prog)
    if launcher:
        configs = textwrap.fill("An accelerate config file, or the name of one: "
                                f"{', '.join(available_accelerate_configs())}.", width=116,
                                initial_indent=" " * 24, subsequent_indent=" " * 24)
        print(_LAUNCHER_HELP.format(usage=_TRAIN_USAGE.format(prog=prog), configs=configs,
                                    config_help=_CONFIG_HELP))
    else:
        print(f"usage: {prog} [training arguments]\n\nTrain with RPGTrainer in this process.\n\n"
              f"{_CONFIG_HELP}\ntraining arguments, the RPG ones first:")
    formatter = parser._get_formatter()
    for title, actions in train_help_sections(parser):
        formatter.start_section(title)
        formatter.add_arguments(actions)
        formatter.end_section()
    print(formatter.format_help())


def launch_train(argv: list[str], prog: str = "trl-rpg train") -> int:
    """`trl-rpg train`: check the arguments here (and answer `--help`), then run `accelerate launch ... -m trl_rpg
    train ...`; returns the exit status of the training processes."""
    argv = list(argv)
    if "-h" in argv or "--help" in argv:
        print_train_help(prog)
        return 0
    parser = make_train_parser(prog)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the training process shows them
        try:
            script_args, parsed_args, model_args, dataset_args, config_remaining, cli_remaining = (
                parser.parse_args_and_config(
                    argv, return_remaining_strings=True, separate_remaining_strings=True))
            check_launcher_arguments(config_remaining + cli_remaining, _parser_flags(parser))
            launch_args = resolve_accelerate_config(config_remaining + cli_remaining)
            accelerate_args = parse_launch_arguments(launch_args, _subtract_subsequence(argv, cli_remaining))
            check_process_count(accelerate_args)
            check_model_name(model_args.model_name_or_path)
            check_resume_path(parsed_args.resume_from_checkpoint)
            check_reward_names(script_args.reward_funcs)
            if not dataset_args.datasets:
                check_dataset_name(script_args.dataset_name)
                check_local_data_columns(script_args, parsed_args.max_completion_length)
        except (ValueError, FileNotFoundError) as error:
            return report_usage_error(prog, error)
    complete_launch_defaults(accelerate_args)
    child_env = {_PROG_ENV: prog,  # the training processes report errors under the command the user typed
                 _LAUNCHER_PID_ENV: str(os.getpid()),  # and end with this process (`stop_with_launcher`)
                 "PYTHONSAFEPATH": "1"}  # `python -m trl_rpg` must not import the working directory's peft.py
    if os.environ.get("PYTHONSAFEPATH") is None:
        child_env[_SAFE_PATH_ENV] = "1"
    previous = {name: os.environ.get(name) for name in child_env}
    os.environ.update(child_env)
    try:
        return run_accelerate_launch(accelerate_args)
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _subtract_subsequence(items: list[str], subsequence: list[str]) -> list[str]:
    """`items` without the ordered `subsequence` (the arguments the training parser did not consume)."""
    rest, it = [], iter(subsequence)
    current = next(it, None)
    for item in items:
        if current is not None and item == current:
            current = next(it, None)
        else:
            rest.append(item)
    return rest


# ----------------------------------------------------------------------------------------------------------------
# Upstream warnings
# ----------------------------------------------------------------------------------------------------------------


_TRL_INTERNAL_DEPRECATIONS = (r"`(is_gradient_checkpointing|gradient_checkpointing_enable|"
                              r"gradient_checkpointing_disable)`")


def show_upstream_warnings_once() -> None:
    """Show each upstream deprecation warning (`FutureWarning`) once per run instead of every time a library resets
    the warning registry (transformers' `gradient_checkpointing ... deprecated` came about seven times), and only on
    the first process of a multi-process launch."""
    if os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("RANK", "0") != "0":
        warnings.filterwarnings("ignore", category=FutureWarning)
        return
    warnings.filterwarnings("once", category=FutureWarning)
    # TRL's own calls of transformers' renamed model methods: the same deprecation again, nothing a user can change
    warnings.filterwarnings("ignore", message=_TRL_INTERNAL_DEPRECATIONS, category=FutureWarning)


# ----------------------------------------------------------------------------------------------------------------
# Demo
# ----------------------------------------------------------------------------------------------------------------


def make_demo_parser(prog: str = "trl-rpg demo") -> argparse.ArgumentParser:
    from .objectives import DIVERGENCES, ESTIMATORS
    from .toy.demo import DEMO_EVAL_EVERY, DEMO_MAX_STEPS

    parser = argparse.ArgumentParser(
        prog=prog, description="Train a tiny model built on the spot (no download) on a toy arithmetic-reasoning task "
                               "with RPG, on CPU, and print held-out accuracy before and after.")
    parser.add_argument("--output_dir", default="rpg-demo", help="Where the trained model, curves.png and "
                                                                 "metrics.json go (default: rpg-demo).")
    parser.add_argument("--seed", type=int, default=0, help="Random seed (default: 0).")
    parser.add_argument("--max_steps", type=int, default=DEMO_MAX_STEPS,
                        help=f"RL optimizer steps (default: {DEMO_MAX_STEPS}).")
    parser.add_argument("--eval_every", type=int, default=DEMO_EVAL_EVERY,
                        help=f"Held-out evaluation every N steps (default: {DEMO_EVAL_EVERY}; 0: before and after "
                             "only).")
    parser.add_argument("--num_threads", type=int, default=1,
                        help="torch CPU threads (default: 1, the fastest for a model this small).")
    parser.add_argument("--rpg_divergence", default=None, choices=list(DIVERGENCES),
                        help="Divergence (default: RPGConfig's 'urkl').")
    parser.add_argument("--rpg_estimator", default=None, choices=list(ESTIMATORS),
                        help="Gradient estimator (default: RPGConfig's 'reinforce').")
    return parser


def run_demo_command(argv: list[str]) -> int:
    from .toy.demo import run_demo

    args = make_demo_parser().parse_args(argv)
    overrides = {k: getattr(args, k) for k in ("rpg_divergence", "rpg_estimator") if getattr(args, k) is not None}
    result = run_demo(output_dir=args.output_dir, seed=args.seed, max_steps=args.max_steps,
                      eval_every=args.eval_every, num_threads=args.num_threads, rl_overrides=overrides)
    return 0 if result["accuracy_after"] >= result["accuracy_before"] else 1


# ----------------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------------

_USAGE = """\
usage: {prog} {{train,demo}} ...

RPG (Regularized Policy Gradient, arXiv:2505.17508) for TRL.

commands:
  train    Train with RPGTrainer: the arguments of `trl grpo` (RPGConfig, ModelConfig, data set, reward functions),
           launched with `accelerate launch` (launcher options such as --num_processes, --accelerate_config or
           --config_file go to it). `{prog} train --help` lists the launcher options, then every training field,
           the RPG ones (rpg_*) included.
  demo     Train a tiny model on a toy arithmetic task on CPU in about 1-2 minutes (no download); prints held-out
           accuracy before and after and writes the model and a plot of reward and accuracy.

examples:
  {prog} demo
  {prog} train --model_name_or_path Qwen/Qwen3-1.7B --dataset_name data.parquet --reward_funcs math_reward \\
      --output_dir qwen-rpg --rpg_divergence urkl --rpg_estimator reinforce
  {prog} train --config recipe.yaml --accelerate_config accelerate_configs/deepspeed_zero3.yaml
  {prog} train --model_name_or_path ./my-model --dataset_name train.parquet --output_dir out \\
      --use_cpu True --bf16 False    # on a machine without GPU (RPGConfig keeps TRL's bf16=True default)
"""


def main(argv: list[str] | None = None, *, launch: bool = True, prog: str = "trl-rpg") -> int:
    """Console entry point `trl-rpg`. With `launch=False` (`python -m trl_rpg`), `train` runs in this process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE.format(prog=prog))
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        if launch:
            return launch_train(rest, prog=f"{prog} train")
        _take_safe_path_setting()
        stop_with_launcher()
        if "-h" in rest or "--help" in rest:
            print_train_help(f"{prog} train", launcher=False)
            return 0
        show_upstream_warnings_once()
        return run_train(rest, prog=os.environ.get(_PROG_ENV, f"{prog} train"))
    if command == "demo":
        show_upstream_warnings_once()
        return run_demo_command(rest)
    if command in ("--version", "version"):
        from . import __version__

        print(f"trl-rpg {__version__}")
        return 0
    print(_USAGE.format(prog=prog), file=sys.stderr)
    print(f"{prog}: error: unknown command {command!r} (choose 'train' or 'demo')", file=sys.stderr)
    return USAGE_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
