"""One writer per output folder: a lock file in `output_dir` that a second run meets when it starts.

Two runs writing one `output_dir` replace each other's `checkpoint-N` folders (named by the step only) and final
model, and neither is told. `output_dir_lock` is held for a whole `train()` (and for a `save_model()` called on its
own): a run refuses to start with `OutputDirBusy` naming the holder while another run's lock is there, unless the
holder is known to be gone.

- **One file per holder.** Each holder writes its own file, `_rpg_writer.lock.<random id>` (its process id, host,
  machine and PID-namespace identity, process start time, command and a token naming the run): written whole under
  a temporary name and renamed to its own name, then the folder's other lock files are read. Two runs starting
  together each see the other's file (each looks after writing its own), so at most one goes on (both may be
  refused). No file is ever written over, and a file is deleted only by its holder or as a dead holder's: no one
  can delete another process's fresh lock.
- **Who holds it.** The process id, with what tells this process's view apart from another's: the host name, the
  kernel's boot id and the PID (and time) namespace (`/proc/self/ns/pid`), and the process's start time as it
  reads it itself (`/proc/self/stat`). A holder is checked only from the same host, boot and namespace: there a
  missing process, or one with another start time (the id was reused), is gone and its file is removed with a
  warning; an existing process (another user's too: `PermissionError`) is alive. A holder of another host,
  another container (PID namespace) or an earlier boot cannot be checked: its lock is never judged stale, and the
  error says to delete the file if that run has ended.
- **An odd file** (not JSON, nested too deep, a pid that is no process id, a symbolic link, a FIFO, a folder) is
  refused naming it and what to do; it is opened without following links and without blocking.
- **Released on every exit** (returned, raised, interrupted: the lock is released in a `finally`).
- **Several processes**: every process that saves (the main process; each node's first with `save_on_each_node`)
  takes the lock with the run's token (the main process's, on every process), so the processes of one run share it;
  one refusal is every process's (`gather`), so none goes on alone.

The names start with `_`, which transformers' Hub uploads of `output_dir` leave out (`ignore_patterns=["_*", ...]`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

LOCK_FILE = "_rpg_writer.lock"  # each holder's file: LOCK_FILE + "." + a random id (LOCK_FILE itself: older versions)
PID_LIMIT = 4_194_304  # Linux's PID_MAX_LIMIT: no process id is larger
RECORD_BYTES = 1 << 16


class OutputDirBusy(RuntimeError):
    """Another run, still running (or not known to have ended), writes the same `output_dir`."""


def _linux_start(pid: int | str) -> int | None:
    """The start time of process `pid` ("self": this one) as this process's /proc shows it (clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as file:
            fields = file.read().rsplit(")", 1)[1].split()  # after the command name, which may hold anything
        return int(fields[19])  # field 22 of proc(5); fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None


def _process_start(pid: int) -> int | float | None:
    """When process `pid` started: clock ticks since boot on Linux, seconds since the epoch elsewhere (psutil); None
    when unknown or not running."""
    if sys.platform == "linux":
        return _linux_start(pid)
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # no psutil, no such process, no access
        return None


def _namespace() -> str | None:
    """What a process id means here: the kernel's boot and the PID and time namespaces of this process (None on Linux
    when unreadable: then no holder can be checked); the platform's name where there are no PID namespaces."""
    if sys.platform != "linux":
        return sys.platform
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
        pid_ns = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    try:
        time_ns = os.stat("/proc/self/ns/time")
        clock = f"{time_ns.st_dev}:{time_ns.st_ino}"
    except OSError:  # a kernel without time namespaces
        clock = "-"
    return f"boot {boot}, pid namespace {pid_ns.st_dev}:{pid_ns.st_ino}, time namespace {clock}"


def _record(token: str) -> dict[str, Any]:
    """What the lock says about this process (its start time as it reads it itself)."""
    start = _linux_start("self") if sys.platform == "linux" else _process_start(os.getpid())
    return {"token": token, "pid": os.getpid(), "host": socket.gethostname(), "namespace": _namespace(),
            "process_start": start, "started": time.time(), "command": " ".join(sys.argv)[:300]}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_problem(record: Any) -> str | None:
    """Why `record` is not a lock's record (None when it is one)."""
    if not isinstance(record, dict):
        return "it is not a JSON object"
    if not isinstance(record.get("token"), str) or not record["token"]:
        return "it has no token"
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 1 <= pid <= PID_LIMIT:
        return f"its pid, {str(pid)[:40]}, is not a process id (1 to {PID_LIMIT})"
    if not isinstance(record.get("host"), str):
        return "it has no host"
    if not isinstance(record.get("namespace"), (str, type(None))):
        return "its namespace is not a string"
    for key in ("process_start", "started"):
        if record.get(key) is not None and not _number(record[key]):
            return f"its {key} is not a number"
    return None


def _read(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The lock file's record and None, (None, None) when there is no such file, (None, why) when it is not a lock's
    record. Opened without following a link and without blocking (a FIFO)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None, None
    except OSError as error:
        if os.path.islink(path):
            return None, f"it is a symbolic link (to {os.readlink(path)!r}), not a file"
        return None, f"it cannot be read ({error.strerror or error})"
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return None, "it is not a regular file (a FIFO, a folder or a device)"
    with os.fdopen(descriptor, "rb") as file:
        data = file.read(RECORD_BYTES + 1)
    if len(data) > RECORD_BYTES:
        return None, f"it is larger than {RECORD_BYTES} bytes"
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return None, "it is not a JSON lock record"
    problem = record_problem(record)
    return (None, problem) if problem else (record, None)


def read_holder(path: str) -> dict[str, Any] | None:
    """The record of lock file `path`, None when there is no such file; `{}` for a file that is not a lock's record."""
    record, problem = _read(path)
    return {} if problem else record


def _other_start(now: int | float, recorded: int | float) -> bool:
    """Whether two start times are of different processes (ticks: exact; seconds: more than 1 s apart)."""
    if isinstance(now, int) and isinstance(recorded, int):
        return now != recorded
    return abs(now - recorded) > 1.0


def holder_running(holder: dict[str, Any]) -> bool | None:
    """Whether the process that holds the lock still runs: True / False when it can be checked from here (same host,
    boot and PID namespace), None when it cannot (the lock is then never judged stale)."""
    here = _namespace()
    if holder.get("host") != socket.gethostname() or here is None or holder.get("namespace") != here:
        return None
    pid = holder["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    started, recorded = _process_start(pid), holder.get("process_start")
    if started is not None and _number(recorded) and _other_start(started, recorded):
        return False  # the id was reused by another process
    return True


def _create(output_dir: str, record: dict[str, Any]) -> str:
    """Write `record` to a lock file of this holder's own (whole: under a temporary name first); its path."""
    name = os.path.join(output_dir, f"{LOCK_FILE}.{uuid.uuid4().hex}")
    temporary = f"{name}.tmp"
    try:
        with open(temporary, "x", encoding="utf-8") as file:
            json.dump(record, file)
            file.flush()
            os.fsync(file.fileno())
        os.rename(temporary, name)  # a name no one else uses
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return name


def lock_files(output_dir: str) -> list[str]:
    """The lock files of `output_dir` (every holder's; not the temporary ones being written)."""
    try:
        names = os.listdir(output_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(output_dir, name) for name in sorted(names) if
            (name == LOCK_FILE or name.startswith(f"{LOCK_FILE}.")) and not name.endswith(".tmp")]


def _describe(holder: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"])) if _number(
        holder.get("started")) and 0 <= holder["started"] < 1e11 else "an unknown time"
    command = f" ({holder['command']})" if isinstance(holder.get("command"), str) and holder["command"] else ""
    return f"process {holder['pid']} on {holder.get('host')}, started at {started}{command}"


def odd_message(output_dir: str, path: str, problem: str) -> str:
    """The error for a lock file that is not a lock's record."""
    return (f"RPGTrainer: output_dir {output_dir} holds a lock file, {path}, that is not a trl-rpg lock record "
            f"({problem}): another run may be writing this folder. If none is, delete that file; or choose another "
            "output_dir.")


def busy_message(output_dir: str, path: str, holder: dict[str, Any], running: bool | None) -> str:
    """The error for an `output_dir` another run holds (`running`: `holder_running`)."""
    if not holder:
        return odd_message(output_dir, path, "not a JSON lock record")
    if running is None and holder.get("host") != socket.gethostname():
        return (f"RPGTrainer: output_dir {output_dir} is being written by another run ({_describe(holder)}), on "
                "another host, which this machine cannot check. Two runs writing one folder replace each other's "
                f"checkpoints. If that run has ended (a crashed node), delete {path}; or choose another output_dir.")
    if running is None:
        return (f"RPGTrainer: output_dir {output_dir} is being written by another run ({_describe(holder)}), in "
                "another container (PID namespace) of this host or before this machine restarted, which this "
                "process cannot check (a process id means another process there). Two runs writing one folder "
                f"replace each other's checkpoints. If that run has ended, delete {path}; or choose another "
                "output_dir.")
    return (f"RPGTrainer: output_dir {output_dir} is being written by another run ({_describe(holder)}, still "
            "running). Two runs writing one folder replace each other's checkpoints: wait for it to end, or choose "
            f"another output_dir (the lock file, removed when that run ends: {path}).")


@dataclass
class OutputLock:
    """The lock this process holds on an `output_dir`: its own lock file `path`, for the run named by `token`."""

    path: str
    token: str

    def release(self) -> None:
        """Remove this holder's lock file if it is still this run's."""
        holder, _ = _read(self.path)
        if holder and holder.get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _check_others(output_dir: str, own: str, token: str) -> None:
    """Refuse (`OutputDirBusy`) if another run holds `output_dir`; remove the lock files of holders known gone."""
    for path in lock_files(output_dir):
        if path == own:
            continue
        holder, problem = _read(path)
        if problem:
            raise OutputDirBusy(odd_message(output_dir, path, problem))
        if holder is None or holder["token"] == token:  # released meanwhile; this run's other saving process
            continue
        running = holder_running(holder)
        if running is not False:
            raise OutputDirBusy(busy_message(output_dir, path, holder, running))
        logger.warning("RPGTrainer: replacing a stale lock of %s: %s is no longer running (it ended without "
                       "releasing it: killed, or the machine stopped).", output_dir, _describe(holder))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a dead holder's own file: no one else writes that name


def acquire(output_dir: str, token: str) -> OutputLock:
    """Take the lock of `output_dir` for the run named by `token` (creating the folder), removing stale lock files
    with a warning; `OutputDirBusy` when another run holds it. A lock file holding `token` is this run's (another of
    its saving processes took it)."""
    os.makedirs(output_dir, exist_ok=True)
    own = _create(output_dir, _record(token))  # first written, then the others read: two runs see each other
    try:
        _check_others(output_dir, own, token)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(own)
        raise
    return OutputLock(own, token)


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


__all__ = ["LOCK_FILE", "OutputDirBusy", "OutputLock", "acquire", "busy_message", "check_output_dir_free",
           "holder_running", "lock_files", "odd_message", "output_dir_lock", "read_holder", "record_problem"]


def check_output_dir_free(output_dir: str) -> None:
    """Raise the `OutputDirBusy` that `acquire` would raise now, without taking the lock: a look at `output_dir`
    before a model and data load (a lock of a run still running or that cannot be checked from here, or a file that
    is not a lock record). No lock, or only stale ones (`acquire` removes them), passes."""
    for path in lock_files(output_dir):
        holder, problem = _read(path)
        if problem:
            raise OutputDirBusy(odd_message(output_dir, path, problem))
        if holder is not None and holder_running(holder) is not False:  # alive, or not checkable from here
            raise OutputDirBusy(busy_message(output_dir, path, holder, holder_running(holder)))
