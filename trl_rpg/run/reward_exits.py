"""Reward calls that end other than by returning rewards: a `SystemExit` or a `KeyboardInterrupt` the function raised
itself (told from a Ctrl-C by whether an interrupt signal arrived), and a call that never returns in a run of
several processes (`StuckRewardWatchdog`). `reward_calls.checked_reward_function` uses both; the first become
errors naming the function, the second ends the process naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time


class RewardExited(Exception):
    """A reward function raised `SystemExit`, or a `KeyboardInterrupt` no interrupt signal caused (`error`)."""

    def __init__(self, error: BaseException):
        super().__init__(repr(error))
        self.error = error


async def exits_as_errors(coroutine):
    """Await a reward function's coroutine, its `SystemExit` / `KeyboardInterrupt` raised as `RewardExited`: asyncio
    re-raises those out of the event loop (TRL's reward loop thread would die and training would wait for it)."""
    try:
        return await coroutine
    except (SystemExit, KeyboardInterrupt) as error:
        raise RewardExited(error) from error


@contextlib.contextmanager
def interrupt_signals():
    """Record the interrupt signals (SIGINT) that arrive in this block, still handled as before (a Ctrl-C raises
    `KeyboardInterrupt`); only the main thread receives signals, elsewhere nothing is recorded."""
    seen: list[int] = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if not callable(previous):  # another thread, or SIGINT ignored / not handled by Python
        yield seen
        return

    def record(signum, frame):
        seen.append(signum)
        return previous(signum, frame)

    signal.signal(signal.SIGINT, record)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def call_here(func, args, kwargs):
    """`func(*args, **kwargs)` in this thread; its `SystemExit`, or a `KeyboardInterrupt` raised while no interrupt
    signal arrived (the function's own), as `RewardExited`."""
    with interrupt_signals() as interrupted:
        try:
            return func(*args, **kwargs)
        except SystemExit as error:
            raise RewardExited(error) from error
        except KeyboardInterrupt as error:
            if interrupted:
                raise
            raise RewardExited(error) from error


class StuckRewardWatchdog:
    """Ends this process when one reward-function call runs longer than `seconds`, in a run of several processes.

    Every process waits for every other's rewards (TRL gathers them), so a call that never returns on one process
    leaves the others waiting in a collective without a word, for as long as the process group allows (on CPU, gloo's
    30 minutes whatever `ddp_timeout` says: transformers passes it only for GPU and DeepSpeed). The trainer arms one
    per call with `ddp_timeout` as `seconds` (and makes the process group wait `ddp_timeout` plus a margin, on CPU
    too: `_compat.set_collective_timeout`), so the stuck process reports first: a thread prints one line naming the
    function, the process and the bound, writes it to the error file torchrun reads (the launcher prints it last),
    and ends the process with status 1 (`os._exit`: the stuck call cannot be interrupted, and nothing is being
    saved while a reward runs). torchrun then stops the other processes.
    """

    def __init__(self, seconds: float, process: int, processes: int, end=None):
        self.seconds, self.process, self.processes = seconds, process, processes
        self.end = end or end_process

    @contextlib.contextmanager
    def watch(self, name: str, kwargs: dict):
        """Arm the watchdog for one call of reward function `name` (with these keyword arguments) while in the
        block."""
        completions = kwargs.get("completions")
        batch = f" (a batch of {len(completions)} completions)" if completions is not None else ""
        timer = threading.Timer(self.seconds, lambda: self.end(
            f"RPGTrainer: error: reward function `{name}` has not returned after {self.seconds:g} s on process "
            f"{self.process} of {self.processes}{batch}. The other processes wait for its rewards, so the run is "
            f"ended: in a run of several processes a reward call may take at most ddp_timeout seconds "
            f"(ddp_timeout={self.seconds:g}). Make the function faster or have it give up on its own (None for a "
            "completion it cannot score), or raise --ddp_timeout."))
        timer.daemon = True
        timer.name = f"reward watchdog {name}"
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


def end_process(line: str) -> None:
    """Print `line` as the last thing, write it to the error file torchrun gives this process (the launcher prints
    the first failing process's), and end the process at once with status 1."""
    try:
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            with open(path, "w") as file:
                json.dump({"message": line, "timestamp": int(time.time())}, file)
    finally:
        os._exit(1)


__all__ = ["RewardExited", "StuckRewardWatchdog", "call_here", "end_process", "exits_as_errors", "interrupt_signals"]
