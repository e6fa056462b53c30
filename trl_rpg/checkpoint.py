"""RPG checkpoints: what a checkpoint holds beyond TRL's, how it is written, and how resume verifies it.

A `checkpoint-N` folder written by `RPGTrainer` holds, next to what `Trainer`/`GRPOTrainer` write (weights,
optimizer, scheduler, RNG states, `trainer_state.json`):

- `rpg_state.json`: the reference policy's state (version, updates, moving average) and the skipped-step count;
- `rpg_reference.safetensors`: the moving reference (`rpg_reference="periodic"` or `"adaptive"`), full tensors;
- `rpg_generation_buffer_rank{R}.safetensors` and `.json`: process R's buffered generation batch (tensors; the
  rest as JSON) and its micro-step counter. Nothing is unpickled on resume, so a checkpoint from someone else
  cannot run code;
- `rpg_checkpoint_writing.json` while the checkpoint is being written (written first, removed last);
- `rpg_checkpoint_complete.json`, the manifest, written last (atomically) once every process has written and
  fsynced its files: the format version, step, number of processes, what identifies the run (`run_identity`), the
  buffered batch's layout, and every file of the checkpoint with its size and SHA-256.

Resume (`choose`) verifies, on every process, before transformers reads anything: the manifest's shape; that the run
resuming it is the run that wrote it (`compare_runs`: a changed model, PEFT setup or reference schedule is refused,
other changed settings are named in a warning); that the checkpoint holds the optimizer (not `save_only_model`);
that every listed file is a regular file inside the folder (no symbolic link, no `..`) with its size and SHA-256;
and that `trainer_state.json` is at the manifest's step. A checkpoint that fails is refused naming the file, or,
with `resume_from_checkpoint=True`, passed over for the previous one; when none passes, the error names each
candidate and why.

Rotation (`rotate`) runs only after a manifest is written, never deletes the checkpoint just completed, and counts
only complete checkpoints.

The ZeRO-3 helpers at the end gather, copy and scatter partitioned parameters a bounded group at a time; the
reference snapshot and the reference update use them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import _compat
from .batch import merge_rows, num_rows, to_device, unknown_fields

logger = logging.getLogger(__name__)

MANIFEST_FILE = "rpg_checkpoint_complete.json"
WRITING_FILE = "rpg_checkpoint_writing.json"
STATE_FILE = "rpg_state.json"
REFERENCE_FILE = "rpg_reference.safetensors"
BUFFER_TENSORS_FILE = "rpg_generation_buffer_rank{rank}.safetensors"
BUFFER_META_FILE = "rpg_generation_buffer_rank{rank}.json"
TRAINER_STATE_FILE = "trainer_state.json"
#: Version of the layout above. 1: trl-rpg 0.1 (pickled buffers, no file list); 2: sizes, SHA-256 for RPG's files
#: only, no run identity.
FORMAT_VERSION = 3
#: Threads hashing a checkpoint's files (hashlib releases the GIL: files are hashed in parallel).
HASH_THREADS = min(8, os.cpu_count() or 1)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: incomplete, damaged, or written for another setup."""


class NoSuchCheckpoint(CheckpointError):
    """The path given to resume from does not exist (or `output_dir` holds no checkpoint)."""


class NotAnRPGCheckpoint(CheckpointError):
    """A folder that RPGTrainer did not write (e.g. a `GRPOTrainer` or `Trainer` checkpoint)."""


class IncompleteCheckpoint(CheckpointError):
    """A checkpoint whose write was interrupted: it has no manifest."""


class ManifestError(CheckpointError):
    """A manifest that is not one RPGTrainer writes: a missing or mistyped key, a file name outside the folder."""


class ScheduleMismatch(CheckpointError):
    """A checkpoint written with another reference schedule than the run resuming it."""


class RunMismatch(CheckpointError):
    """A checkpoint written by a run whose model cannot take its weights and optimizer (other model, PEFT setup)."""


#: Errors that are refused at once even with `resume_from_checkpoint=True` (the newest checkpoint is another run's:
#: resuming an older one instead would silently pick a checkpoint the user did not mean).
REFUSED_AT_ONCE = (ScheduleMismatch, RunMismatch)
_ERRORS = {cls.__name__: cls for cls in (CheckpointError, NoSuchCheckpoint, NotAnRPGCheckpoint, IncompleteCheckpoint,
                                         ManifestError, ScheduleMismatch, RunMismatch)}


class CheckpointDiskFull(OSError):
    """The disk filled up while a checkpoint was written (the checkpoint is left incomplete, the earlier ones kept)."""


# ----------------------------------------------------------------------------------------------------------------
# Files: hashed and fsynced in one read
# ----------------------------------------------------------------------------------------------------------------


def file_record(path: str) -> dict[str, Any]:
    """`{"size": bytes, "sha256": hex}` of a file, read once; the file is fsynced on the way (its data is on disk
    before the manifest that lists it)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
            size += len(block)
        os.fsync(f.fileno())
    return {"size": size, "sha256": digest.hexdigest()}


def file_records(directory: str, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`file_record` of each `directory/name`, several files at a time."""
    names = sorted(names)
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        records = pool.map(lambda name: file_record(os.path.join(directory, name)), names)
        return dict(zip(names, records))


def fsync_tree(directory: str) -> None:
    """fsync `directory` and every folder under it (their entries: the files' names)."""
    for root, _, _ in os.walk(directory):
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON to `path` so that a crash leaves either the old file or the whole new one."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str, what: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{what} is missing: {path}.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{what} is damaged and cannot be read: {path} ({error}).") from None


def _listing(directory: str) -> list[str]:
    """Every file under `directory` (relative paths), RPG's markers and temporary files excepted."""
    files = []
    for root, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), directory)
            if relative not in (MANIFEST_FILE, WRITING_FILE) and ".tmp-" not in name:
                files.append(relative)
    return files


def _free_bytes(path: str) -> int:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return shutil.disk_usage(path).free


#: Below this much free space, a failed write is taken for a full disk.
DISK_FULL_BYTES = 64 << 20


@contextmanager
def explain_disk_full(directory: str) -> Iterator[None]:
    """Within the block, a write failing because the disk is full (`ENOSPC`, or torch's `unexpected pos` with no
    space left) raises `CheckpointDiskFull` saying so and where. The checkpoint stays without a manifest, so it is
    never resumed from; nothing else is deleted."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        full = (getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error)
                or _free_bytes(directory) < DISK_FULL_BYTES)
        if not full or isinstance(error, CheckpointDiskFull):
            raise
        raise CheckpointDiskFull(
            errno.ENOSPC, f"The disk holding {directory} is full ({_free_bytes(directory)} bytes free) while writing "
            f"this checkpoint ({type(error).__name__}: {error}). The checkpoint is left incomplete (no "
            f"{MANIFEST_FILE}), so it will never be resumed from; the earlier checkpoints are untouched. Free some "
            "space (or lower save_total_limit), then resume with resume_from_checkpoint=True.") from error


def begin_checkpoint(directory: str, step: int) -> None:
    """Mark `directory` as being written (main process, before any file): a stale manifest is removed, so a crash
    from here on leaves a folder that says it was interrupted."""
    os.makedirs(directory, exist_ok=True)
    if os.path.lexists(os.path.join(directory, MANIFEST_FILE)):
        os.remove(os.path.join(directory, MANIFEST_FILE))
    write_json_atomic(os.path.join(directory, WRITING_FILE), {"step": int(step)})


# ----------------------------------------------------------------------------------------------------------------
# The generation buffer of one process: tensors in safetensors, everything else in JSON
# ----------------------------------------------------------------------------------------------------------------


def _json_value(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, where) for v in value]
    raise CheckpointError(f"Cannot store {where} (a {type(value).__name__}) in a checkpoint: only tensors and JSON "
                          "values are stored. Set rpg_save_generation_buffer=False to checkpoint without the buffer.")


def save_generation_buffer(directory: str, rank: int, step: int, buffer: Sequence[dict] | None) -> dict[str, Any]:
    """Write process `rank`'s buffered generation batch (None: none) and micro-step counter. Returns what the
    manifest records of it: `files` (name -> size and SHA-256, fsynced), `rows` (rows of each buffered micro-batch)
    and `fields` (the fields whose rows cannot be regrouped, e.g. multimodal inputs)."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    fields: list[dict[str, Any]] = []
    for index, chunk in enumerate(buffer or []):
        layout = {}
        for key, value in chunk.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}/{key}"] = value.detach().to("cpu").contiguous().clone()
                layout[key] = {"tensor": f"{index}/{key}"}
            else:
                layout[key] = {"json": _json_value(value, f"the generation-batch field {key!r}")}
        fields.append(layout)
    meta = {"format": FORMAT_VERSION, "step": int(step), "buffer": None if buffer is None else fields,
            "rows": None if buffer is None else [num_rows(chunk) for chunk in buffer]}
    names = [BUFFER_TENSORS_FILE.format(rank=rank), BUFFER_META_FILE.format(rank=rank)]
    save_file(tensors, os.path.join(directory, names[0]))
    write_json_atomic(os.path.join(directory, names[1]), meta)
    unsplittable = sorted({key for chunk in buffer or [] for key in unknown_fields(chunk)})
    return {"files": file_records(directory, names), "rows": meta["rows"], "fields": unsplittable}


def load_generation_buffer(directory: str, rank: int) -> tuple[int, list[dict] | None]:
    """Process `rank`'s saved micro-step counter and buffered generation batch (tensors on the CPU)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta_path = os.path.join(directory, BUFFER_META_FILE.format(rank=rank))
    tensor_path = os.path.join(directory, BUFFER_TENSORS_FILE.format(rank=rank))
    meta = read_json(meta_path, f"The generation buffer of process {rank}")
    try:
        tensors = load_file(tensor_path)
    except FileNotFoundError:
        raise CheckpointError(f"The generation buffer of process {rank} is missing: {tensor_path}.") from None
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"The generation buffer of process {rank} is damaged and cannot be read: "
                              f"{tensor_path} ({error}).") from None
    try:
        buffer = None
        if meta["buffer"] is not None:
            buffer = [{key: tensors[spec["tensor"]] if "tensor" in spec else spec["json"]
                       for key, spec in layout.items()} for layout in meta["buffer"]]
        return int(meta["step"]), buffer
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"The generation buffer of process {rank} does not match its description "
                              f"{meta_path} ({type(error).__name__}: {error}).") from None


# ----------------------------------------------------------------------------------------------------------------
# RPG state and the reference snapshot
# ----------------------------------------------------------------------------------------------------------------


def save_state(directory: str, state: dict[str, Any]) -> None:
    write_json_atomic(os.path.join(directory, STATE_FILE), state)


def load_state(directory: str) -> dict[str, Any]:
    return read_json(os.path.join(directory, STATE_FILE), "The RPG state file")


def save_reference(directory: str, named_tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in named_tensors.items()}, os.path.join(directory, REFERENCE_FILE))


def load_reference(directory: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = os.path.join(directory, REFERENCE_FILE)
    try:
        return load_file(path)
    except FileNotFoundError:
        raise CheckpointError(f"The reference snapshot is missing: {path}.") from None
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"The reference snapshot is damaged and cannot be read: {path} ({error}).") from None


# ----------------------------------------------------------------------------------------------------------------
# What identifies a run
# ----------------------------------------------------------------------------------------------------------------

#: RPGConfig fields recorded in the manifest, by what they decide. `model` (the base model's name, the PEFT type, a
#: fingerprint of the parameter names and shapes) and `rpg_reference` are refused when they differ; the rest warned.
IDENTITY_FIELDS = {
    "objective": ("rpg_divergence", "rpg_estimator", "beta", "rpg_dual_clip_c", "epsilon", "epsilon_high",
                  "loss_type", "importance_sampling_level", "scale_rewards", "reward_weights",
                  "rpg_reference_update_steps", "rpg_reference_kl_target", "rpg_reference_kl_decay",
                  "top_entropy_quantile", "mask_truncated_completions", "temperature", "max_completion_length"),
    "batch": ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
              "steps_per_generation", "num_iterations"),
    "schedule": ("learning_rate", "lr_scheduler_type", "warmup_steps", "warmup_ratio", "max_steps",
                 "num_train_epochs", "weight_decay", "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "seed"),
}
#: Settings the restored optimizer and scheduler keep from the checkpoint: a new value is ignored.
RESTORED_WITH_OPTIMIZER = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")


def _plain(value: Any) -> Any:
    """`value` as the manifest stores it (JSON), so a recorded and a current value compare alike."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def run_identity(args, model: nn.Module) -> dict[str, Any]:
    """What identifies the run that writes or resumes a checkpoint: the model (base name, PEFT type, parameter
    fingerprint), the reference schedule, and the objective, batch layout and schedule fields of `args`."""
    shapes = [f"{name}:{tuple(getattr(p, 'ds_shape', p.shape))}" for name, p in model.named_parameters()]
    peft = getattr(model, "peft_config", None)
    identity = {
        "model": {"name": getattr(getattr(model, "config", None), "_name_or_path", None),
                  "peft": sorted({str(getattr(c, "peft_type", c)).split(".")[-1] for c in peft.values()})
                  if isinstance(peft, dict) else None,
                  "parameters": hashlib.sha256("\n".join(shapes).encode()).hexdigest(), "tensors": len(shapes)},
        "rpg_reference": args.rpg_reference,
    }
    for group, names in IDENTITY_FIELDS.items():
        identity[group] = {name: _plain(getattr(args, name, None)) for name in names}
    return identity


def compare_runs(directory: str, saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Compare the run that wrote `directory` with the one resuming it: raise `ScheduleMismatch` / `RunMismatch` for
    what cannot work; return a description of each other setting that differs (for a warning)."""
    if saved["rpg_reference"] != current["rpg_reference"]:
        raise ScheduleMismatch(
            f"{directory} was written with rpg_reference={saved['rpg_reference']!r}; this run has "
            f"rpg_reference={current['rpg_reference']!r}. The reference state of one schedule cannot continue "
            f"another: resume with rpg_reference={saved['rpg_reference']!r}, or start a new run from the saved model "
            "weights.")
    old, new = saved["model"], current["model"]
    if bool(old["peft"]) != bool(new["peft"]):
        kind = {True: f"a PEFT ({', '.join(old['peft'] or new['peft'])}) adapter", False: "the full model"}
        raise RunMismatch(
            f"{directory} was written by a run that trains {kind[bool(old['peft'])]}; this run trains "
            f"{kind[bool(new['peft'])]} (peft_config {'given' if new['peft'] else 'not given'}). Its weights and "
            "optimizer state do not fit this model: resume with the same peft_config as the run that wrote it.")
    if old["parameters"] != new["parameters"]:
        raise RunMismatch(
            f"{directory} was written for another model: {old['tensors']} parameter tensors of model "
            f"{old['name']!r}, this run has {new['tensors']} of model {new['name']!r} (names or shapes differ). Its "
            "weights and optimizer state do not fit: resume with the model (and peft_config) that wrote it, or use "
            "another output_dir.")
    changes = []
    if old["name"] != new["name"]:
        changes.append(f"model {old['name']!r} -> {new['name']!r} (same parameter names and shapes)")
    for group in IDENTITY_FIELDS:
        for name, value in current[group].items():
            if name in saved[group] and saved[group][name] != value:
                effect = ("ignored: the optimizer and scheduler restored from the checkpoint keep the checkpoint's "
                          "value" if name in RESTORED_WITH_OPTIMIZER else f"the {group} changes from this step on")
                changes.append(f"{name} {saved[group][name]!r} -> {value!r} ({effect})")
    return changes


# ----------------------------------------------------------------------------------------------------------------
# The manifest
# ----------------------------------------------------------------------------------------------------------------


def write_manifest(directory: str, global_step: int, world_size: int, run: dict[str, Any],
                   reported: Sequence[dict[str, Any]], save_only_model: bool) -> None:
    """The completion marker: written last, by the main process, once every process has written its files.

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
        "format": FORMAT_VERSION, "global_step": int(global_step), "world_size": int(world_size),
        "steps_per_generation": run["batch"]["steps_per_generation"], "rpg_reference": run["rpg_reference"],
        "save_only_model": bool(save_only_model), "run": run,
        "rank_files": [sorted(own["files"]) for own in reported], "buffer_rows": [own["rows"] for own in reported],
        "buffer_fields": [own["fields"] for own in reported], "files": files,
    }
    write_json_atomic(os.path.join(directory, MANIFEST_FILE), manifest)
    if os.path.exists(os.path.join(directory, WRITING_FILE)):
        os.remove(os.path.join(directory, WRITING_FILE))
    fsync_tree(directory)


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
    _expect(manifest, "global_step", directory, lambda v: _is_int(v) and v >= 0)
    world = _expect(manifest, "world_size", directory, lambda v: _is_int(v) and v >= 1)
    _expect(manifest, "steps_per_generation", directory, lambda v: _is_int(v) and v >= 1)
    _expect(manifest, "rpg_reference", directory, lambda v: isinstance(v, str))
    _expect(manifest, "save_only_model", directory, lambda v: isinstance(v, bool))
    _expect(manifest, "run", directory, lambda v: isinstance(v, dict) and isinstance(v.get("model"), dict)
            and "rpg_reference" in v
            and all(isinstance(v.get(g), dict) for g in IDENTITY_FIELDS)
            and {"name", "peft", "parameters", "tensors"} <= set(v["model"]))
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
    optimizer; then the files: with `ranks=None` every listed file except other processes' buffers, and the step of
    `trainer_state.json` (what the main process checks), else only the buffer files of `ranks` (what each process
    checks for the buffers it will load).
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
        _check_trainer_state(directory, manifest)
    return manifest


# ----------------------------------------------------------------------------------------------------------------
# Which checkpoint to resume from
# ----------------------------------------------------------------------------------------------------------------


def checkpoint_folders(output_dir: str) -> list[str]:
    """Every `checkpoint-N` folder under `output_dir`, newest (highest N) first."""
    if not os.path.isdir(output_dir):
        return []
    prefix = _compat.PREFIX_CHECKPOINT_DIR + "-"
    found = [(int(name[len(prefix):]), os.path.join(output_dir, name)) for name in os.listdir(output_dir)
             if name.startswith(prefix) and name[len(prefix):].isdigit()
             and os.path.isdir(os.path.join(output_dir, name))]
    return [path for _, path in sorted(found, reverse=True)]


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


def choose(request: str | bool, output_dir: str, verify: Callable[[str], dict[str, Any]],
           agree: Callable[[Any], list]) -> tuple[str, dict[str, Any]]:
    """The checkpoint to resume from and its manifest.

    `request` is a path (refused if it fails) or `True`: every `checkpoint-N` of `output_dir`, newest first, each
    that fails passed over with a warning, except a checkpoint of another run (`REFUSED_AT_ONCE`), refused. `verify`
    is this process's share of the checks (`verify_for_process`); `agree` gathers one value from every process, so
    every process takes the same decision and raises the same error. When none passes, the error names each
    candidate and why it failed.
    """
    candidates = [str(request)] if request is not True else checkpoint_folders(output_dir)
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


def rotate(run_dir: str, save_total_limit: int | None, newest: str, best: str | None = None) -> list[str]:
    """Delete old checkpoints once `newest` is complete, keeping at most `save_total_limit` complete ones: `newest`
    always, `best` (the best model checkpoint) always, then the highest-numbered. Only complete checkpoints count;
    an incomplete folder numbered below `newest` (an interrupted write, never resumed from) is deleted, one above it
    (e.g. another run's) is left alone. Returns the folders deleted."""
    if save_total_limit is None or save_total_limit <= 0 or not is_complete(newest):
        return []
    folders = checkpoint_folders(run_dir)
    same = {os.path.abspath(p) for p in (newest, best) if p}
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


# ----------------------------------------------------------------------------------------------------------------
# Restoring the generation buffers, possibly on another number of processes
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BufferPlan:
    """How this run restores the buffered generation batch: `"own"` (each process its own file), `"redistribute"`
    (every process reads all old files and takes its share of each micro-batch), `"drop"` (regenerate), with why."""

    action: str
    reason: str = ""


def plan_buffer_restore(manifest: dict[str, Any], world_size: int, steps_per_generation: int) -> BufferPlan:
    """Decide from the manifest (the same on every process) how to restore the buffers.

    Same number of processes and micro-batches per generation batch: each process restores its own. Another number
    of processes: the rows of each global micro-batch are split evenly over the new processes (every optimizer step
    sees the same rows as in the uninterrupted run), when they divide evenly and every field is one `trl_rpg.batch`
    can regroup by row. Otherwise (e.g. multimodal fields: `num_images` lists, patch-indexed `pixel_values`) the
    batch is regenerated.
    """
    old_world, saved_rows = manifest["world_size"], manifest["buffer_rows"]
    if all(rows is None for rows in saved_rows):
        return BufferPlan("none")
    if manifest["steps_per_generation"] != steps_per_generation:
        return BufferPlan("drop", f"steps_per_generation changed from {manifest['steps_per_generation']} to "
                                  f"{steps_per_generation}")
    if old_world == world_size:
        return BufferPlan("own")
    if any(rows is None or len(rows) != steps_per_generation for rows in saved_rows):
        return BufferPlan("drop", "not every process had a buffered batch")
    fields = sorted({name for names in manifest.get("buffer_fields", []) for name in names})
    if fields:
        return BufferPlan("drop", f"{old_world} -> {world_size} processes, and the fields {', '.join(fields)} cannot "
                                  "be split by sample")
    per_step = [sum(rows[k] for rows in saved_rows) for k in range(steps_per_generation)]
    if any(total % world_size for total in per_step):
        return BufferPlan("drop", f"micro-batches of {per_step[0]} rows cannot be split evenly over {world_size} "
                                  "processes")
    return BufferPlan("redistribute", f"{old_world} -> {world_size} processes")


def redistribute(buffers: Sequence[Sequence[dict]], world_size: int, rank: int, pad_token_id: int) -> list[dict]:
    """Process `rank`'s share of the buffers written by all old processes (`buffers[old_rank][micro_step]`): for each
    micro-step, the old processes' rows in rank order, re-padded, cut into `world_size` equal parts."""
    out = []
    for step_parts in zip(*buffers, strict=True):
        merged = merge_rows(list(step_parts), pad_token_id)
        share = num_rows(merged) // world_size
        rows = slice(rank * share, (rank + 1) * share)
        out.append({k: (v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 and k != "num_items_in_batch"
                        else v) for k, v in merged.items()})
    return out


def buffer_ranks_needed(plan: BufferPlan, manifest: dict[str, Any], rank: int) -> list[int]:
    """The old processes whose buffer files process `rank` reads under `plan`."""
    if plan.action == "redistribute":
        return list(range(manifest["world_size"]))
    return [rank if rank < manifest["world_size"] else 0]


def restore_buffers(directory: str, world_size: int, steps_per_generation: int, rank: int, pad_token_id: int,
                    device) -> tuple[int, list[dict] | None]:
    """The micro-step counter and buffered generation batch this process continues with (the checkpoint was
    verified: `choose`)."""
    manifest = read_manifest(directory)
    plan = plan_buffer_restore(manifest, world_size, steps_per_generation)
    if plan.action == "redistribute":
        loaded = [load_generation_buffer(directory, r) for r in buffer_ranks_needed(plan, manifest, rank)]
        logger.warning("Resuming from %s on %d processes (written by %d): each buffered micro-batch is split over "
                       "the new processes.", directory, world_size, manifest["world_size"])
        return loaded[0][0], to_device(redistribute([b for _, b in loaded], world_size, rank, pad_token_id), device)
    (old_rank,) = buffer_ranks_needed(plan, manifest, rank)
    step, buffer = load_generation_buffer(directory, old_rank)
    if plan.action == "own":
        return step, to_device(buffer, device)
    if plan.action == "drop":
        logger.warning("Resuming from %s: the buffered generation batch is regenerated (%s).", directory, plan.reason)
    return step, None


# ----------------------------------------------------------------------------------------------------------------
# ZeRO-3: gather, copy and scatter partitioned parameters a bounded group at a time
# ----------------------------------------------------------------------------------------------------------------

#: Elements gathered at once when ZeRO-3 parameters are copied, saved or restored: the transient full-size memory
#: of a reference update or a checkpoint is bounded by this, not by the size of the model.
ZERO3_GATHER_NUMEL = 50_000_000


def _is_zero3(p) -> bool:
    return hasattr(p, "ds_id")


def _full_numel(p) -> int:
    return p.ds_numel if _is_zero3(p) else p.numel()


def _groups(items, numel):
    """Consecutive groups of `items` holding at most ZERO3_GATHER_NUMEL elements (at least one item each)."""
    group, size = [], 0
    for item in items:
        n = numel(item)
        if group and size + n > ZERO3_GATHER_NUMEL:
            yield group
            group, size = [], 0
        group.append(item)
        size += n
    if group:
        yield group


def copy_parameters(source: Iterable[nn.Parameter], target: Iterable[nn.Parameter]) -> None:
    """target <- source, parameter by parameter. ZeRO-3: gathered a bounded group at a time (a collective call),
    copied on rank 0 and re-partitioned from it."""
    pairs = list(zip(source, target, strict=True))
    if not any(_is_zero3(p) for pair in pairs for p in pair):
        with torch.no_grad():
            for s, t in pairs:
                t.data.copy_(s.data)
        return
    import deepspeed

    rank0 = deepspeed.comm.get_rank() == 0
    for group in _groups(pairs, lambda pair: _full_numel(pair[0]) + _full_numel(pair[1])):
        with deepspeed.zero.GatheredParameters([p for pair in group for p in pair], modifier_rank=0), \
                torch.no_grad():
            for s, t in group:
                if rank0 or not _is_zero3(t):
                    t.data.copy_(s.data)


def gather_to_cpu(params: Sequence[nn.Parameter], keep: bool = True) -> list[torch.Tensor] | None:
    """Full CPU copies of `params`, or None where `keep` is False. ZeRO-3 parameters are gathered a bounded group at
    a time, on every rank (a collective call); only ranks that keep the result copy it to the CPU."""
    if not any(_is_zero3(p) for p in params):
        return [p.data.detach().cpu().clone() for p in params] if keep else None
    import deepspeed

    tensors = []
    for group in _groups(params, _full_numel):
        with deepspeed.zero.GatheredParameters(group):
            if keep:
                tensors.extend(p.data.detach().cpu().clone() for p in group)
    return tensors if keep else None


def scatter_from_cpu(params: Sequence[nn.Parameter], tensors: Sequence[torch.Tensor]) -> None:
    """params <- tensors (full CPU copies), re-partitioned under ZeRO-3."""
    if len(params) != len(tensors):
        raise CheckpointError(f"The reference snapshot has {len(tensors)} tensors but the reference has "
                              f"{len(params)} parameters; was the checkpoint written with another model or PEFT "
                              "config?")
    for p, t in zip(params, tensors):
        if math.prod(t.shape) != _full_numel(p):
            raise CheckpointError(f"A reference snapshot tensor of shape {tuple(t.shape)} does not fit a parameter "
                                  f"of {_full_numel(p)} elements; was the checkpoint written with another model?")
    if not any(_is_zero3(p) for p in params):
        with torch.no_grad():
            for p, t in zip(params, tensors):
                p.data.copy_(t.to(p.device, p.dtype))
        return
    import deepspeed

    rank0 = deepspeed.comm.get_rank() == 0
    for group in _groups(list(zip(params, tensors)), lambda pair: _full_numel(pair[0])):
        with deepspeed.zero.GatheredParameters([p for p, _ in group], modifier_rank=0), torch.no_grad():
            for p, t in group:
                if rank0 or not _is_zero3(p):
                    p.data.copy_(t.to(p.device, p.dtype))


__all__ = [
    "MANIFEST_FILE",
    "REFERENCE_FILE",
    "STATE_FILE",
    "ZERO3_GATHER_NUMEL",
    "BufferPlan",
    "CheckpointDiskFull",
    "CheckpointError",
    "IncompleteCheckpoint",
    "ManifestError",
    "NoSuchCheckpoint",
    "NotAnRPGCheckpoint",
    "RunMismatch",
    "ScheduleMismatch",
    "WRITING_FILE",
    "begin_checkpoint",
    "buffer_ranks_needed",
    "choose",
    "compare_runs",
    "copy_parameters",
    "explain_disk_full",
    "gather_to_cpu",
    "last_complete_checkpoint",
    "load_generation_buffer",
    "load_reference",
    "load_state",
    "plan_buffer_restore",
    "read_manifest",
    "redistribute",
    "restore_buffers",
    "resume_checkpoint",
    "rotate",
    "run_identity",
    "save_generation_buffer",
    "save_reference",
    "save_state",
    "scatter_from_cpu",
    "verify_checkpoint",
    "write_manifest",
]
