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
import os
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from trl import ScriptArguments

from .rewards import REWARD_FUNCS, check_reward_columns, get_reward_func, register_reward

#: File extensions of local data files and the `datasets` builder that reads them.
DATA_FILE_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}

#: The reward function used when `--reward_funcs` is not given.
DEFAULT_REWARD_FUNCS = ("math_reward",)

#: Exit status of a run refused because of its arguments (argparse's).
USAGE_ERROR = 2

#: Environment variable through which `trl-rpg train` tells the processes it launches its command name.
_PROG_ENV = "TRL_RPG_PROG"


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
    paths, without building or importing anything."""
    for name in names or DEFAULT_REWARD_FUNCS:
        if not _is_import_path(name) and name not in REWARD_FUNCS:
            get_reward_func(name)  # raises the ValueError naming the registered functions and the closest one


def _import_reward_func(path: str):
    module_path, func_name = path.rsplit(".", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_path), func_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--reward_funcs {path!r}: cannot import {func_name!r} from {module_path!r} ({error}).") \
            from error


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
        check_reward_columns(funcs, dataset[script_args.dataset_train_split].column_names)


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
    return TrlParser((RPGScriptArguments, RPGConfig, ModelConfig, DatasetMixtureConfig), prog=prog, usage=usage)


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
    check_reward_columns(reward_funcs, getattr(train_dataset, "column_names", None))
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
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
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

training arguments (`RPGConfig`, `ModelConfig`, data set and reward settings):
"""


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

    return [Path.cwd() / "accelerate_configs", Path(__file__).resolve().parents[1] / "accelerate_configs",
            Path(trl.__file__).resolve().parent / "accelerate_configs"]


def available_accelerate_configs() -> list[str]:
    """Names `--accelerate_config` accepts: the configs of `accelerate_configs/` (in the working directory and in
    this repository) and those shipped with TRL."""
    return sorted({p.stem for d in _accelerate_config_dirs() if d.is_dir() for p in d.glob("*.yaml")})


def resolve_accelerate_config(launch_args: list[str]) -> list[str]:
    """`--accelerate_config NAME_OR_PATH` -> `--config_file PATH`: a file, a config of this repository's
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
    device, at least one; one machine; no extra mixed precision; no dynamo), so it does not print a notice for each."""
    from accelerate.commands.config import default_config_file

    if args.config_file is not None or os.path.isfile(default_config_file):
        return
    devices = _local_device_count()
    if args.num_processes is None:
        args.num_processes = max(devices, 1)
    distributed = any(getattr(args, flag, False) for flag in ("multi_gpu", "use_deepspeed", "use_fsdp", "tpu", "cpu"))
    if args.num_processes > 1 and devices > 1 and not distributed:
        args.multi_gpu = True  # what accelerate does for several devices, with a notice
    for name, value in (("num_machines", 1), ("mixed_precision", "no"), ("dynamo_backend", "no")):
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def run_accelerate_launch(args) -> int:
    """Run `accelerate launch` with parsed `args`; return the training processes' exit status (0, or the status of
    the failed one) without a traceback of the launcher's own: the child's error stays the last thing printed."""
    from accelerate.commands.launch import launch_command

    try:
        launch_command(args)
    except subprocess.CalledProcessError as error:
        return error.returncode or 1
    except Exception as error:  # torchrun's ChildFailedError (several processes)
        failures = getattr(error, "failures", None)
        if not failures:
            raise
        return next(iter(failures.values())).exitcode or 1
    return 0


def print_train_help(prog: str = "trl-rpg train") -> None:
    """`trl-rpg train --help`: the launcher options first, then every training argument."""
    parser = make_train_parser(prog)
    configs = textwrap.fill("An accelerate config file, or the name of one: "
                            f"{', '.join(available_accelerate_configs())}.", width=116,
                            initial_indent=" " * 24, subsequent_indent=" " * 24)
    print(_LAUNCHER_HELP.format(usage=_TRAIN_USAGE.format(prog=prog), configs=configs))
    parser.usage = argparse.SUPPRESS
    print(parser.format_help())


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
            script_args, parsed_args, _, dataset_args, config_remaining, cli_remaining = parser.parse_args_and_config(
                argv, return_remaining_strings=True, separate_remaining_strings=True)
            check_launcher_arguments(config_remaining + cli_remaining, _parser_flags(parser))
            launch_args = resolve_accelerate_config(config_remaining + cli_remaining)
            accelerate_args = parse_launch_arguments(launch_args, _subtract_subsequence(argv, cli_remaining))
            check_reward_names(script_args.reward_funcs)
            if not dataset_args.datasets:
                check_dataset_name(script_args.dataset_name)
                check_local_data_columns(script_args, parsed_args.max_completion_length)
        except (ValueError, FileNotFoundError) as error:
            return report_usage_error(prog, error)
    complete_launch_defaults(accelerate_args)
    previous = os.environ.get(_PROG_ENV)
    os.environ[_PROG_ENV] = prog  # the training processes report errors under the command the user typed
    try:
        return run_accelerate_launch(accelerate_args)
    finally:
        if previous is None:
            del os.environ[_PROG_ENV]
        else:
            os.environ[_PROG_ENV] = previous


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
