"""A checkpoint's files, written and read safely: each file hashed and fsynced in one read, folders fsynced, JSON
written atomically, a full disk explained as such; RPG's state file and the reference snapshot."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch

from .layout import MANIFEST_FILE, REFERENCE_FILE, STATE_FILE, CheckpointDiskFull, CheckpointError

#: Threads hashing a checkpoint's files (hashlib releases the GIL: files are hashed in parallel).
HASH_THREADS = min(8, os.cpu_count() or 1)


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


def _free_bytes(path: str) -> int:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return shutil.disk_usage(path).free


#: Below this much free space, a failed write is taken for a full disk.
DISK_FULL_BYTES = 64 << 20


@contextmanager
def explain_disk_full(directory: str) -> Iterator[None]:
    """Within the block, a write failing because the disk is full (`ENOSPC`, or torch's `unexpected pos` with no
    space left) or the user's disk quota is exceeded (`EDQUOT`, with space left on the disk) raises
    `CheckpointDiskFull` saying so and where. The checkpoint stays without a manifest, so it is never resumed from;
    nothing else is deleted."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        code = getattr(error, "errno", None)
        full = (code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error)
                or _free_bytes(directory) < DISK_FULL_BYTES)
        if not full or isinstance(error, CheckpointDiskFull):
            raise
        free = _free_bytes(directory)
        what = (f"Your disk quota is exceeded on the disk holding {directory} ({free} bytes free on the disk)"
                if code == errno.EDQUOT else f"The disk holding {directory} is full ({free} bytes free)")
        raise CheckpointDiskFull(
            errno.EDQUOT if code == errno.EDQUOT else errno.ENOSPC,
            f"{what} while writing this checkpoint ({type(error).__name__}: {error}). The checkpoint is left "
            f"incomplete (no {MANIFEST_FILE}), so it will never be resumed from; the earlier checkpoints are "
            "untouched. Free some space (or lower save_total_limit), then resume with "
            "resume_from_checkpoint=True.") from error


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
