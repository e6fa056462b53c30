"""The manifest, `rpg_checkpoint_complete.json`: the writing marker put first (`begin_checkpoint`), the manifest
written last (`write_manifest`) listing every file with its size and SHA-256, its shape validated when it is read
(`read_manifest`), and a checkpoint verified against it before a run resumes from it (`verify_checkpoint`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .files import checked_state, file_records, fsync_folder, fsync_tree, read_json, write_json_atomic
from .identity import IDENTITY_FIELDS, compare_runs
from .layout import (
    BUFFER_META_FILE,
    BUFFER_TENSORS_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    REFERENCE_FILE,
    SCALER_FILE,
    STATE_FILE,
    TRAINER_STATE_FILE,
    WRITING_FILE,
    CheckpointError,
    ManifestError,
)
from .runs import empty_for_save

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------------------


def _listing(directory: str) -> list[str]:
    """Every file under `directory` (relative paths), RPG's markers and temporary files excepted."""
    files = []
    for root, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), directory)
            if relative not in (MANIFEST_FILE, WRITING_FILE) and ".tmp-" not in name:
                files.append(relative)
    return files


def begin_checkpoint(directory: str, step: int, run_id: str) -> None:
    """Empty `directory` (`runs.empty_for_save`: an earlier write's files, an old manifest above all, are never
    certified by this save's manifest) and mark it as being written by run `run_id` (each saving process, before any
    process writes a file), so a crash from here on leaves a folder that says it was interrupted."""
    empty_for_save(directory, run_id)
    os.makedirs(directory, exist_ok=True)
    write_json_atomic(os.path.join(directory, WRITING_FILE),
                      {"step": int(step), "run_id": run_id, "started_at": time.time()})


def write_manifest(directory: str, global_step: int, world_size: int, run: dict[str, Any],
                   reported: Sequence[dict[str, Any]], save_only_model: bool, run_id: str) -> None:
    """The completion marker: written last, by the main process, once every process has written its files; it
    records `run_id` (the run that wrote it, `runs.run_id`) and the time.

    `reported[r]` is what process r's `save_generation_buffer` returned (its files hashed and fsynced by r itself: on
    a cluster whose nodes write to local disks the main process cannot see them). Every other file the main
    process sees is hashed and fsynced here, then the folders, then the manifest is written and the writing
    marker removed. The folder is fsynced after the manifest and again after the marker goes: a crash between the
    two leaves a complete checkpoint with its marker, which resume recognises (`leftover_marker`).
    """
    rank_files = {name: record for own in reported for name, record in own["files"].items()}
    files = file_records(directory, [name for name in _listing(directory) if name not in rank_files])
    files.update(rank_files)
    fsync_tree(directory)
    manifest = {
        "format": FORMAT_VERSION, "run_id": run_id, "written_at": time.time(), "global_step": int(global_step),
        "world_size": int(world_size),
        "steps_per_generation": run["batch"]["steps_per_generation"], "rpg_reference": run["rpg_reference"],
        "save_only_model": bool(save_only_model), "run": run,
        "rank_files": [sorted(own["files"]) for own in reported], "buffer_rows": [own["rows"] for own in reported],
        "buffer_fields": [own["fields"] for own in reported], "files": files,
    }
    write_json_atomic(os.path.join(directory, MANIFEST_FILE), manifest)
    fsync_folder(directory)  # the manifest's name is on disk before the marker's removal can be
    if os.path.exists(os.path.join(directory, WRITING_FILE)):
        os.remove(os.path.join(directory, WRITING_FILE))
    fsync_folder(directory)


# ----------------------------------------------------------------------------------------------------------------
# Reading and validating
# ----------------------------------------------------------------------------------------------------------------


def _expect(manifest: dict, key: str, directory: str, check: Callable[[Any], bool]) -> Any:
    value = manifest.get(key)
    if not check(value):
        raise ManifestError(f"The manifest {os.path.join(directory, MANIFEST_FILE)} is malformed: {key!r} is "
                            f"{str(value)[:200]!r}. It was not written by this trl-rpg version, or was edited; the "
                            "checkpoint cannot be resumed.")
    return value


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _inside(name: Any) -> bool:
    """Whether a manifest's file name names a file inside the checkpoint folder (relative, normalised, no `..`)."""
    return (isinstance(name, str) and name != "" and not os.path.isabs(name) and "\\" not in name
            and os.path.normpath(name) == name and ".." not in name.split("/"))


def validate_manifest(manifest: Any, directory: str) -> dict[str, Any]:
    """`manifest` if it has the shape RPGTrainer writes, else `ManifestError` naming the key."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        found = manifest.get("format", 1) if isinstance(manifest, dict) else "unknown"
        raise CheckpointError(f"{directory} was written by another trl-rpg version (checkpoint format {found}, this "
                              f"version reads format {FORMAT_VERSION}); it cannot be resumed.")
    _expect(manifest, "run_id", directory, lambda v: isinstance(v, str) and v != "")
    _expect(manifest, "written_at", directory, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
    _expect(manifest, "global_step", directory, lambda v: _is_int(v) and v >= 0)
    world = _expect(manifest, "world_size", directory, lambda v: _is_int(v) and v >= 1)
    _expect(manifest, "steps_per_generation", directory, lambda v: _is_int(v) and v >= 1)
    _expect(manifest, "rpg_reference", directory, lambda v: isinstance(v, str))
    _expect(manifest, "save_only_model", directory, lambda v: isinstance(v, bool))
    _expect(manifest, "run", directory, lambda v: isinstance(v, dict) and isinstance(v.get("model"), dict)
            and "rpg_reference" in v and "deepspeed_zero_stage" in v
            and all(isinstance(v.get(g), dict) for g in IDENTITY_FIELDS)
            and {"name", "peft", "parameters", "tensors", "dtypes"} <= set(v["model"]))
    _expect(manifest, "rank_files", directory, lambda v: isinstance(v, list) and len(v) == world and all(
        isinstance(names, list) and all(isinstance(n, str) for n in names) for names in v))
    _expect(manifest, "buffer_rows", directory, lambda v: isinstance(v, list) and len(v) == world and all(
        rows is None or isinstance(rows, list) and all(_is_int(r) and r >= 0 for r in rows) for rows in v))
    _expect(manifest, "buffer_fields", directory, lambda v: isinstance(v, list) and len(v) == world and all(
        isinstance(names, list) and all(isinstance(n, str) for n in names) for names in v))
    files = _expect(manifest, "files", directory, lambda v: isinstance(v, dict) and all(
        isinstance(r, dict) and _is_int(r.get("size")) and isinstance(r.get("sha256"), str) for r in v.values()))
    outside = [name for name in files if not _inside(name)]
    if outside:
        raise ManifestError(f"The manifest {os.path.join(directory, MANIFEST_FILE)} lists a file outside the "
                            f"checkpoint folder ({outside[0]!r}); it was not written by RPGTrainer, or was edited. "
                            "The checkpoint is refused (its files were not read).")
    unlisted = [n for names in manifest["rank_files"] for n in names if n not in files]
    if unlisted:
        raise ManifestError(f"The manifest {os.path.join(directory, MANIFEST_FILE)} is malformed: {unlisted[0]!r} is "
                            "in 'rank_files' but not in 'files'.")
    return manifest


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST_FILE)
    if os.path.islink(path):
        raise ManifestError(f"{path} is a symbolic link; a checkpoint's files must be regular files in its folder.")
    return validate_manifest(read_json(path, "The completion marker"), directory)


# ----------------------------------------------------------------------------------------------------------------
# Verifying a checkpoint's files before resuming
# ----------------------------------------------------------------------------------------------------------------


def _check_file(directory: str, relative: str, record: dict[str, Any]) -> None:
    """A listed file is a regular file inside the folder (no symbolic link on its path), of the recorded size."""
    path = os.path.join(directory, relative)
    parts = relative.split("/")
    for depth in range(1, len(parts) + 1):
        if os.path.islink(os.path.join(directory, *parts[:depth])):
            raise CheckpointError(f"{os.path.join(directory, *parts[:depth])} is a symbolic link; a checkpoint's "
                                  "files must be regular files in its folder (a link can point to another "
                                  "checkpoint's file). Copy the file in place of the link to use this checkpoint.")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete (copied or synced in part?).")
    size = os.path.getsize(path)
    if size != record["size"]:
        raise CheckpointError(f"{path} is {size} bytes, the checkpoint recorded {record['size']}: the file is "
                              "truncated or damaged.")


def required_files(manifest: dict[str, Any]) -> list[str]:
    """The files a manifest must list: transformers' trainer state, RPG's state, the reference snapshot of a moving
    reference, and every process's generation buffer."""
    names = [TRAINER_STATE_FILE, STATE_FILE]
    if manifest["rpg_reference"] in ("periodic", "adaptive"):
        names.append(REFERENCE_FILE)
    for rank in range(manifest["world_size"]):
        names += [BUFFER_TENSORS_FILE.format(rank=rank), BUFFER_META_FILE.format(rank=rank)]
    return names


def _deepspeed_folders_not_read(directory: str) -> set[str]:
    """DeepSpeed's `global_stepN` folders other than the one `latest` names (DeepSpeed reads only that one): e.g. an
    earlier checkpoint's, kept by a Hub folder that each push adds to."""
    try:
        with open(os.path.join(directory, "latest")) as f:
            tag = f.read().strip()
    except (OSError, UnicodeDecodeError):
        tag = None
    return {name for name in os.listdir(directory) if name.startswith("global_step") and name != tag
            and os.path.isdir(os.path.join(directory, name))}


def leftover_marker(directory: str, manifest: dict[str, Any]) -> bool:
    """Whether `directory` still holds its writing marker beside its manifest because the run stopped between writing
    the manifest and removing the marker (`write_manifest`: a crash, a kill, in that moment). The checkpoint is then
    complete (the manifest is written last, once every file is fsynced, and its files are verified against it): it is
    resumed, with a warning naming the window. A marker that records another save than the manifest (another run or
    step: copied in afterwards) raises `CheckpointError` naming it."""
    path = os.path.join(directory, WRITING_FILE)
    if not os.path.lexists(path):
        return False
    try:
        marker = None if os.path.islink(path) else read_json(path, "The writing marker")
    except CheckpointError:
        marker = None
    if not (isinstance(marker, dict) and marker.get("run_id") == manifest["run_id"]
            and marker.get("step") == manifest["global_step"]):
        raise CheckpointError(f"{path} is not this checkpoint's writing marker (it records another save than the "
                              f"manifest's: run {manifest['run_id']}, step {manifest['global_step']}): it was added "
                              "after the checkpoint was written. Delete it to resume from this checkpoint.")
    logger.warning("RPGTrainer: %s still holds its writing marker %s beside its manifest: the run that wrote it "
                   "stopped (a crash or a kill) after writing the manifest and before removing the marker. The "
                   "checkpoint is complete (the manifest is written last) and its files are verified.",
                   directory, WRITING_FILE)
    return True


def check_nothing_unlisted(directory: str, files: dict[str, Any], ignored: Iterable[str] = ()) -> None:
    """Refuse a file in the checkpoint folder that its manifest does not list: it was added after the checkpoint was
    written (a copy, a sync, an upload into a folder that kept an earlier upload's files), and transformers would
    read it in place of the checkpoint's own (an unlisted model.safetensors is loaded before a listed adapter).
    Hidden files, DeepSpeed folders DeepSpeed does not read and the names in `ignored` are left alone."""
    skipped = _deepspeed_folders_not_read(directory)
    ignored = set(ignored)
    for root, folders, names in os.walk(directory):
        folders[:] = [f for f in folders if not f.startswith(".") and (root != directory or f not in skipped)]
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(root, name), directory)
            if name.startswith(".") or relative in files or relative == MANIFEST_FILE or relative in ignored:
                continue
            raise CheckpointError(
                f"{os.path.join(directory, relative)} is not listed in the checkpoint's manifest: it was added after "
                "the checkpoint was written (a copy, a sync, or an upload into a folder that kept an earlier "
                "upload's files), and transformers would read it in place of the checkpoint's own files. Delete it "
                "to resume from this checkpoint.")


#: The fields of transformers' `trainer_state.json` (`TrainerState`) and the JSON values each may hold; a field
#: transformers adds later is taken as it is, a key that is no field of `TrainerState` is refused.
_COUNT, _NUMBER = "an integer >= 0", "a number"
_TRAINER_STATE_FIELDS = {
    "global_step": _COUNT, "max_steps": "an integer", "num_input_tokens_seen": _COUNT, "epoch": _NUMBER,
    "total_flos": _NUMBER, "logging_steps": _NUMBER, "eval_steps": _NUMBER, "save_steps": _NUMBER,
    "num_train_epochs": _NUMBER, "train_batch_size": "an integer or null", "best_global_step": "an integer or null",
    "best_metric": "a number or null", "best_model_checkpoint": "a string or null", "trial_name": "a string or null",
    "is_local_process_zero": "true or false", "is_world_process_zero": "true or false",
    "is_hyper_param_search": "true or false", "trial_params": "an object or null",
    "log_history": "a list of objects", "stateful_callbacks": "an object of objects",
}


def _fits(value: Any, allowed: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        _COUNT: _is_int(value) and value >= 0, "an integer": _is_int(value), _NUMBER: number,
        "an integer or null": value is None or _is_int(value), "a number or null": value is None or number,
        "a string or null": value is None or isinstance(value, str), "true or false": isinstance(value, bool),
        "an object or null": value is None or isinstance(value, dict),
        "a list of objects": isinstance(value, list) and all(isinstance(v, dict) for v in value),
        "an object of objects": isinstance(value, dict) and all(
            isinstance(v, dict) or isinstance(v, list) and all(isinstance(x, dict) for x in v)
            for v in value.values()),
    }[allowed]


def _check_trainer_state(directory: str, manifest: dict[str, Any]) -> None:
    """`trainer_state.json` holds what transformers' `TrainerState` reads (each field of the JSON type it writes) and
    is at the manifest's step; else `CheckpointError` naming the file and the field."""
    from transformers.trainer_callback import TrainerState  # lazy: verified only where a trainer resumes

    path = os.path.join(directory, TRAINER_STATE_FILE)
    state = read_json(path, "transformers' trainer state")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is damaged: it holds a {type(state).__name__}, not transformers' trainer "
                              "state (an object).")
    known = {f.name for f in dataclasses.fields(TrainerState)}
    for key, value in state.items():
        allowed = _TRAINER_STATE_FIELDS.get(key)
        if key not in known or allowed is not None and not _fits(value, allowed):
            why = "is no field of transformers' TrainerState" if key not in known else f"is not {allowed}"
            raise CheckpointError(f"{path} is damaged: {key!r} ({value!r:.100}) {why}.")
    step = state.get("global_step")
    if step != manifest["global_step"]:
        raise CheckpointError(f"{path} is at step {step}, the checkpoint's manifest at step "
                              f"{manifest['global_step']}: the file belongs to another checkpoint.")


def _check_contents(directory: str, names: Iterable[str]) -> None:
    """Every listed JSON file parses (not truncated, not nested too deep), and `rpg_state.json` holds what RPG
    writes: `CheckpointError` naming the file otherwise (the sizes and checksums say only that the files are the ones
    written; these say they can be read)."""
    for name in names:
        if name.endswith(".json"):
            value = read_json(os.path.join(directory, name), f"The checkpoint file {name}")
            if name == STATE_FILE:
                checked_state(value, os.path.join(directory, name))


def check_scaler(directory: str, files: dict[str, Any], run: dict[str, Any]) -> None:
    """Refuse a checkpoint that holds an fp16 gradient scaler's state (`scaler.pt`) when the resuming run has no
    scaler (`run["grad_scaler"]` False: fp16 off, or DeepSpeed scaling the loss itself): transformers would call
    `load_state_dict` on the missing scaler (an `AttributeError`)."""
    if SCALER_FILE in files and run.get("grad_scaler") is False:
        raise CheckpointError(
            f"{os.path.join(directory, SCALER_FILE)} holds the gradient scaler of a run trained in fp16, and this run "
            "has none (fp16 is off, or DeepSpeed scales the loss itself): the checkpoint's scaler state cannot be "
            "restored. Resume with fp16=True as the run that wrote it, or start a new run from its weights "
            f"(model={directory!r}, without resume_from_checkpoint).")


def verify_checkpoint(directory: str, run: dict[str, Any], ranks: Iterable[int] | None = None) -> dict[str, Any]:
    """Check a checkpoint before resuming from it; returns its manifest, or raises a `CheckpointError` naming the
    problem.

    Checks the manifest, that `run` (`run_identity` of the run resuming it) can continue it, and that it holds the
    optimizer (and, if it holds an fp16 scaler's state, that `run` has a scaler); then the files: with `ranks=None`
    every listed file except other processes' buffers, that the folder holds no file the manifest does not list
    (the writing marker of a crash right after the manifest excepted: `leftover_marker`), and the fields and step of
    `trainer_state.json` (what the main process checks), else only the buffer files of `ranks` (what each process
    checks for the buffers it will load). Every JSON file checked is parsed, `rpg_state.json`'s values checked.
    """
    manifest = read_manifest(directory)
    compare_runs(directory, manifest["run"], run)
    if manifest["save_only_model"]:
        raise CheckpointError(
            f"{directory} was written with save_only_model=True: it holds the model weights but no optimizer, "
            "scheduler or RNG state, so the run cannot continue where it stopped (the learning rate would restart "
            "its schedule, Adam its moments). Resume from a checkpoint written with save_only_model=False, or start a "
            f"new run from its weights (model={directory!r}, without resume_from_checkpoint).")
    files = manifest["files"]
    check_scaler(directory, files, run)
    for name in required_files(manifest):
        if name not in files:
            raise CheckpointError(f"{os.path.join(directory, name)} is not listed in the completion marker: the "
                                  "checkpoint is incomplete.")
    rank_files = {name for names in manifest["rank_files"] for name in names}
    if ranks is None:
        selected = [name for name in files if name not in rank_files]
    else:
        selected = [name for rank in ranks for name in manifest["rank_files"][rank]]
    for name in sorted(selected):
        _check_file(directory, name, files[name])
    digests = file_records(directory, selected)  # several files at a time
    for name in sorted(selected):
        if digests[name]["sha256"] != files[name]["sha256"]:
            raise CheckpointError(f"{os.path.join(directory, name)} does not match the checksum recorded in the "
                                  "checkpoint: the file is damaged or was changed after the checkpoint was written.")
    _check_contents(directory, sorted(selected))
    if ranks is None:
        crashed = leftover_marker(directory, manifest)  # a crash between the manifest and the marker's removal
        check_nothing_unlisted(directory, files, ignored=[WRITING_FILE] if crashed else [])
        _check_trainer_state(directory, manifest)
    return manifest
