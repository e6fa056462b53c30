"""The `trl-rpg` command line: `trl-rpg train ...` (TRL's `trl grpo`, with RPG) and `trl-rpg demo`.

* `trl-rpg train [training arguments] [accelerate launch arguments]` parses the arguments with TRL's `TrlParser`
  (script arguments, `RPGConfig`, `ModelConfig`, `DatasetMixtureConfig`; `--config recipe.yaml` works as in TRL),
  then starts `accelerate launch [launch arguments] -m trl_rpg train [training arguments]`, exactly as
  `trl grpo` launches TRL's GRPO script. Arguments the parser does not know (`--num_processes 8`,
  `--config_file ...`, `--accelerate_config zero3`) go to `accelerate launch`.
* `python -m trl_rpg train ...` (and so `accelerate launch [...] -m trl_rpg train ...`) trains in the current process.
* `trl-rpg demo` trains a tiny bundled model on a toy arithmetic task on CPU (see `trl_rpg.demo`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ScriptArguments

#: Reward functions available by name in `--reward_funcs` (anything else must be a dotted import path).
REWARD_FUNCS = ("math_reward", "toy_reward", "soft_overlong_punishment", "accuracy_reward",
                "reasoning_accuracy_reward", "think_format_reward")

#: File extensions of local data files and the `datasets` builder that reads them.
_LOCAL_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}


@dataclass
class RPGScriptArguments(ScriptArguments):
    """Script arguments of `trl-rpg train` (TRL's `ScriptArguments` plus the reward settings).

    `dataset_name` may also be a local file (`.parquet`, `.json`, `.jsonl`, `.csv`) or a directory of them; a single
    file becomes the `train` split.
    """

    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions: 'math_reward' (default; the paper's 'Answer:' / math-verify reward, "
                          "reads a `ground_truth` or verl-style `reward_model` column), 'toy_reward' (the bundled toy "
                          "task), 'soft_overlong_punishment' (DAPO; uses max_completion_length and "
                          "soft_punish_cache), TRL's 'accuracy_reward', 'reasoning_accuracy_reward', "
                          "'think_format_reward', or any dotted import path such as 'my_lib.rewards.custom_reward'."},
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A reward model (Hub id or local path), used in addition to `reward_funcs`."},
    )
    soft_punish_cache: int = field(
        default=4096,
        metadata={"help": "Length of the soft-punishment interval of 'soft_overlong_punishment' (DAPO uses 4096 with "
                          "max_completion_length=20480; the paper's 4K-context runs 1024 of 8192)."},
    )


def resolve_reward_funcs(names, max_completion_length: int, soft_punish_cache: int) -> list:
    """Turn `--reward_funcs` names and dotted paths into reward callables."""
    rewards = []
    for name in names or ["math_reward"]:
        if name == "math_reward":
            from .rewards import math_reward

            rewards.append(math_reward)
        elif name == "toy_reward":
            from .toy import toy_reward

            rewards.append(toy_reward)
        elif name in ("soft_overlong_punishment", "get_soft_overlong_punishment"):
            from .rewards import make_overlong_punishment

            rewards.append(make_overlong_punishment(max_completion_length, min(soft_punish_cache,
                                                                               max_completion_length)))
        elif name in ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward"):
            import trl.rewards

            rewards.append(getattr(trl.rewards, name))
        elif "." in name:
            module_path, func_name = name.rsplit(".", 1)
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            rewards.append(getattr(importlib.import_module(module_path), func_name))
        else:
            raise ValueError(f"Unknown reward function {name!r}: use one of {list(REWARD_FUNCS)} or a dotted import "
                             "path such as 'my_lib.rewards.custom_reward'.")
    return rewards


def load_training_data(script_args, dataset_args=None):
    """The `DatasetDict` to train on: a dataset mixture (`--datasets`), a local file or folder, or a Hub data set."""
    from datasets import DatasetDict, load_dataset

    if dataset_args is not None and dataset_args.datasets:
        from trl import get_dataset

        return get_dataset(dataset_args)
    name = script_args.dataset_name
    if not name:
        raise ValueError("No training data: pass --dataset_name (a Hub data set, a local .parquet/.json/.jsonl/.csv "
                         "file or a folder of them) or --datasets.")
    path = Path(name).expanduser()
    if path.is_file():
        builder = _LOCAL_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"--dataset_name={name!r}: unsupported file type {path.suffix!r}; use one of "
                             f"{sorted(_LOCAL_BUILDERS)}.")
        dataset = load_dataset(builder, data_files={script_args.dataset_train_split: str(path)})
    else:
        dataset = load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
    if not isinstance(dataset, DatasetDict) and not hasattr(dataset, "keys"):
        dataset = DatasetDict({script_args.dataset_train_split: dataset})
    return dataset


def make_train_parser(prog: str = "trl-rpg train"):
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    from .config import RPGConfig

    return TrlParser((RPGScriptArguments, RPGConfig, ModelConfig, DatasetMixtureConfig), prog=prog)


def train(script_args, training_args, model_args, dataset_args=None):
    """Train with `RPGTrainer` as TRL's `grpo.py` trains with `GRPOTrainer`; returns the trainer."""
    from trl import get_peft_config, get_quantization_config

    from .trainer import RPGTrainer

    reward_funcs = []
    if script_args.reward_model_name_or_path:
        reward_funcs.append(script_args.reward_model_name_or_path)
    reward_funcs += resolve_reward_funcs(script_args.reward_funcs, training_args.max_completion_length,
                                         script_args.soft_punish_cache)

    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    if not model_args.model_name_or_path:
        raise ValueError("trl-rpg train needs --model_name_or_path (a Hub id or a local model folder).")
    dataset = load_training_data(script_args, dataset_args)
    if script_args.dataset_train_split not in dataset:
        raise ValueError(f"The data set has no split {script_args.dataset_train_split!r} (it has {list(dataset)}); "
                         "set --dataset_train_split.")
    eval_dataset = None
    if training_args.eval_strategy != "no":
        eval_dataset = dataset.get(script_args.dataset_test_split)

    trainer = RPGTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=eval_dataset,
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


# ----------------------------------------------------------------------------------------------------------------
# Launching through accelerate (as `trl grpo` does)
# ----------------------------------------------------------------------------------------------------------------


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


def resolve_accelerate_config(launch_args: list[str]) -> list[str]:
    """`--accelerate_config NAME_OR_PATH` -> `--config_file PATH`: a file, a config of this repository's
    `accelerate_configs/` (e.g. `deepspeed_zero3`), or one shipped with TRL (e.g. `zero3`)."""
    if "--accelerate_config" not in launch_args:
        return launch_args
    i = launch_args.index("--accelerate_config")
    if i + 1 >= len(launch_args):
        raise ValueError("Expected a value after --accelerate_config.")
    name = launch_args[i + 1]
    candidates = [Path(name), Path.cwd() / "accelerate_configs" / f"{name}.yaml",
                  Path(__file__).resolve().parents[1] / "accelerate_configs" / f"{name}.yaml"]
    try:
        from importlib.resources import files

        candidates.append(Path(str(files("trl.accelerate_configs").joinpath(f"{name}.yaml"))))
    except Exception:  # pragma: no cover - TRL without packaged configs
        pass
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise ValueError(f"--accelerate_config {name!r} is neither a file nor a config in accelerate_configs/ or in "
                         "TRL's trl/accelerate_configs.")
    return ["--config_file", str(path)] + launch_args[:i] + launch_args[i + 2:]


def launch_train(argv: list[str]) -> int:
    """`trl-rpg train`: validate the arguments here (and answer `--help`), then run `accelerate launch ... -m
    trl_rpg train ...`."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    parser = make_train_parser()
    *_, config_remaining, cli_remaining = parser.parse_args_and_config(
        list(argv), return_remaining_strings=True, separate_remaining_strings=True)
    launch_args = resolve_accelerate_config(config_remaining + cli_remaining)
    script_args = _subtract_subsequence(list(argv), cli_remaining)
    accelerate_args = launch_command_parser().parse_args(launch_args + ["-m", "trl_rpg", "train", *script_args])
    launch_command(accelerate_args)
    return 0


def run_train(argv: list[str]) -> int:
    """`python -m trl_rpg train`: train in this process (what each process of `accelerate launch` runs)."""
    parser = make_train_parser(prog="python -m trl_rpg train")
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(list(argv))
    train(script_args, training_args, model_args, dataset_args)
    return 0


# ----------------------------------------------------------------------------------------------------------------
# Demo
# ----------------------------------------------------------------------------------------------------------------


def make_demo_parser(prog: str = "trl-rpg demo") -> argparse.ArgumentParser:
    from .demo import DEMO_EVAL_EVERY, DEMO_MAX_STEPS
    from .objectives import DIVERGENCES, ESTIMATORS

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
    from .demo import run_demo

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
           launched with `accelerate launch` (extra arguments such as --num_processes or --config_file go to it).
           `{prog} train --help` lists every field, the RPG ones (rpg_*) included.
  demo     Train a tiny model on a toy arithmetic task on CPU in about 3 minutes (no download); prints held-out
           accuracy before and after and writes the model and a plot of reward and accuracy.

examples:
  {prog} demo
  {prog} train --model_name_or_path Qwen/Qwen3-1.7B --dataset_name data.parquet --reward_funcs math_reward \\
      --output_dir qwen-rpg --rpg_divergence urkl --rpg_estimator reinforce
  {prog} train --config recipe.yaml --accelerate_config accelerate_configs/deepspeed_zero3.yaml
"""


def main(argv: list[str] | None = None, *, launch: bool = True, prog: str = "trl-rpg") -> int:
    """Console entry point `trl-rpg`. With `launch=False` (`python -m trl_rpg`), `train` runs in this process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE.format(prog=prog))
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        return launch_train(rest) if launch else run_train(rest)
    if command == "demo":
        return run_demo_command(rest)
    if command in ("--version", "version"):
        from . import __version__

        print(f"trl-rpg {__version__}")
        return 0
    print(_USAGE.format(prog=prog), file=sys.stderr)
    print(f"{prog}: error: unknown command {command!r} (choose 'train' or 'demo')", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
