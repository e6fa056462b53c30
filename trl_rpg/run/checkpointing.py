"""The checkpoint glue of both trainers (`RPGTrainer`, `AsyncRPGTrainer`): their parts handed to
`trl_rpg.run.checkpoint` and `trl_rpg.run.hub_uploads`, as plain functions of what they need. What identifies the run
(`run_identity`, `async_run_identity`, `run_id`), the checkpoint a run resumes from, verified on every process
(`verified_checkpoint`, `resume_or_start`), a checkpoint's save (`save_checkpoint`: the folder emptied and marked,
TRL's files, RPG's files and the manifest last (`save_files`, `save_async_files`), then the Hub upload and rotation),
RPG's state restored on resume (`restore`, `restore_async`), the Hub uploads read (`hub_uploads`, `push_recorded`) and
a run whose last checkpoint never reached the Hub ended in `HubUploadError` with the final model saved
(`raise_if_upload_failed`). The trainers' overrides (`train`, `_save_checkpoint`, `_push_from_checkpoint`,
`_finish_current_push`, `_load_optimizer_and_scheduler`) call them; docs/checkpoints.md says what is written and
checked.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from accelerate.utils import gather_object

from .. import _compat
from . import checkpoint
from .hub_uploads import HubUploadError, HubUploads

__all__ = ["SAMPLER_REFERENCE_STATE", "async_run_identity", "gather_all", "hub_uploads", "push_recorded",
           "raise_if_upload_failed", "restore", "restore_async", "resume_or_start", "run_id", "run_identity",
           "save_async_files", "save_checkpoint", "save_files", "verified_checkpoint"]

#: The reference state in an asynchronous checkpoint's `rpg_state.json`: the reference is the sampler of each
#: sample, which has no version, updates or moving average to keep.
SAMPLER_REFERENCE_STATE = {"reference_version": 0, "reference_updates": 0, "kl_ema": None}


def gather_all(acc) -> Callable[[list], list]:
    """Every process's values, in rank order (`gather_object`, a collective call); on one process, the values."""
    return gather_object if acc.num_processes > 1 else lambda values: values


def run_identity(args, acc, model, deepspeed: bool) -> dict:
    """What identifies this run in a checkpoint (`checkpoint.run_identity`), with its DeepSpeed ZeRO stage."""
    stage = acc.state.deepspeed_plugin.zero_stage if deepspeed else None
    return checkpoint.run_identity(args, acc.unwrap_model(model), zero_stage=stage, grad_scaler=acc.scaler is not None)


def async_run_identity(args, acc, model) -> dict:
    """`run_identity` of an `AsyncRPGTrainer` run: the asynchronous trainer buffers no generation batch (each
    micro-batch is new samples from the rollout worker), so its batch layout records one micro-batch per generation."""
    identity = run_identity(args, acc, model, deepspeed=False)
    identity["batch"]["steps_per_generation"] = 1
    return identity


def run_id(stateful_callbacks: dict, acc) -> str:
    """This run's id (`checkpoint.run_id`, kept in `trainer_state.json`), the main process's on every process."""
    return checkpoint.run_id(stateful_callbacks,
                             (lambda value: gather_object([value])[0]) if acc.num_processes > 1 else None)


def verified_checkpoint(request, args, acc, identity: dict) -> str:
    """The checkpoint to resume from (a path, or `True`: the newest that passes), verified by every process
    before transformers reads it (`checkpoint.resume_checkpoint`); every process raises the same error."""
    return checkpoint.resume_checkpoint(request, args.output_dir, identity, args.max_steps, acc.num_processes,
                                        acc.process_index, acc.is_main_process, gather_all(acc))


def resume_or_start(request, args, acc, identity: Callable[[], dict], main: bool):
    """What `train(resume_from_checkpoint=request)` resumes from: a path or `True`, the checkpoint verified by every
    process (`verified_checkpoint` with `identity()`); otherwise (a fresh run) `request` as it is, after warning (main
    process) when `output_dir` holds another run's checkpoints."""
    if request is True or isinstance(request, str):
        return verified_checkpoint(request, args, acc, identity())
    if main and args.save_strategy != "no":  # a fresh run: one folder, one run
        checkpoint.warn_if_other_runs(args.output_dir)
    return request


def save_checkpoint(trainer, trial, save_trl: Callable[[], None], save_rpg: Callable[[str, str], None]) -> None:
    """`trainer`'s `_save_checkpoint`: the folder emptied and marked as being written, then TRL's files
    (`save_trl()`, the parent class's save) and RPG's with the manifest (`save_rpg(folder, run_id)`); then the Hub
    upload of the complete checkpoint (`trainer._push_from_checkpoint`) and rotation (RPG's: this run's complete
    checkpoints only, those still uploading kept). A crash mid-save never leaves a checkpoint that looks complete,
    deletes the last complete one, or uploads a checkpoint that cannot be resumed."""
    args, acc, state = trainer.args, trainer.accelerator, trainer.state
    run_dir = trainer._get_output_dir(trial=trial)
    output_dir = os.path.join(run_dir, f"{_compat.PREFIX_CHECKPOINT_DIR}-{state.global_step}")
    run = run_id(state.stateful_callbacks, acc)
    limit, push = args.save_total_limit, args.push_to_hub
    # transformers rotates and queues the Hub upload inside its save, before RPG's files and the manifest exist
    args.save_total_limit, args.push_to_hub = None, False
    try:
        with checkpoint.explain_disk_full(output_dir):
            if args.should_save:
                checkpoint.begin_checkpoint(output_dir, state.global_step, run)
            acc.wait_for_everyone()  # no process writes into the folder before it is emptied
            save_trl()
            save_rpg(output_dir, run)
    finally:
        args.save_total_limit, args.push_to_hub = limit, push
    if push:
        trainer._push_from_checkpoint(output_dir)  # transformers' upload, of the complete checkpoint
    if args.should_save:  # after the push: a checkpoint still uploading is kept (hub_uploads)
        trainer._hub.rotate(functools.partial(checkpoint.rotate, run_dir, limit, output_dir, run,
                                              state.best_model_checkpoint))


def hub_uploads(args, main: bool, timeout: float | None, trainer: str = "RPGTrainer") -> HubUploads:
    """The run's Hub uploads (`hub_uploads.HubUploads`, its messages naming `trainer`), active on the main process
    when `args` pushes during training (`push_to_hub`, a `hub_strategy` other than "end")."""
    return HubUploads(args.push_to_hub and args.hub_strategy != "end" and main, timeout, trainer)


def push_recorded(hub: HubUploads, folder: str, step: int, push: Callable[[str], None]) -> None:
    """transformers' `_push_from_checkpoint(folder)` (`push`) with its uploads run in RPG's worker, a checkpoint's
    manifest last in a commit of its own, and each result read (`hub_uploads`)."""
    with _compat.trainer_hub_api(hub.recorder(folder, step)):
        push(folder)
    hub.report()


def raise_if_upload_failed(trainer) -> None:
    """At the end of `train()`: when the run's last checkpoint never reached the Hub (the main process's verdict,
    `HubUploads.final_error`), save the final model to `output_dir` (a script's own save after `train()` never runs)
    and raise `HubUploadError` saying so."""
    hub_error = gather_all(trainer.accelerator)([trainer._hub.final_error()])[0]
    if hub_error is not None:
        trainer.save_model(trainer.args.output_dir, _internal_call=True)
        raise HubUploadError(f"{hub_error} The final model is saved in {trainer.args.output_dir}.")


def save_files(output_dir: str, args, acc, reference, step: int, buffered_inputs, skipped_steps: int,
               global_step: int, identity: Callable[[], dict], run: str) -> None:
    """RPG's files of a checkpoint, after TRL's, on every process: each process's generation buffer (TRL's `_step` and
    `_buffered_inputs`), the moving reference's snapshot (a collective call under ZeRO-3) and RPG's state (the
    reference's and `skipped_steps`); then, once every process is done, the manifest with the run's `identity()` and
    id `run`."""
    buffer = buffered_inputs if args.rpg_save_generation_buffer else None
    own = checkpoint.save_generation_buffer(output_dir, acc.process_index, step, buffer)
    if reference.moving:
        snapshot = reference.snapshot(keep=args.should_save)  # a collective call under ZeRO-3
        if args.should_save:
            checkpoint.save_reference(output_dir, snapshot)
    _complete(output_dir, args, acc, {**reference.state_dict(), "skipped_steps": skipped_steps}, own, global_step,
              identity, run)


def save_async_files(output_dir: str, args, acc, skipped_steps: int, global_step: int, identity: Callable[[], dict],
                     run: str) -> None:
    """`AsyncRPGTrainer`'s RPG files of a checkpoint, after TRL's, on every process: an empty generation buffer (it
    buffers none: a resumed run takes new samples from the rollout worker), RPG's state (the sampler as reference,
    `SAMPLER_REFERENCE_STATE`, and `skipped_steps`); then the manifest, as `save_files` writes them."""
    own = checkpoint.save_generation_buffer(output_dir, acc.process_index, 0, None)
    _complete(output_dir, args, acc, {**SAMPLER_REFERENCE_STATE, "skipped_steps": skipped_steps}, own, global_step,
              identity, run)


def _complete(output_dir: str, args, acc, state: dict, own: dict, global_step: int, identity: Callable[[], dict],
              run: str) -> None:
    """RPG's state file, then, once every process has written its files (`own`: this process's buffer record), the
    manifest with the run's `identity()` and id `run`."""
    if args.should_save:
        checkpoint.save_state(output_dir, state)
    reported = gather_all(acc)([own])
    acc.wait_for_everyone()
    if args.should_save:
        checkpoint.write_manifest(output_dir, global_step, acc.num_processes, identity(), reported,
                                  args.save_only_model, run)


def restore(resume_from: str, args, acc, reference, pad_token_id: int) -> tuple[int, int, list[dict] | None]:
    """RPG's state restored on resume, on every process (the checkpoint was verified in `train`): the reference's
    state and snapshot into `reference`; returns `(skipped_steps, step, buffered_inputs)`, the last two TRL's
    `_step` and `_buffered_inputs` (`checkpoint.restore_buffers`)."""
    state = checkpoint.load_state(resume_from)
    reference.load_state_dict(state)
    skipped_steps = int(state.get("skipped_steps", 0))
    if reference.moving:
        reference.restore(checkpoint.load_reference(resume_from))
    step, buffered_inputs = checkpoint.restore_buffers(resume_from, acc.num_processes, args.steps_per_generation,
                                                       acc.process_index, pad_token_id, acc.device)
    return skipped_steps, step, buffered_inputs


def restore_async(resume_from: str) -> int:
    """`AsyncRPGTrainer`'s state restored on resume (the checkpoint was verified in `train`): its `skipped_steps`."""
    return int(checkpoint.load_state(resume_from).get("skipped_steps", 0))
