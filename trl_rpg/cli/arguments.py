"""The arguments of `trl-rpg train` and `python -m trl_rpg train`: TRL's parser with RPG's fields and help texts, the
grouped `--help`, `--resume_from_checkpoint` values, `--accelerate_config` names, and the `error:` line a mistake
ends with (an unknown argument named with the closest valid one)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from trl import ScriptArguments

from ..rewards import REWARD_FUNCS
from .reward_funcs import DEFAULT_REWARD_FUNCS

#: Exit status of a run refused because of its arguments (argparse's).
USAGE_ERROR = 2
#: `--resume_from_checkpoint` values that mean "the newest complete checkpoint of output_dir" (TRL's and
#: transformers' users' habits), and those that mean "do not resume".
RESUME_LATEST = ("true", "last", "latest")
RESUME_NEVER = ("false", "none", "")


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


# ----------------------------------------------------------------------------------------------------------------
# The training parser and its help
# ----------------------------------------------------------------------------------------------------------------


_TRAIN_USAGE = "{prog} [launcher options] [training arguments]"


def make_train_parser(prog: str = "trl-rpg train"):
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    from ..trainers.config import RPGConfig

    usage = _TRAIN_USAGE.format(prog=prog) if prog.startswith("trl-rpg") else f"{prog} [training arguments]"
    # allow_abbrev=False: `--max_step 2` is an unknown argument, not `--max_steps 2` (argparse's prefix matching)
    parser = TrlParser((RPGScriptArguments, RPGConfig, ModelConfig, DatasetMixtureConfig), prog=prog, usage=usage,
                       allow_abbrev=False)
    for flag, help_text in _RPG_HELP.items():  # GRPOConfig fields whose TRL help is not true under RPG
        parser._option_string_actions[flag].help = help_text
    # a command-line run that learned nothing exits non-zero (after saving the final model); the Python API returns
    parser.set_defaults(rpg_require_learning_signal=True)
    parser._option_string_actions["--rpg_require_learning_signal"].help = _REQUIRE_SIGNAL_HELP
    return parser


_REQUIRE_SIGNAL_HELP = ("A run that trained on nothing (no step with a learning signal) saves its final model and "
                        "exits non-zero with NoLearningSignal. Default here True (RPGConfig's default, False, makes "
                        "train() return with a warning, as GRPOTrainer does).")


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
    # unset (None) until RPGConfig resolves them: the help says what None means, next to argparse's "(default: None)"
    "--epsilon": "Lower clip width eps_low (> 0) of RPG-Style Clip: the trust region is [1 - epsilon, 1 + "
                 "epsilon_high]. Unset (None): 0.2, the paper's (and GRPO's).",
    "--epsilon_high": "Upper clip width eps_high (> 0). Unset (None): 0.28, the paper's clip-higher, when --epsilon "
                      "is unset too; else equal to --epsilon (symmetric, as in GRPOConfig).",
}


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


def train_help_sections(parser) -> list[tuple[str, list]]:
    """The training arguments of `trl-rpg train --help`, grouped: RPG's own fields (and the GRPO defaults RPG changes),
    then reward and data settings, the model, and every other training argument (GRPOConfig, TrainingArguments)."""
    from dataclasses import fields

    from trl import DatasetMixtureConfig, ModelConfig

    from ..trainers.config import RPGConfig

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


# ----------------------------------------------------------------------------------------------------------------
# accelerate configs by name
# ----------------------------------------------------------------------------------------------------------------


def _accelerate_config_dirs() -> list[Path]:
    import trl

    return [Path.cwd() / "accelerate_configs", Path(__file__).resolve().parents[1] / "accelerate_configs",
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


# ----------------------------------------------------------------------------------------------------------------
# Unknown arguments and usage errors
# ----------------------------------------------------------------------------------------------------------------


def _parser_flags(parser) -> list[str]:
    return sorted(flag for flag in parser._option_string_actions if flag.startswith("--"))


def _launcher_flags() -> list[str]:
    from accelerate.commands.launch import launch_command_parser

    return sorted({*_parser_flags(launch_command_parser()), "--accelerate_config"})


def recipe_path(argv: list[str]) -> str | None:
    """The YAML recipe of `argv` (TRL's `--config PATH`), if there is one."""
    return argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None


def check_recipe_keys(config_remaining: list[str], training_flags: list[str], recipe: str | None) -> None:
    """Refuse the keys of a `--config` recipe that are neither training arguments nor `accelerate launch` options,
    naming the file and each key (with the closest valid one). `config_remaining` is what TRL's parser did not take
    from the recipe: `--key value` pairs."""
    launcher_flags = _launcher_flags()
    unknown = [key.removeprefix("--") for key in config_remaining[0::2] if key not in launcher_flags]
    if not unknown:
        return
    known = [flag.removeprefix("--") for flag in training_flags + launcher_flags]
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        parts.append(f"{key} (did you mean {close[0]}?)" if close else key)
    noun = "key" if len(parts) == 1 else "keys"
    raise ValueError(f"{recipe or 'the --config recipe'}: unknown {noun} {', '.join(parts)}: neither a training "
                     "argument (`trl-rpg train --help`) nor an `accelerate launch` option.")


def check_recipe_values(recipe: str | None, parser) -> None:
    """Refuse a `--config` recipe value that cannot be the field's (`reward_funcs: 5`, `learning_rate: [1]`,
    `reward_funcs: math_reward` where a list is meant), naming the file, the key and what it takes, before TRL's
    parser hands it on: argparse checks only text (a value given as text is converted and checked by it, naming the
    flag); a YAML number, list or mapping reaches the config unchecked."""
    if recipe is None:
        return
    import typing

    import yaml

    try:
        with open(recipe, encoding="utf-8") as f:
            values = yaml.safe_load(f)
    except OSError:
        return  # TRL's parser reports it
    except yaml.YAMLError as error:
        raise ValueError(yaml_error_message(recipe, error)) from None
    if not isinstance(values, dict):
        return
    fields = {}
    for dataclass_type in parser.dataclass_types:
        try:
            hints = typing.get_type_hints(dataclass_type)
        except Exception:  # an annotation this Python cannot resolve: left to the parser
            continue
        fields.update({f.name: (hints.get(f.name), f.default) for f in dataclasses.fields(dataclass_type)})
    for key, value in values.items():
        if key in fields and fields[key][0] is not None and not _recipe_value_fits(value, *fields[key]):
            annotation = fields[key][0]
            hint = (" (YAML reads an unquoted no / yes / off / on as false / true: quote it, 'no')"
                    if isinstance(value, bool) else " (in YAML a list is written [a, b])"
                    if any(_is_list(arm) for arm in _union_arms(annotation)) else "")
            raise ValueError(f"{recipe}: the value of key {key}, {value!r:.100}, is not one {key} takes: "
                             f"{_type_text(annotation)}{hint}.")


def yaml_error_message(path: str, error: Exception) -> str:
    """PyYAML's error as one line naming the file, line and column (1-based) where the parser stopped: `recipe.yaml,
    line 3, column 10: not valid YAML (expected ',' or ']', but got ':', while parsing a flow sequence started at
    line 2, column 15).`"""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or " ".join(str(error).split())
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context:
        problem += f", {context}" + (f" started at line {start.line + 1}, column {start.column + 1}"
                                     if start is not None and start is not mark else "")
    return f"{path}{where}: not valid YAML ({problem})."


def _union_arms(annotation) -> tuple:
    import types
    import typing

    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is_list(annotation) -> bool:
    import typing

    return annotation in (list, tuple) or typing.get_origin(annotation) in (list, tuple)


def _recipe_value_fits(value, annotation, default) -> bool:
    """Whether a YAML value can be the value of a field annotated `annotation` (a type this check does not know is
    taken: the parser and the config check it)."""
    import enum
    import typing

    arms = _union_arms(annotation)
    if isinstance(value, str):  # argparse converts and checks it, except where only a list is taken
        return not all(_is_list(arm) for arm in arms if arm is not type(None))
    if value is None:
        return type(None) in arms or default is None
    for arm in arms:
        origin = typing.get_origin(arm)
        if arm is typing.Any or arm is type(None) and value is None:
            return True
        if _is_list(arm):
            inner = typing.get_args(arm)[:1]
            if isinstance(value, list) and all(_recipe_value_fits(v, inner[0], object()) if inner else True
                                               for v in value):
                return True
        elif arm is dict or origin is dict:
            if isinstance(value, dict):
                return True
        elif arm is bool:
            if isinstance(value, bool):
                return True
        elif arm is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif arm is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif origin is typing.Literal:
            if value in typing.get_args(arm):
                return True
        elif isinstance(arm, type) and issubclass(arm, enum.Enum):
            if value in [member.value for member in arm]:
                return True
        elif arm is not str and arm is not type(None):
            return True  # a type this check does not know
    return False


def _type_text(annotation) -> str:
    """What a field annotated `annotation` takes, in words ("a list of strings or null")."""
    import enum
    import typing

    words = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a mapping",
             type(None): "null"}

    def one(arm) -> str:
        if _is_list(arm):
            inner = typing.get_args(arm)[:1]
            return f"a list of {one(inner[0]).removeprefix('a ').removeprefix('an ')}s" if inner else "a list"
        if isinstance(arm, type) and issubclass(arm, enum.Enum):
            return "one of " + ", ".join(repr(member.value) for member in arm)
        if typing.get_origin(arm) is typing.Literal:
            return "one of " + ", ".join(repr(v) for v in typing.get_args(arm))
        return words.get(typing.get_origin(arm) or arm, getattr(arm, "__name__", str(arm)))

    return " or ".join(dict.fromkeys(one(arm) for arm in _union_arms(annotation)))


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
        record_error_for_launcher(f"{prog}: error: {message}")
    return USAGE_ERROR


def record_error_for_launcher(line: str) -> None:
    """In a training process started by torchrun (several processes): write the error `line` to the error file
    torchrun gives it (`TORCHELASTIC_ERROR_FILE`, in torch elastic's format), so that the launcher prints the first
    failing process's error last, after torchrun's own log of the failure."""
    import json
    import time

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as file:
            json.dump({"message": line, "timestamp": int(time.time())}, file)
    except OSError:  # the error is printed anyway; only the launcher's repetition of it is lost
        pass
