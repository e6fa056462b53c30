"""The `trl-rpg` command line: `trl-rpg train ...` (TRL's `trl grpo`, with RPG) and `trl-rpg demo`.

* `trl-rpg train [launcher options] [training arguments]` checks the arguments here, with TRL's `TrlParser` (script
  arguments, `RPGConfig`, `ModelConfig`, `DatasetMixtureConfig`; `--config recipe.yaml` works as in TRL), then trains
  one process in this one (with the environment accelerate would give it) and starts several with `accelerate launch
  [launcher options] -m trl_rpg train [training arguments]`, as `trl grpo` launches TRL's GRPO script. Launcher
  options (`--num_processes 8`, `--config_file ...`, `--accelerate_config zero3`) are the options of `accelerate
  launch`; an argument that is neither is refused before anything is launched, with the closest valid name. The
  launcher exits with the training process's exit status, its error being the last thing printed.
* `python -m trl_rpg train ...` (and so `accelerate launch [...] -m trl_rpg train ...`) trains in the current process.
  Every check that needs no model (settings, data file, reward functions, the columns they read) runs before the
  model is loaded; a mistake ends the run with one `error:` line naming what to fix.
* `trl-rpg demo` trains a tiny bundled model on a toy arithmetic task on CPU (see `trl_rpg.cli.toy_demo`); `trl-rpg
  demo --async` trains it with AsyncRPGTrainer and TRL's AsyncGRPOTrainer on stale CPU rollouts
  (`trl_rpg.cli.async_toy_demo`).

The modules, each importing only those listed before it: `reward_funcs` (reward-function names and import paths),
`arguments` (the parser, help texts, usage errors), `data` (the training data), `checks` (what a run trains on,
checked before anything loads), `training` (training in this process), `launcher` (`trl-rpg train`: one process
trained in this one, several by accelerate launch, ending with it), `demo` (`trl-rpg demo`), `plot`, `prepare`
(`trl-rpg prepare smollm2`), `entry` (`main`); the demos `toy_demo`, `async_toy_demo`, `smollm2_demo`. Every public
name is importable from here.

May import: every layer of trl_rpg (the top one: docs/architecture.md).
"""

import logging


class _WithoutDeepSpeedCpuNotice(logging.Filter):
    """Drops DeepSpeed's "Setting accelerator to CPU ..." line, printed on every CPU run when TRL imports DeepSpeed
    (torch sees no GPU, so the run is on CPU anyway; `--use_cpu True` says so)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Setting accelerator to CPU")


logging.getLogger("DeepSpeed").addFilter(_WithoutDeepSpeedCpuNotice())  # before TRL (and so DeepSpeed) is imported

from .arguments import (  # noqa: E402
    RESUME_LATEST,
    RESUME_NEVER,
    USAGE_ERROR,
    RPGScriptArguments,
    available_accelerate_configs,
    make_train_parser,
    print_train_help,
    report_usage_error,
    resolve_accelerate_config,
    resume_argument,
    train_help_sections,
)
from .checks import (  # noqa: E402
    check_local_data_columns,
    check_model_name,
    check_resume_path,
    check_training_columns,
    looks_like_local_path,
)
from .data import DATA_FILE_BUILDERS, check_dataset_name, load_training_data, looks_like_data_file  # noqa: E402
from .demo import make_demo_parser, run_demo_command  # noqa: E402
from .entry import main, show_upstream_warnings_once  # noqa: E402
from .launcher import (  # noqa: E402
    check_launcher_arguments,
    check_process_count,
    complete_launch_defaults,
    launch_train,
    parse_launch_arguments,
    run_accelerate_launch,
    stop_with_launcher,
)
from .prepare import make_prepare_parser, run_prepare_command  # noqa: E402
from .reward_funcs import (  # noqa: E402
    DEFAULT_REWARD_FUNCS,
    REWARD_KEYWORDS,
    check_reward_callable,
    check_reward_names,
    resolve_reward_funcs,
)
from .training import TrainingSetup, prepare_training, run_train, train  # noqa: E402

__all__ = [
    "DATA_FILE_BUILDERS",
    "DEFAULT_REWARD_FUNCS",
    "RESUME_LATEST",
    "RESUME_NEVER",
    "REWARD_KEYWORDS",
    "USAGE_ERROR",
    "RPGScriptArguments",
    "TrainingSetup",
    "available_accelerate_configs",
    "check_dataset_name",
    "check_launcher_arguments",
    "check_local_data_columns",
    "check_model_name",
    "check_process_count",
    "check_resume_path",
    "check_reward_callable",
    "check_reward_names",
    "check_training_columns",
    "complete_launch_defaults",
    "launch_train",
    "load_training_data",
    "looks_like_data_file",
    "looks_like_local_path",
    "main",
    "make_demo_parser",
    "make_prepare_parser",
    "make_train_parser",
    "parse_launch_arguments",
    "prepare_training",
    "print_train_help",
    "report_usage_error",
    "resolve_accelerate_config",
    "resolve_reward_funcs",
    "resume_argument",
    "run_accelerate_launch",
    "run_demo_command",
    "run_prepare_command",
    "run_train",
    "show_upstream_warnings_once",
    "stop_with_launcher",
    "train",
    "train_help_sections",
]
