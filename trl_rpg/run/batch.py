"""TRL generation batches as dicts of tensors: their layout, and how to select, merge and move their rows.

A generation batch (what `GRPOTrainer._generate_and_score_completions` returns, and what `_buffered_inputs` holds
one slice of per micro-step) is a dict whose fields are aligned with the left-padded prompt, the right-padded
completion, one value per row, or the whole batch. Dynamic sampling regroups rows across generation rounds and
processes; a checkpoint resumed on a different number of processes redistributes them. Both use this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

#: Fields aligned with the (left-padded) prompt, and their padding value (None: the pad token).
PROMPT_FIELDS = {"prompt_ids": None, "prompt_mask": 0}
#: Fields aligned with the (right-padded) completion, and their padding value.
COMPLETION_FIELDS = {
    "completion_ids": None, "completion_mask": 0, "tool_mask": 1, "old_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0, "ref_per_token_logps": 0.0, "importance_sampling_ratio": 1.0,
}
#: One value per row.
ROW_FIELDS = ("advantages",)
#: Batch-level values that depend on the rows (recomputed, or kept as they are, by whoever regroups rows).
BATCH_FIELDS = ("num_items_in_batch",)
#: Every field this module knows how to regroup (0-dim tensors, e.g. version tags, are batch-level and kept too).
KNOWN_FIELDS = (*PROMPT_FIELDS, *COMPLETION_FIELDS, *ROW_FIELDS, *BATCH_FIELDS)


def unknown_fields(batch: dict[str, Any]) -> list[str]:
    """Fields of `batch` whose rows this module cannot regroup (multimodal inputs, other trainers' additions)."""
    return [key for key, value in batch.items()
            if key not in KNOWN_FIELDS and value is not None
            and not (isinstance(value, torch.Tensor) and value.dim() == 0)]


def num_rows(batch: dict[str, Any]) -> int:
    """The number of rows of a generation batch."""
    for key in (*PROMPT_FIELDS, *COMPLETION_FIELDS, *ROW_FIELDS):
        if batch.get(key) is not None:
            return batch[key].size(0)
    raise ValueError(f"Generation batch without row fields: {sorted(batch)}.")


def select_rows(batch: dict[str, Any], index: Sequence[int]) -> dict[str, Any]:
    """The rows `index` of a generation batch (0-dim batch-level values kept; `BATCH_FIELDS` dropped)."""
    out = {}
    for key, value in batch.items():
        if key in BATCH_FIELDS or value is None:
            continue
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            out[key] = value
        else:
            out[key] = value[torch.as_tensor(list(index), dtype=torch.long, device=value.device)]
    return out


def merge_rows(parts: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """Concatenate generation batches along rows, re-padding prompts on the left and completions on the right.

    Extra left padding shifts a prompt's absolute positions uniformly; with rotary position embeddings (Qwen, Llama
    and the other models RPG targets) the log-probs, and so the stored sampling log-probs, are unchanged up to float
    rounding. Models with absolute position embeddings would see different log-probs for re-padded rows.
    0-dim values (and `BATCH_FIELDS`) are taken from the first part.
    """
    parts = [p for p in parts if p and num_rows(p) > 0]
    if not parts:
        raise ValueError("Nothing to merge.")
    keys = list(parts[0])
    for p in parts[1:]:
        if set(p) != set(keys):
            raise ValueError(f"Generation batches with different fields cannot be merged: {sorted(keys)} vs "
                             f"{sorted(p)}.")
    out = {}
    for key in keys:
        values = [p[key] for p in parts]
        if values[0] is None or values[0].dim() == 0 or key in BATCH_FIELDS:
            out[key] = values[0]
            continue
        if key in PROMPT_FIELDS or key in COMPLETION_FIELDS:
            pad_value = PROMPT_FIELDS.get(key, COMPLETION_FIELDS.get(key))
            pad_value = pad_token_id if pad_value is None else pad_value
            width = max(v.size(1) for v in values)
            left = key in PROMPT_FIELDS
            values = [F.pad(v, (width - v.size(1), 0) if left else (0, width - v.size(1)), value=pad_value)
                      for v in values]
        out[key] = torch.cat(values, dim=0)
    return out


def to_device(obj: Any, device) -> Any:
    """`obj` (a tensor, or dicts / lists / tuples of them) with every tensor moved to `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


__all__ = [
    "BATCH_FIELDS", "COMPLETION_FIELDS", "KNOWN_FIELDS", "PROMPT_FIELDS", "ROW_FIELDS", "merge_rows", "num_rows",
    "select_rows", "to_device", "unknown_fields",
]
