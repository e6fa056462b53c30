"""Which checkpoint a run resumes from (`resume_checkpoint`, `choose`: verified on every process, the same decision
everywhere), and which old checkpoints are deleted once a new one is complete (`rotate`)."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any

from .buffers import buffer_ranks_needed, plan_buffer_restore
from .identity import compare_runs
from .layout import (
    _ERRORS,
    MANIFEST_FILE,
    REFUSED_AT_ONCE,
    TRAINER_STATE_FILE,
    WRITING_FILE,
    CheckpointError,
    IncompleteCheckpoint,
    NoSuchCheckpoint,
    NotAnRPGCheckpoint,
)
from .manifest import verify_checkpoint
from .runs import checkpoint_folders, folder_names, run_of

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# Which checkpoint to resume from
# ----------------------------------------------------------------------------------------------------------------


def is_complete(directory: str) -> bool:
    """Whether `directory` holds a manifest (not verified)."""
    return os.path.isfile(os.path.join(directory, MANIFEST_FILE))


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest `checkpoint-N` folder under `output_dir` that holds a completion marker (not verified)."""
    return next((p for p in checkpoint_folders(output_dir) if is_complete(p)), None)


def check_folder(directory: str) -> None:
    """Raise, with a message of its own, if `directory` is not a folder, not an RPG checkpoint, or interrupted."""
    if not os.path.isdir(directory):
        raise NoSuchCheckpoint(f"resume_from_checkpoint={directory!r}: no such folder.")
    if os.path.lexists(os.path.join(directory, MANIFEST_FILE)):
        return
    names = os.listdir(directory)
    if WRITING_FILE in names or any(name.startswith("rpg_") for name in names):
        raise IncompleteCheckpoint(
            f"{directory} is not a complete RPG checkpoint: it was interrupted while being written (it has no "
            f"{MANIFEST_FILE}, the file written last). Resume from an earlier checkpoint, or with "
            "resume_from_checkpoint=True, which takes the newest complete one.")
    if TRAINER_STATE_FILE in names:
        raise NotAnRPGCheckpoint(
            f"{directory} is not an RPG checkpoint: it holds transformers' files but none of RPGTrainer's (no "
            f"{MANIFEST_FILE}); it was probably written by GRPOTrainer or transformers' Trainer. RPGTrainer resumes "
            "only its own checkpoints (they hold the reference policy and the buffered generation batch); to start "
            f"from its weights, pass model={directory!r} without resume_from_checkpoint.")
    raise NotAnRPGCheckpoint(f"{directory} is not a checkpoint: it has neither {MANIFEST_FILE} nor "
                             f"{TRAINER_STATE_FILE}.")


def latest_run_folders(output_dir: str) -> list[str]:
    """The checkpoints `resume_from_checkpoint=True` tries, newest step first: those of the run that completed a
    checkpoint last (the latest manifest time), and the folders that record no run (another trainer's, a damaged
    marker: they fail with their own error). Other runs' checkpoints are passed over with a warning naming them."""
    folders = checkpoint_folders(output_dir)
    completed = [run_of(path, complete_only=True) for path in folders]
    if not any(run for run, _ in completed):
        return folders
    latest = max((record for record in completed if record[0]), key=lambda record: record[1])[0]
    owners = {path: run_of(path)[0] for path in folders}
    others = [path for path in folders if owners[path] not in (latest, None)]
    if others:
        logger.warning("resume_from_checkpoint=True: %s (another run) are passed over; output_dir=%r holds "
                       "checkpoints of several runs, and the one that completed a checkpoint last is resumed.",
                       folder_names(others), output_dir)
    return [path for path in folders if path not in others]


def choose(request: str | bool, output_dir: str, verify: Callable[[str], dict[str, Any]],
           agree: Callable[[Any], list]) -> tuple[str, dict[str, Any]]:
    """The checkpoint to resume from and its manifest.

    `request` is a path (refused if it fails) or `True`: the checkpoints of `latest_run_folders`, newest first, each
    that fails passed over with a warning, except a checkpoint another run could not continue (`REFUSED_AT_ONCE`),
    refused. `verify` is this process's share of the checks (`verify_for_process`); `agree` gathers one value from
    every process, so every process takes the same decision and raises the same error. When none passes, the error
    names each candidate and why it failed.
    """
    candidates = [str(request)] if request is not True else latest_run_folders(output_dir)
    if not candidates:
        raise NoSuchCheckpoint(f"resume_from_checkpoint=True: output_dir={output_dir!r} holds no checkpoint-N "
                               "folder.")
    failures = []
    for path in candidates:
        try:
            check_folder(path)
            manifest, failure = verify(path), None
        except CheckpointError as error:
            failure = (type(error).__name__, str(error))
        reported = [f for f in agree(failure) if f]
        if not reported:
            return path, manifest
        kind, message = reported[0]
        error_type = _ERRORS.get(kind, CheckpointError)
        if request is not True or issubclass(error_type, REFUSED_AT_ONCE):
            raise error_type(message)
        logger.warning("Not resuming from %s: %s", path, message)
        failures.append(f"{os.path.basename(path)}: {message}")
    raise CheckpointError(f"No checkpoint in output_dir={output_dir!r} can be resumed from:\n- "
                          + "\n- ".join(failures))


def verify_for_process(directory: str, run: dict[str, Any], world_size: int, rank: int, main: bool
                       ) -> dict[str, Any]:
    """This process's share of verifying a checkpoint before resuming: the main process checks every file the
    manifest lists except the processes' buffers; every process checks the buffer files it will read. Returns the
    manifest."""
    manifest = verify_checkpoint(directory, run, ranks=None if main else [])
    plan = plan_buffer_restore(manifest, world_size, run["batch"]["steps_per_generation"])
    verify_checkpoint(directory, run, ranks=buffer_ranks_needed(plan, manifest, rank))
    return manifest


def resume_checkpoint(request: str | bool, output_dir: str, run: dict[str, Any], max_steps: int, world_size: int,
                      rank: int, main: bool, gather: Callable[[list], list]) -> str:
    """The checkpoint a run resumes from (`choose`, with `verify_for_process` on each process and `gather` to agree),
    after warning (main process) about the settings that differ from the run that wrote it."""
    path, manifest = choose(request, output_dir, lambda p: verify_for_process(p, run, world_size, rank, main),
                            lambda failure: gather([failure]))
    if main:
        logger.warning("RPGTrainer: resuming from %s at step %d (verified: its %d files match the sizes and "
                       "SHA-256 checksums its manifest records).", path, manifest["global_step"],
                       len(manifest["files"]))
        warn_changes(path, manifest, run)
        warn_if_finished(path, manifest, max_steps)
    return path


def warn_if_finished(directory: str, manifest: dict[str, Any], max_steps: int) -> None:
    step = manifest["global_step"]
    if 0 < max_steps <= step:
        logger.warning("RPGTrainer: %s is already at step %d (max_steps=%d); transformers' Trainer still takes one "
                       "more optimizer step when it resumes a checkpoint (GRPOTrainer does too).", directory, step,
                       max_steps)


def warn_changes(directory: str, manifest: dict[str, Any], run: dict[str, Any]) -> None:
    """Warn, naming each, about the settings of `run` that differ from those of the run that wrote `directory`."""
    changes = compare_runs(directory, manifest["run"], run)
    if changes:
        logger.warning("Resuming from %s with settings that differ from the run that wrote it:\n- %s", directory,
                       "\n- ".join(changes))


# ----------------------------------------------------------------------------------------------------------------
# Rotation
# ----------------------------------------------------------------------------------------------------------------


def rotate(run_dir: str, save_total_limit: int | None, newest: str, run_id: str, best: str | None = None,
           keep: Iterable[str] = ()) -> list[str]:
    """Delete old checkpoints of run `run_id` once `newest` is complete, keeping at most `save_total_limit` complete
    ones: `newest` always, `best` (the best model checkpoint) always, then the highest-numbered. Only this run's
    folders are considered (`runs.run_of`: another run's, or another trainer's, are never deleted) and only complete
    checkpoints count; an incomplete folder of this run numbered below `newest` (an interrupted write, never resumed
    from) is deleted, one above it (written before the checkpoint this run resumed) is left alone. The folders in
    `keep` (a checkpoint whose Hub upload still reads it) are kept too, counted in the limit. Returns the folders
    deleted."""
    if save_total_limit is None or save_total_limit <= 0 or not is_complete(newest):
        return []
    folders = [path for path in checkpoint_folders(run_dir) if run_of(path)[0] == run_id]
    same = {os.path.abspath(p) for p in (newest, best, *keep) if p}
    complete = [p for p in folders if is_complete(p)]
    keep = [p for p in complete if os.path.abspath(p) in same]
    keep += [p for p in complete if p not in keep][: max(save_total_limit - len(keep), 0)]
    newest_step = int(os.path.basename(os.path.normpath(newest)).rsplit("-", 1)[-1])
    doomed = [p for p in folders if (p in complete and p not in keep)
              or (p not in complete and int(os.path.basename(p).rsplit("-", 1)[-1]) < newest_step)]
    for path in doomed:
        logger.info("Deleting checkpoint %s (save_total_limit=%d).", path, save_total_limit)
        shutil.rmtree(path, ignore_errors=True)
    return doomed
