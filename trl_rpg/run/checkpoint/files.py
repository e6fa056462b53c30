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


def fsync_folder(directory: str) -> None:
    """fsync `directory`'s entries (the names of its files), not the folders under it."""
    fd = os.open(directory, os.O_RDONLY)
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
    """The JSON value of `path`, or `CheckpointError` naming the file (missing, unreadable, not JSON, or nested too
    deep for Python's parser: a `RecursionError`)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{what} is missing: {path}.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{what} is damaged and cannot be read: {path} ({error}).") from None
    except RecursionError:
        raise CheckpointError(f"{what} is damaged and cannot be read: {path} (its JSON is nested too deep to "
                              "parse).") from None


def _free_bytes(path: str) -> int:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return shutil.disk_usage(path).free


#: Below this much free space, a failed write is taken for a full disk.
DISK_FULL_BYTES = 64 << 20
#: How the writers of a checkpoint's files say that the disk is full or the quota exceeded, when the error carries no
#: error number: Python and Rust (safetensors, tokenizers: `... (os error 28)`) put the system's text in the message.
_NO_SPACE_TEXTS = {errno.ENOSPC: ("No space left on device", "os error 28"),
                   errno.EDQUOT: ("Disk quota exceeded", "os error 122")}
#: Bytes `_disk_refuses_writes` tries to write (an exceeded quota or a full disk refuses the first block).
PROBE_BYTES = 1 << 20


def _written_by_a_checkpoint_writer(error: BaseException) -> bool:
    """Whether `error` is the kind a checkpoint file's writer raises when a write fails: `OSError` (Python's files),
    `RuntimeError` (torch.save: `unexpected pos 576 vs 534`, `basic_ios::clear: iostream error`, which carry no error
    number), safetensors' `SafetensorError`, or a bare `Exception` (tokenizers' `No space left on device (os error
    28)`)."""
    return (isinstance(error, (OSError, RuntimeError)) or type(error) is Exception
            or type(error).__name__ == "SafetensorError")


def _disk_refuses_writes(directory: str) -> int | None:
    """`ENOSPC` or `EDQUOT` if writing (and fsyncing) `PROBE_BYTES` next to `directory` fails so, else None: what
    decides for an error that does not say why (torch's), on a disk that has space but a user over quota."""
    import tempfile

    while not os.path.isdir(directory):
        directory = os.path.dirname(directory) or "."
    try:
        with tempfile.TemporaryFile(dir=directory) as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as error:
        return error.errno if error.errno in (errno.ENOSPC, errno.EDQUOT) else None
    return None


def _no_space_code(error: BaseException, directory: str) -> int | None:
    """`ENOSPC` / `EDQUOT` when `error`, raised while writing into `directory`, comes from a full disk or an exceeded
    quota: its error number, its text, the free space left, or a write that fails again (`_disk_refuses_writes`)."""
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return code
    text = str(error)
    for candidate, fragments in _NO_SPACE_TEXTS.items():
        if any(fragment in text for fragment in fragments):
            return candidate
    if _free_bytes(directory) < DISK_FULL_BYTES:
        return errno.ENOSPC
    return _disk_refuses_writes(directory)


@contextmanager
def explain_disk_full(directory: str) -> Iterator[None]:
    """Within the block, a write failing because the disk is full or the user's disk quota is exceeded raises
    `CheckpointDiskFull` saying so and where, whichever file's writer raised it (`_written_by_a_checkpoint_writer`:
    Python, torch, safetensors, tokenizers) and however it said it (`_no_space_code`). The checkpoint stays without
    a manifest, so it is never resumed from; nothing else is deleted. Any other error passes unchanged."""
    try:
        yield
    except Exception as error:
        if isinstance(error, CheckpointDiskFull) or not _written_by_a_checkpoint_writer(error):
            raise
        code = _no_space_code(error, directory)
        if code is None:
            raise
        free = _free_bytes(directory)
        what = (f"Your disk quota is exceeded on the disk holding {directory} ({free} bytes free on the disk)"
                if code == errno.EDQUOT else f"The disk holding {directory} is full ({free} bytes free)")
        raise CheckpointDiskFull(
            code,
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
    path = os.path.join(directory, STATE_FILE)
    return checked_state(read_json(path, "The RPG state file"), path)


#: The keys of `rpg_state.json` that a resume reads, and the values each may hold.
_STATE_KEYS = {"reference_version": "an integer >= 0", "reference_updates": "an integer >= 0",
               "kl_ema": "a number or null", "skipped_steps": "an integer >= 0"}


def checked_state(state: Any, path: str) -> dict[str, Any]:
    """`state`, the content of `rpg_state.json` at `path`, if it holds what `save_state` writes (the reference's
    version and updates, its moving average, the skipped-step count), else `CheckpointError` naming the file and the
    key."""
    def fits(key, value) -> bool:
        if key == "kl_ema":
            return value is None or isinstance(value, (int, float)) and not isinstance(value, bool)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(state, dict):
        raise CheckpointError(f"The RPG state file {path} is damaged: it holds a {type(state).__name__}, not the "
                              "object RPGTrainer writes.")
    for key, allowed in _STATE_KEYS.items():
        required = key != "skipped_steps"
        if (key in state or required) and not fits(key, state.get(key)):
            raise CheckpointError(f"The RPG state file {path} is damaged: {key!r} is {state.get(key)!r:.100}, not "
                                  f"{allowed}.")
    return state


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
