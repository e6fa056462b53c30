"""RPG checkpoints: what a checkpoint holds beyond TRL's, how it is written, and how resume verifies it.

A `checkpoint-N` folder written by `RPGTrainer` holds, next to what `Trainer`/`GRPOTrainer` write (weights,
optimizer, scheduler, RNG states, `trainer_state.json`):

- `rpg_state.json`: the reference policy's state (version, updates, moving average) and the skipped-step count;
- `rpg_reference.safetensors`: the moving reference (`rpg_reference="periodic"` or `"adaptive"`), full tensors;
- `rpg_generation_buffer_rank{R}.safetensors` and `.json`: process R's buffered generation batch (tensors; the
  rest as JSON) and its micro-step counter. Nothing is unpickled on resume, so a checkpoint from someone else
  cannot run code;
- `rpg_checkpoint_complete.json`, the manifest, written last (atomically) once every process has finished: the
  format version, step, number of processes, reference schedule, batch layout, and every file of the checkpoint
  with its size (and a SHA-256 for RPG's own small files).

A folder without a readable manifest was interrupted while being written and is never resumed from. Resume verifies
the manifest against the folder (every listed file present with its size, RPG files intact, the same reference
schedule) and refuses with an error naming the file, or, with `resume_from_checkpoint=True`, falls back to the
previous complete checkpoint with a warning.

The ZeRO-3 helpers at the end gather, copy and scatter partitioned parameters a bounded group at a time; the
reference snapshot and the reference update use them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import _compat
from .batch import merge_rows, num_rows, to_device

logger = logging.getLogger(__name__)

MANIFEST_FILE = "rpg_checkpoint_complete.json"
STATE_FILE = "rpg_state.json"
REFERENCE_FILE = "rpg_reference.safetensors"
BUFFER_TENSORS_FILE = "rpg_generation_buffer_rank{rank}.safetensors"
BUFFER_META_FILE = "rpg_generation_buffer_rank{rank}.json"
#: Version of the layout above. trl-rpg 0.1 wrote pickled buffers and a manifest without a file list (format 1).
FORMAT_VERSION = 2
#: RPG files at most this large get a SHA-256 in the manifest (larger ones, e.g. a full-model reference snapshot,
#: are checked by size and by parsing).
HASH_MAX_BYTES = 1 << 30


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: incomplete, damaged, or written for another setup."""


class ScheduleMismatch(CheckpointError):
    """A checkpoint written with another reference schedule than the run resuming it."""


# ----------------------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------------------


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: str, with_hash: bool) -> dict[str, Any]:
    """`{"size": bytes}` of a file, plus `"sha256"` when `with_hash` and the file is small enough."""
    record: dict[str, Any] = {"size": os.path.getsize(path)}
    if with_hash and record["size"] <= HASH_MAX_BYTES:
        record["sha256"] = _sha256(path)
    return record


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


def _listing(directory: str) -> dict[str, dict[str, Any]]:
    """Every file under `directory` (relative path -> size), the manifest and temporary files excepted."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, directory)
            if relative == MANIFEST_FILE or ".tmp-" in name:
                continue
            files[relative] = {"size": os.path.getsize(path)}
    return files


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


def save_generation_buffer(directory: str, rank: int, step: int, buffer: Sequence[dict] | None
                           ) -> tuple[dict[str, dict], list[int] | None]:
    """Write process `rank`'s buffered generation batch (None: none) and micro-step counter; returns the records of
    the files written (name -> size and SHA-256) and the rows of each buffered micro-batch, for the manifest."""
    from safetensors.torch import save_file

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
    tensor_path = os.path.join(directory, BUFFER_TENSORS_FILE.format(rank=rank))
    meta_path = os.path.join(directory, BUFFER_META_FILE.format(rank=rank))
    save_file(tensors, tensor_path)
    write_json_atomic(meta_path, meta)
    return {os.path.basename(p): file_record(p, with_hash=True) for p in (tensor_path, meta_path)}, meta["rows"]


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


def save_state(directory: str, state: dict[str, Any]) -> dict[str, dict]:
    path = os.path.join(directory, STATE_FILE)
    write_json_atomic(path, state)
    return {STATE_FILE: file_record(path, with_hash=True)}


def load_state(directory: str) -> dict[str, Any]:
    return read_json(os.path.join(directory, STATE_FILE), "The RPG state file")


def save_reference(directory: str, named_tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    from safetensors.torch import save_file

    path = os.path.join(directory, REFERENCE_FILE)
    save_file({name: t.contiguous() for name, t in named_tensors.items()}, path)
    return {REFERENCE_FILE: file_record(path, with_hash=True)}


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
# The manifest
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What a checkpoint was written for: the facts resume compares against the run that resumes it."""

    world_size: int
    steps_per_generation: int
    rpg_reference: str


def write_manifest(directory: str, global_step: int, layout: Layout, rank_records: Sequence[dict[str, dict]],
                   buffer_rows: Sequence[list[int] | None], main_records: dict[str, dict]) -> None:
    """The completion marker: written last, by the main process, once every process has written its files.

    `rank_records[r]` are the records of the files process r wrote (reported by r itself: on a cluster whose nodes
    write to local disks the main process cannot see them) and `buffer_rows[r]` the rows of its buffered
    micro-batches; `main_records` are the records of the main process's RPG files.
    """
    files = _listing(directory)
    for records in (*rank_records, main_records):
        files.update(records)
    manifest = {
        "format": FORMAT_VERSION, "global_step": int(global_step), "world_size": layout.world_size,
        "steps_per_generation": layout.steps_per_generation, "rpg_reference": layout.rpg_reference,
        "rank_files": [sorted(records) for records in rank_records], "buffer_rows": list(buffer_rows),
        "files": files,
    }
    write_json_atomic(os.path.join(directory, MANIFEST_FILE), manifest)


def read_manifest(directory: str) -> dict[str, Any]:
    manifest = read_json(os.path.join(directory, MANIFEST_FILE), "The completion marker")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        found = manifest.get("format", 1) if isinstance(manifest, dict) else "unknown"
        raise CheckpointError(f"{directory} was written by another trl-rpg version (checkpoint format {found}, this "
                              f"version reads format {FORMAT_VERSION}); it cannot be resumed.")
    return manifest


def _check_file(directory: str, relative: str, record: dict[str, Any]) -> None:
    path = os.path.join(directory, relative)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete (copied or synced in part?).")
    size = os.path.getsize(path)
    if size != record.get("size"):
        raise CheckpointError(f"{path} is {size} bytes, the checkpoint recorded {record.get('size')}: the file is "
                              "truncated or damaged.")
    if "sha256" in record and _sha256(path) != record["sha256"]:
        raise CheckpointError(f"{path} does not match the checksum recorded in the checkpoint: the file is damaged.")


def required_files(manifest: dict[str, Any]) -> list[str]:
    """The RPG files a manifest must list: the state, the reference snapshot of a moving reference, and every
    process's generation buffer."""
    names = [STATE_FILE]
    if manifest["rpg_reference"] in ("periodic", "adaptive"):
        names.append(REFERENCE_FILE)
    for rank in range(manifest["world_size"]):
        names += [BUFFER_TENSORS_FILE.format(rank=rank), BUFFER_META_FILE.format(rank=rank)]
    return names


def verify_checkpoint(directory: str, rpg_reference: str, ranks: Iterable[int] | None = None) -> dict[str, Any]:
    """Check a checkpoint before resuming from it; returns its manifest, or raises `CheckpointError` naming the
    problem.

    Checks the manifest and that the run resumes it with the same reference schedule, then the files: with
    `ranks=None` every listed file except other processes' buffers (what the main process checks), else only the
    buffer files of `ranks` (what each process checks for the buffers it will load).
    """
    manifest = read_manifest(directory)
    if manifest["rpg_reference"] != rpg_reference:
        raise ScheduleMismatch(
            f"{directory} was written with rpg_reference={manifest['rpg_reference']!r}; this run has "
            f"rpg_reference={rpg_reference!r}. The reference state of one schedule cannot continue another: resume "
            f"with rpg_reference={manifest['rpg_reference']!r}, or start a new run from the saved model weights.")
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
             if name.startswith(prefix) and name[len(prefix):].isdigit()]
    return [path for _, path in sorted(found, reverse=True)]


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest `checkpoint-N` folder under `output_dir` that holds a completion marker (not verified)."""
    return next((p for p in checkpoint_folders(output_dir) if os.path.exists(os.path.join(p, MANIFEST_FILE))), None)


def resume_candidates(resume_from_checkpoint: str | bool, output_dir: str) -> list[str]:
    """The checkpoints to try, in order: the given path (refused at once without a completion marker), or, for
    `True`, every checkpoint in `output_dir` holding a completion marker, newest first (those without one were
    interrupted while being written and are passed over)."""
    if resume_from_checkpoint is not True:
        path = str(resume_from_checkpoint)
        if not os.path.exists(os.path.join(path, MANIFEST_FILE)):
            raise CheckpointError(f"resume_from_checkpoint={path!r} is not a complete RPG checkpoint (no "
                                  f"{MANIFEST_FILE}); it was probably interrupted while being written.")
        return [path]
    candidates = [p for p in checkpoint_folders(output_dir) if os.path.exists(os.path.join(p, MANIFEST_FILE))]
    if not candidates:
        raise CheckpointError(f"No complete RPG checkpoint found in output_dir={output_dir!r} (a complete one holds "
                              f"{MANIFEST_FILE}).")
    return candidates


def verify_for_process(directory: str, rpg_reference: str, world_size: int, steps_per_generation: int, rank: int,
                       main: bool) -> dict[str, Any]:
    """This process's share of verifying a checkpoint before resuming: the main process checks every file the
    manifest lists except the processes' buffers; every process checks the buffer files it will read. Returns the
    manifest."""
    manifest = verify_checkpoint(directory, rpg_reference, ranks=None if main else [])
    plan = plan_buffer_restore(manifest, world_size, steps_per_generation)
    verify_checkpoint(directory, rpg_reference, ranks=buffer_ranks_needed(plan, manifest, rank))
    return manifest


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
    sees the same rows as in the uninterrupted run), when they divide evenly. Otherwise the batch is regenerated.
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


def restore_buffers(directory: str, manifest: dict[str, Any], plan: BufferPlan, world_size: int, rank: int,
                    pad_token_id: int, device) -> tuple[int, list[dict] | None]:
    """The micro-step counter and buffered generation batch this process continues with."""
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
    "CheckpointError",
    "Layout",
    "ScheduleMismatch",
    "buffer_ranks_needed",
    "copy_parameters",
    "gather_to_cpu",
    "last_complete_checkpoint",
    "load_generation_buffer",
    "load_reference",
    "load_state",
    "plan_buffer_restore",
    "read_manifest",
    "redistribute",
    "restore_buffers",
    "save_generation_buffer",
    "save_reference",
    "save_state",
    "scatter_from_cpu",
    "verify_checkpoint",
    "write_manifest",
]
