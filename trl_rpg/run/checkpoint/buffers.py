"""The generation buffer of each process: saved with its micro-step counter (tensors in safetensors, the rest as JSON:
nothing is unpickled on resume), and restored, on the same number of processes or on another one (each buffered
micro-batch split over the new processes, or regenerated when it cannot be)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..batch import merge_rows, num_rows, to_device, unknown_fields
from .files import file_records, read_json, write_json_atomic
from .layout import BUFFER_META_FILE, BUFFER_TENSORS_FILE, FORMAT_VERSION, CheckpointError
from .manifest import read_manifest

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# Saving and loading one process's buffer
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
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(f"The generation buffer of process {rank} does not match its description "
                              f"{meta_path} ({type(error).__name__}: {error}).") from None


# ----------------------------------------------------------------------------------------------------------------
# Restoring the buffers, possibly on another number of processes
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
    sees the same rows as in the uninterrupted run), when they divide evenly and every field is one `trl_rpg.run.batch`
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
