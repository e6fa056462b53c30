"""`trl-rpg train`: check the arguments, then train: one process in this one (with the environment accelerate would
give it), several through `accelerate launch [launcher options] -m trl_rpg train [training arguments]` (as `trl grpo`
launches TRL's GRPO script); exit with the training processes' status. The launcher's own options, process count and
mixed precision are checked here, and each training process ends when the launcher ends."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import warnings

from trl.cli.commands.training import _subtract_subsequence as subtract_subsequence  # TRL's, for `trl <command>`

from ..run.checkpoint.lock import OutputDirBusy
from ..trainers.validation import check_output_dir_free
from .arguments import (
    _is_number,
    _launcher_flags,
    _parser_flags,
    _unknown_arguments_message,
    check_recipe_keys,
    check_recipe_values,
    make_train_parser,
    print_train_help,
    recipe_path,
    report_usage_error,
    resolve_accelerate_config,
)
from .checks import check_local_data_columns, check_model_name, check_resume_path
from .data import check_dataset_name
from .reward_funcs import check_reward_names
from .training import run_train

#: Environment variable through which `trl-rpg train` tells the processes it launches its command name.
_PROG_ENV = "TRL_RPG_PROG"
#: Environment variable through which `trl-rpg train` tells the processes it launches its own process id: each of them
#: ends when that process ends, by any signal (`stop_with_launcher`).
_LAUNCHER_PID_ENV = "TRL_RPG_LAUNCHER_PID"
#: Set by `trl-rpg train` beside `PYTHONSAFEPATH=1`, so that the training process takes the variable out again (the
#: processes it starts in turn, such as a reward function's scripts, get the ordinary `sys.path`).
_SAFE_PATH_ENV = "TRL_RPG_SET_SAFE_PATH"


def launch_train(argv: list[str], prog: str = "trl-rpg train") -> int:
    """`trl-rpg train`: check the arguments here (and answer `--help`), then train: in this process when accelerate
    would start one plain process (`train_in_this_process`), else through `accelerate launch ... -m trl_rpg train
    ...`; returns the exit status of the training processes."""
    argv = list(argv)
    if "-h" in argv or "--help" in argv:
        print_train_help(prog)
        return 0
    parser = make_train_parser(prog)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the training process shows them
        try:
            check_recipe_values(recipe_path(argv), parser)  # before TRL's parser hands a YAML value on unchecked
            script_args, parsed_args, model_args, dataset_args, config_remaining, cli_remaining = (
                parser.parse_args_and_config(
                    argv, return_remaining_strings=True, separate_remaining_strings=True))
            check_recipe_keys(config_remaining, _parser_flags(parser), recipe_path(argv))
            check_launcher_arguments(cli_remaining, _parser_flags(parser))
            launch_args = resolve_accelerate_config(config_remaining + cli_remaining)
            accelerate_args = parse_launch_arguments(launch_args, subtract_subsequence(argv, cli_remaining))
            check_process_count(accelerate_args)
            check_mixed_precision(accelerate_args, parsed_args)
            check_model_name(model_args.model_name_or_path)
            check_resume_path(parsed_args.resume_from_checkpoint, parsed_args.output_dir)
            check_output_dir_free(parsed_args.output_dir)  # before any process starts, whatever their count
            check_reward_names(script_args.reward_funcs)
            if not dataset_args.datasets:
                check_dataset_name(script_args.dataset_name)
                layout = batch_layout(parsed_args, _process_count(accelerate_args),
                                      _sets_generation_batch_size(argv, parser))
                check_local_data_columns(script_args, parsed_args.max_completion_length, layout)
        except (ValueError, FileNotFoundError, OutputDirBusy) as error:
            return report_usage_error(prog, error)
    complete_launch_defaults(accelerate_args)
    one_process = one_plain_process(accelerate_args)
    if one_process is not None:
        return train_in_this_process(one_process, prog)
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
        _restore_environment(previous)


# ----------------------------------------------------------------------------------------------------------------
# accelerate launch's arguments and process count
# ----------------------------------------------------------------------------------------------------------------


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


def _local_device_count() -> int:
    """The number of accelerators `accelerate launch` would use by default (its own order of device types)."""
    import accelerate.utils as accelerate_utils
    import torch

    for kind in ("xpu", "mlu", "sdaa", "musa", "npu", "hpu", "neuron"):
        is_available = getattr(accelerate_utils, f"is_{kind}_available", None)
        if is_available is not None and is_available():
            return getattr(torch, kind).device_count()
    return torch.cuda.device_count()


def _launches_distributed(args) -> bool:
    return any(getattr(args, flag, False) for flag in ("multi_gpu", "use_deepspeed", "use_fsdp", "tpu", "cpu"))


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


def check_process_count(args) -> None:
    """Refuse a launch that would silently run fewer processes than asked: `--num_processes N > 1` with an accelerate
    config whose `distributed_type` is `NO` (accelerate then starts one process), or with one GPU only."""
    if args.num_processes is None or args.num_processes <= 1 or _launches_distributed(args):
        return
    config_file = _config_file(args)
    if config_file is None:
        if _local_device_count() == 1:
            raise ValueError(f"--num_processes {args.num_processes} on a machine with one GPU: accelerate would start "
                             "one process. Use --num_processes 1, or --multi_gpu with --gpu_ids and devices to match.")
        return
    distributed_type = _config_value(args, "distributed_type")  # None if unreadable: accelerate says why
    if distributed_type == "NO":
        raise ValueError(f"--num_processes {args.num_processes} with the accelerate config {config_file} "
                         "(distributed_type: NO) would start one process, not "
                         f"{args.num_processes}. Use --accelerate_config multi_gpu (data parallel; on a machine "
                         "without GPU add --use_cpu True), a DeepSpeed/FSDP config, or --multi_gpu.")


def _config_file(args) -> str | None:
    """The accelerate config file `args` launch with: `--config_file`, else accelerate's default one if it exists."""
    from accelerate.commands.config import default_config_file

    return args.config_file or (default_config_file if os.path.isfile(default_config_file) else None)


def _config_value(args, name: str):
    """`name` of the accelerate config file `args` launch with (None without one, or if it cannot be read:
    accelerate says why when it reads it)."""
    from accelerate.commands.config.config_args import load_config_from_file

    config_file = _config_file(args)
    if config_file is None:
        return None
    try:
        value = getattr(load_config_from_file(config_file), name, None)
    except Exception:
        return None
    return getattr(value, "value", value)


def check_mixed_precision(args, training_args) -> None:
    """Refuse a launch whose mixed precision (`--mixed_precision`, else the accelerate config's `mixed_precision`)
    is bf16 or fp16 while the training arguments ask for another (`--bf16 False`, `--fp16 True`): DeepSpeed refuses
    the mismatch once the model has loaded (minutes later), and without DeepSpeed transformers would train in the
    launcher's precision (`ACCELERATE_MIXED_PRECISION`) although `--bf16 False` was given."""
    training = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "no"
    launcher = args.mixed_precision or _config_value(args, "mixed_precision")
    if launcher not in ("bf16", "fp16") or launcher == training:
        return
    source = (f"--mixed_precision {launcher}" if args.mixed_precision else
              f"the accelerate config {_config_file(args)} (mixed_precision: {launcher})")
    asked = {"no": "--bf16 False (float32)", "fp16": "--fp16 True", "bf16": "--bf16 True"}[training]
    raise ValueError(f"{source} trains in {launcher}, but the training arguments ask for {asked}: DeepSpeed refuses "
                     "the mismatch once the model has loaded, and without DeepSpeed transformers would train in "
                     f"{launcher} anyway. Pass --mixed_precision {training} to align them.")


def _process_count(args) -> int:
    """How many training processes `args` launch (accelerate's `num_processes`, over every machine)."""
    return args.num_processes or _config_value(args, "num_processes") or 1


def _sets_generation_batch_size(argv: list[str], parser) -> bool:
    """Whether `generation_batch_size` is given (on the command line or in the recipe): it is global, the same for
    any number of processes; otherwise it is `per_device_train_batch_size x processes x steps_per_generation`."""
    return (any(item.split("=", 1)[0] == "--generation_batch_size" for item in argv)
            or parser.get_default("generation_batch_size") is not None)


def batch_layout(training_args, num_processes: int, generation_batch_size_given: bool):
    """The batch fields of `training_args` as each of `num_processes` training processes will have them (the
    launcher parses them as one process), for `validation.validate_dataset_size`; None when TRL will refuse the
    layout itself (a generation batch that is no multiple of the global batch)."""
    from types import SimpleNamespace

    per_step = training_args.per_device_train_batch_size * num_processes
    generation = (training_args.generation_batch_size if generation_batch_size_given
                  else per_step * training_args.steps_per_generation)
    if generation % per_step:
        return None
    return SimpleNamespace(
        per_device_train_batch_size=training_args.per_device_train_batch_size, generation_batch_size=generation,
        steps_per_generation=generation // per_step, num_generations=training_args.num_generations,
        gradient_accumulation_steps=training_args.gradient_accumulation_steps,
        num_iterations=training_args.num_iterations,
        rpg_generation_reuse=getattr(training_args, "rpg_generation_reuse", None))


# ----------------------------------------------------------------------------------------------------------------
# One process: trained in this one
# ----------------------------------------------------------------------------------------------------------------


def one_plain_process(args):
    """`args` as `accelerate launch` completes them (its config file read), when it would start one plain process
    (its one-process launcher: no distributed launcher, one process on one machine, every device visible, this
    Python); else None. Reads accelerate's own completion of the arguments, `_validate_launch_command`."""
    import copy

    from accelerate.commands.config.config_args import ComputeEnvironment
    from accelerate.commands.launch import _validate_launch_command

    try:
        probe, defaults, _ = _validate_launch_command(copy.deepcopy(args))
    except Exception:  # accelerate refuses the arguments: `accelerate launch` says why
        return None
    distributed = not probe.cpu and any(getattr(probe, flag, False) for flag in (
        "use_deepspeed", "use_fsdp", "use_megatron_lm", "multi_gpu", "tpu"))
    elsewhere = defaults is not None and defaults.compute_environment != ComputeEnvironment.LOCAL_MACHINE
    if (distributed or elsewhere or (probe.num_processes or 1) > 1 or (probe.num_machines or 1) > 1
            or probe.gpu_ids not in (None, "all") or probe.mpirun_hostfile or probe.no_python):
        return None
    return probe


def train_in_this_process(args, prog: str) -> int:
    """Train in this process, with the environment accelerate's one-process launcher gives its child
    (`ACCELERATE_*`, `OMP_NUM_THREADS`, ...; this process's own restored afterwards): torch, transformers and TRL,
    imported for the checks, are not imported a second time in a child. Returns the exit status: 130 on Ctrl-C."""
    import torch
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    _, env = prepare_simple_launcher_cmd_env(args)
    previous = {name: os.environ.get(name) for name, value in env.items() if os.environ.get(name) != value}
    threads = torch.get_num_threads()
    os.environ.update({name: env[name] for name in previous})
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or threads))  # a new process would read it at start-up
    try:
        return run_train(args.training_script_args[1:], prog=prog)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        torch.set_num_threads(threads)
        _restore_environment(previous)


def _restore_environment(previous: dict) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# ----------------------------------------------------------------------------------------------------------------
# Several processes: run by accelerate launch, and ending with it
# ----------------------------------------------------------------------------------------------------------------


def _exit_status(code: int | None) -> int:
    """A child's exit status as a shell reports it: its own code, 128 + N for a death by signal N, never 0."""
    if code is None or code == 0:
        return 1
    return 128 - code if code < 0 else code


def _system_exit_status(code) -> int:
    """The exit status `sys.exit(code)` gives: `code` itself when it is a number, 0 for None, 1 otherwise."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


#: The signals torchrun's agent turns into a `SignalException` (its default `TORCHELASTIC_SIGNALS_TO_HANDLE`).
_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def run_accelerate_launch(args) -> int:
    """Run `accelerate launch` with parsed `args`; return the training processes' exit status (0, or the status of
    the first one that failed; 128 + N when this process got signal N: 130 on Ctrl-C, 143 on SIGTERM) without a
    traceback of the launcher's own: the child's error stays the last thing printed."""
    from accelerate.commands.launch import launch_command
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    handlers = {name: signal.getsignal(getattr(signal, name)) for name in _AGENT_SIGNALS if hasattr(signal, name)}
    try:
        launch_command(args)
    except subprocess.CalledProcessError as error:
        return _exit_status(error.returncode)
    except KeyboardInterrupt:  # Ctrl-C: the training processes got it too and stop
        return 128 + signal.SIGINT
    except SignalException as error:  # torchrun's agent got a signal and has stopped the training processes
        return 128 + int(error.sigval)
    except SystemExit as error:  # accelerate >= 1.16 exits itself: 128 + N on signal N (130 on Ctrl-C), 1 if quiet
        return _system_exit_status(error.code)
    except ChildFailedError as error:  # several processes: the first to fail is the cause
        _, first = error.get_first_failure()
        if isinstance(first.message, str) and ": error: " in first.message:  # its line (`record_error_for_launcher`)
            print(first.message, file=sys.stderr, flush=True)  # last, after torchrun's log of the failure
        return _exit_status(first.exitcode)
    finally:  # torchrun's agent leaves its handlers (which raise SignalException) installed
        for name, handler in handlers.items():
            if handler is not None:
                signal.signal(getattr(signal, name), handler)
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
