"""One writer per output folder: a lock file in `output_dir` that a second run meets when it starts.

Two runs writing one `output_dir` replace each other's `checkpoint-N` folders (named by the step only) and final
model, and neither is told. `output_dir_lock` is held for a whole `train()`: the first run creates `LOCK_FILE` (its
process id, host, start time and a token naming the run); a second run that finds it refuses to start with
`OutputDirBusy` naming the holder, unless the holder is known to be gone.

- **Released on every exit** of `train()` (returned, raised, interrupted: the lock is released in a `finally`).
- **A stale lock**, left by a process that was killed (SIGKILL, a crash of the machine), is recognised when its
  process ran on this machine: no process with its id, or one started at another time (the id was reused). It is
  replaced, with a warning naming it. A lock written on another host (a shared filesystem) cannot be checked from
  here: the error says so, and to delete the file if that run has ended.
- **Several processes**: every process that saves (the main process; each node's first with `save_on_each_node`)
  takes the lock with the run's token (the main process's, on every process), so the processes of one run share it;
  one refusal is every process's (`gather`), so none goes on alone.
- **Atomic**: the file is written whole under a temporary name, then linked to `LOCK_FILE` (a link fails if the
  name exists: two runs starting together cannot both take it); where links are not supported, it is created with
  `O_EXCL`.

The name starts with `_`, which transformers' Hub uploads of `output_dir` leave out (`ignore_patterns=["_*", ...]`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

LOCK_FILE = "_rpg_writer.lock"


class OutputDirBusy(RuntimeError):
    """Another run, still running (or not known to have ended), writes the same `output_dir`."""


def _process_start(pid: int) -> float | None:
    """When process `pid` of this machine started (seconds since the epoch; None when unknown or not running)."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # no psutil, no such process, no access
        return None


def _record(token: str) -> dict[str, Any]:
    """What the lock says about this process."""
    import sys

    return {"token": token, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "process_start": _process_start(os.getpid()), "command": " ".join(sys.argv)[:300]}


def read_holder(path: str) -> dict[str, Any] | None:
    """The lock's record, None when there is no lock; `{}` for a file that is not a lock's record."""
    try:
        with open(path, encoding="utf-8") as file:
            holder = json.load(file)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else {}


def holder_running(holder: dict[str, Any]) -> bool | None:
    """Whether the process that holds the lock still runs: True / False on this machine, None on another host."""
    if holder.get("host") != socket.gethostname():
        return None
    pid = holder["pid"]
    if pid == os.getpid():
        return True  # another trainer of this process, in a `train()` of its own
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    started, recorded = _process_start(pid), holder.get("process_start")
    if started is not None and isinstance(recorded, (int, float)) and abs(started - recorded) > 1.0:
        return False  # the id was reused by a process started later
    return True


def _create(path: str, record: dict[str, Any]) -> bool:
    """Create the lock file holding `record`; False if it exists."""
    temporary = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(record, file)
        file.flush()
        os.fsync(file.fileno())
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links on this filesystem
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(record, file)
        return True
    finally:
        os.unlink(temporary)


def _describe(holder: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"])) if isinstance(
        holder.get("started"), (int, float)) else "an unknown time"
    command = f" ({holder['command']})" if holder.get("command") else ""
    return f"process {holder['pid']} on {holder.get('host')}, started at {started}{command}"


def busy_message(output_dir: str, path: str, holder: dict[str, Any], running: bool | None) -> str:
    """The error for an `output_dir` another run holds (`running`: `holder_running`)."""
    if not holder:
        return (f"RPGTrainer: output_dir {output_dir} holds a lock file, {path}, that is not a trl-rpg lock record: "
                "another run may be writing this folder. If none is, delete that file; or choose another output_dir.")
    if running is None:
        return (f"RPGTrainer: output_dir {output_dir} is being written by another run ({_describe(holder)}), on "
                "another host, which this machine cannot check. Two runs writing one folder replace each other's "
                f"checkpoints. If that run has ended (a crashed node), delete {path}; or choose another output_dir.")
    return (f"RPGTrainer: output_dir {output_dir} is being written by another run ({_describe(holder)}, still "
            "running). Two runs writing one folder replace each other's checkpoints: wait for it to end, or choose "
            f"another output_dir (the lock file, removed when that run ends: {path}).")


@dataclass
class OutputLock:
    """The lock this process holds on an `output_dir` (`path`), for the run named by `token`."""

    path: str
    token: str

    def release(self) -> None:
        """Remove the lock file if it is still this run's."""
        holder = read_holder(self.path)
        if holder and holder.get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def acquire(output_dir: str, token: str) -> OutputLock:
    """Take the lock of `output_dir` for the run named by `token` (creating the folder), replacing a stale one with a
    warning; `OutputDirBusy` when another run holds it. A lock already holding `token` is this run's (another of its
    saving processes took it)."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    for _ in range(3):  # a lock that vanishes, or a stale one replaced, between the reads: try again
        if _create(path, _record(token)):
            return OutputLock(path, token)
        holder = read_holder(path)
        if holder is None:
            continue
        if holder.get("token") == token:
            return OutputLock(path, token)
        running = holder_running(holder) if holder else None
        if running is not False:
            raise OutputDirBusy(busy_message(output_dir, path, holder, running))
        logger.warning("RPGTrainer: replacing a stale lock of %s: %s is no longer running (it ended without "
                       "releasing it: killed, or the machine stopped).", output_dir, _describe(holder))
        if read_holder(path) == holder:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    raise OutputDirBusy(f"RPGTrainer: could not take the lock of output_dir {output_dir} ({path}): other runs keep "
                        "taking and releasing it. Choose another output_dir.")


@contextlib.contextmanager
def output_dir_lock(output_dir: str, saves: bool, gather: Callable[[list], list]) -> Iterator[OutputLock | None]:
    """Hold the lock of `output_dir` for the block, on every process of a run: `saves` says whether this process
    writes the folder (it takes the lock), `gather` collects one value from every process (identity with one
    process). Every process raises the same `OutputDirBusy` when one could not take it; the lock is released
    however the block ends."""
    token = gather([uuid.uuid4().hex])[0]  # the main process's: one run, one token
    lock, refusal = None, None
    if saves:
        try:
            lock = acquire(output_dir, token)
        except OutputDirBusy as error:
            refusal = str(error)
    refusals = [message for message in gather([refusal]) if message]
    if refusals:
        if lock is not None:
            lock.release()
        raise OutputDirBusy(refusals[0])
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


__all__ = ["LOCK_FILE", "OutputDirBusy", "OutputLock", "acquire", "busy_message", "holder_running",
           "output_dir_lock", "read_holder"]


def check_output_dir_free(output_dir: str) -> None:
    """Raise the `OutputDirBusy` that `acquire` would raise now, without taking the lock: a look at `output_dir`
    before a model and data load (a lock of a run still running, of another host, or a file that is not a lock
    record). No lock, or a stale one (`acquire` replaces it), passes."""
    path = os.path.join(output_dir, LOCK_FILE)
    holder = read_holder(path)
    if holder is None:
        return
    running = holder_running(holder) if holder else None
    if running is not False:
        raise OutputDirBusy(busy_message(output_dir, path, holder, running))
