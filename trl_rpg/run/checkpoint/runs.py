"""One output folder, one run: the `checkpoint-N` folders of an `output_dir` and which run wrote each.

Every run has an id (`run_id`): a fresh `train()` draws a new one; a resumed run keeps the id of the checkpoint it
resumes (the id lives in the trainer state, `trainer_state.json`). The writing marker and the manifest of every
checkpoint record it with the time (`run_of` reads them back). With it:

- a fresh run into an `output_dir` that already holds checkpoints warns, naming them (`warn_if_other_runs`);
- a save into an existing `checkpoint-N` folder empties it first, with a warning when it held another run's files
  (`empty_for_save`): a checkpoint folder holds only what its save wrote;
- rotation deletes only this run's checkpoints, and `resume_from_checkpoint=True` resumes the run that completed a
  checkpoint last (`trl_rpg.run.checkpoint.selection`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any

from ... import _compat
from .layout import MANIFEST_FILE, WRITING_FILE

logger = logging.getLogger(__name__)

#: Where the run id is kept in `TrainerState.stateful_callbacks` (saved in `trainer_state.json`, restored on resume).
RUN_STATE_KEY = "RPGRun"


def checkpoint_folders(output_dir: str) -> list[str]:
    """Every `checkpoint-N` folder under `output_dir` (N in ASCII digits, as a save names it: `checkpoint-²` or
    `checkpoint-٣` are someone else's folders, ignored), newest (highest N) first."""
    if not os.path.isdir(output_dir):
        return []
    prefix = _compat.PREFIX_CHECKPOINT_DIR + "-"
    found = [(int(name[len(prefix):]), os.path.join(output_dir, name)) for name in os.listdir(output_dir)
             if name.startswith(prefix) and _ascii_number(name[len(prefix):])
             and os.path.isdir(os.path.join(output_dir, name))]
    return [path for _, path in sorted(found, reverse=True)]


def _ascii_number(text: str) -> bool:
    """`str.isdigit` also takes `²` (which `int` refuses) and other scripts' digits: only 0-9."""
    return text.isascii() and text.isdigit()


def run_id(stateful_callbacks: dict[str, Any], agree: Callable[[str], str] | None = None) -> str:
    """This run's id, kept in the trainer state: drawn the first time it is asked for in a fresh run (`agree` makes
    every process take the main process's: a collective call), the resumed checkpoint's (restored with
    `trainer_state.json`) after a resume."""
    record = stateful_callbacks.get(RUN_STATE_KEY)
    if not (isinstance(record, dict) and isinstance(record.get("run_id"), str)):
        drawn = uuid.uuid4().hex
        record = stateful_callbacks[RUN_STATE_KEY] = {"run_id": agree(drawn) if agree else drawn}
    return record["run_id"]


def run_of(directory: str, complete_only: bool = False) -> tuple[str | None, float]:
    """The run id and time recorded in `directory`'s manifest (else, unless `complete_only`, its writing marker);
    `(None, 0.0)` when neither records one (another trainer's folder, a damaged file)."""
    records = ((MANIFEST_FILE, "written_at"),) if complete_only else ((MANIFEST_FILE, "written_at"),
                                                                     (WRITING_FILE, "started_at"))
    for name, time_key in records:
        try:
            with open(os.path.join(directory, name)) as f:
                record = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            continue
        if (isinstance(record, dict) and isinstance(record.get("run_id"), str)
                and isinstance(record.get(time_key), (int, float)) and not isinstance(record.get(time_key), bool)):
            return record["run_id"], float(record[time_key])
    return None, 0.0


def folder_names(paths: list[str]) -> str:
    """The folder names of `paths` in step order, for a message (at most 6: the first two and the last three)."""
    names = [os.path.basename(p) for p in sorted(paths, key=lambda p: int(p.rsplit("-", 1)[-1]))]
    return ", ".join(names if len(names) <= 6 else names[:2] + ["..."] + names[-3:])


def warn_if_other_runs(output_dir: str) -> None:
    """A fresh run (not resuming) that will save checkpoints: warn about the checkpoints `output_dir` already holds."""
    folders = checkpoint_folders(output_dir)
    if folders:
        logger.warning(
            "RPGTrainer: output_dir=%r already holds %d checkpoint(s) of another run (%s) and this run does not "
            "resume them. They are that run's: this run's rotation (save_total_limit) deletes only its own "
            "checkpoints and resume_from_checkpoint=True resumes the run that completed a checkpoint last, but a "
            "checkpoint this run writes at the same step replaces the other run's. Pass resume_from_checkpoint=True "
            "to continue that run, or use another output_dir to keep both.", output_dir, len(folders),
            folder_names(folders))


def empty_for_save(directory: str, this_run: str) -> None:
    """Before a save writes `directory`: remove what it holds (an interrupted or earlier write, another run's
    checkpoint, another trainer's files), so that the folder holds only what this save writes. Replacing another
    run's checkpoint, or files of no RPG run, is warned about."""
    if not os.path.isdir(directory):
        return
    owner, _ = run_of(directory)
    if owner != this_run and os.listdir(directory):
        whose = f"a checkpoint of another run (run id {owner})" if owner else "files no RPG run recorded writing"
        logger.warning("RPGTrainer: %s held %s; it is replaced by this run's checkpoint of the same step (a "
                       "checkpoint folder holds only what its save wrote).", directory, whose)
    shutil.rmtree(directory, onerror=_unless_gone)


def _unless_gone(function, path, exc_info) -> None:
    """`shutil.rmtree`'s error handler: a file already gone is fine (with `save_on_each_node` on a disk the nodes
    share, another process may be emptying the same folder); any other error is raised."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


__all__ = ["RUN_STATE_KEY", "checkpoint_folders", "empty_for_save", "folder_names", "run_id", "run_of",
           "warn_if_other_runs"]
