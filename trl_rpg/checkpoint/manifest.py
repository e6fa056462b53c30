"""The manifest, `rpg_checkpoint_complete.json`: the writing marker put first (`begin_checkpoint`), the manifest
written last (`write_manifest`) listing every file with its size and SHA-256, its shape validated when it is read
(`read_manifest`), and a checkpoint verified against it before a run resumes from it (`verify_checkpoint`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .files import file_records, fsync_tree, read_json, write_json_atomic
from .identity import IDENTITY_FIELDS, compare_runs
from .layout import (
    BUFFER_META_FILE,
    BUFFER_TENSORS_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    REFERENCE_FILE,
    STATE_FILE,
    TRAINER_STATE_FILE,
    WRITING_FILE,
    CheckpointError,
    ManifestError,
)
from .runs import empty_for_save

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
    marker removed.
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
    if os.path.exists(os.path.join(directory, WRITING_FILE)):
        os.remove(os.path.join(directory, WRITING_FILE))
    fsync_tree(directory)


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


def check_nothing_unlisted(directory: str, files: dict[str, Any]) -> None:
    """Refuse a file in the checkpoint folder that its manifest does not list: it was added after the checkpoint was
    written (a copy, a sync, an upload into a folder that kept an earlier upload's files), and transformers would
    read it in place of the checkpoint's own (an unlisted model.safetensors is loaded before a listed adapter).
    Hidden files and DeepSpeed folders DeepSpeed does not read are left alone."""
    skipped = _deepspeed_folders_not_read(directory)
    for root, folders, names in os.walk(directory):
        folders[:] = [f for f in folders if not f.startswith(".") and (root != directory or f not in skipped)]
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(root, name), directory)
            if name.startswith(".") or relative in files or relative == MANIFEST_FILE:
                continue
            raise CheckpointError(
                f"{os.path.join(directory, relative)} is not listed in the checkpoint's manifest: it was added after "
                "the checkpoint was written (a copy, a sync, or an upload into a folder that kept an earlier "
                "upload's files), and transformers would read it in place of the checkpoint's own files. Delete it "
                "to resume from this checkpoint.")


def _check_trainer_state(directory: str, manifest: dict[str, Any]) -> None:
    state = read_json(os.path.join(directory, TRAINER_STATE_FILE), "transformers' trainer state")
    step = state.get("global_step") if isinstance(state, dict) else None
    if step != manifest["global_step"]:
        raise CheckpointError(f"{os.path.join(directory, TRAINER_STATE_FILE)} is at step {step}, the checkpoint's "
                              f"manifest at step {manifest['global_step']}: the file belongs to another checkpoint.")


def verify_checkpoint(directory: str, run: dict[str, Any], ranks: Iterable[int] | None = None) -> dict[str, Any]:
    """Check a checkpoint before resuming from it; returns its manifest, or raises a `CheckpointError` naming the
    problem.

    Checks the manifest, that `run` (`run_identity` of the run resuming it) can continue it, and that it holds the
    optimizer; then the files: with `ranks=None` every listed file except other processes' buffers, that the folder
    holds no file the manifest does not list, and the step of `trainer_state.json` (what the main process checks),
    else only the buffer files of `ranks` (what each process checks for the buffers it will load).
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
    if ranks is None:
        check_nothing_unlisted(directory, files)
        _check_trainer_state(directory, manifest)
    return manifest
