"""`RPGTrainer`'s checkpoint glue: the trainer's parts handed to `trl_rpg.checkpoint`, as plain functions of what they
need. What identifies the run (`run_identity`, `run_id`), the checkpoint a run resumes from, verified on every process
(`verified_checkpoint`), RPG's files written after TRL's and the manifest last (`save_files`), RPG's state restored
on resume (`restore`). The trainer's overrides (`train`, `_save_checkpoint`, `_load_optimizer_and_scheduler`) call
them; docs/checkpoints.md says what is written and checked.
"""

from __future__ import annotations

from collections.abc import Callable

from accelerate.utils import gather_object

from . import checkpoint
from .reference import MOVING

__all__ = ["gather_all", "restore", "run_id", "run_identity", "save_files", "verified_checkpoint"]


def gather_all(acc) -> Callable[[list], list]:
    """Every process's values, in rank order (`gather_object`, a collective call); on one process, the values."""
    return gather_object if acc.num_processes > 1 else lambda values: values


def run_identity(args, acc, model, deepspeed: bool) -> dict:
    """What identifies this run in a checkpoint (`checkpoint.run_identity`), with its DeepSpeed ZeRO stage."""
    stage = acc.state.deepspeed_plugin.zero_stage if deepspeed else None
    return checkpoint.run_identity(args, acc.unwrap_model(model), zero_stage=stage, grad_scaler=acc.scaler is not None)


def run_id(stateful_callbacks: dict, acc) -> str:
    """This run's id (`checkpoint.run_id`, kept in `trainer_state.json`), the main process's on every process."""
    return checkpoint.run_id(stateful_callbacks,
                             (lambda value: gather_object([value])[0]) if acc.num_processes > 1 else None)


def verified_checkpoint(request, args, acc, identity: dict) -> str:
    """The checkpoint to resume from (a path, or `True`: the newest that passes), verified by every process
    before transformers reads it (`checkpoint.resume_checkpoint`); every process raises the same error."""
    return checkpoint.resume_checkpoint(request, args.output_dir, identity, args.max_steps, acc.num_processes,
                                        acc.process_index, acc.is_main_process, gather_all(acc))


def save_files(output_dir: str, args, acc, reference, step: int, buffered_inputs, skipped_steps: int,
               global_step: int, identity: Callable[[], dict], run: str) -> None:
    """RPG's files of a checkpoint, after TRL's, on every process: each process's generation buffer (TRL's `_step` and
    `_buffered_inputs`), the moving reference's snapshot (a collective call under ZeRO-3) and RPG's state (the
    reference's and `skipped_steps`); then, once every process is done, the manifest with the run's `identity()` and
    id `run`."""
    buffer = buffered_inputs if args.rpg_save_generation_buffer else None
    own = checkpoint.save_generation_buffer(output_dir, acc.process_index, step, buffer)
    if args.rpg_reference in MOVING:
        snapshot = reference.snapshot(keep=args.should_save)  # a collective call under ZeRO-3
        if args.should_save:
            checkpoint.save_reference(output_dir, snapshot)
    if args.should_save:
        checkpoint.save_state(output_dir, {**reference.state_dict(), "skipped_steps": skipped_steps})
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
    if args.rpg_reference in MOVING:
        reference.restore(checkpoint.load_reference(resume_from))
    step, buffered_inputs = checkpoint.restore_buffers(resume_from, acc.num_processes, args.steps_per_generation,
                                                       acc.process_index, pad_token_id, acc.device)
    return skipped_steps, step, buffered_inputs
