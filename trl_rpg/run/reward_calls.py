"""Calling reward functions: each call gets private copies of its inputs and an optional time limit, and what it
returns is checked (`checked_reward_function`); a batch that no function scored is counted (`ScoringTally`).

An error names the function, the row, and where in the user's code it raised or is defined.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import copy
import functools
import inspect
import logging
import math
import numbers
import os
import sysconfig
import threading
import traceback
from dataclasses import dataclass

import numpy as np
import torch

from .._compat import is_async_callable
from .reward_exits import RewardExited, StuckRewardWatchdog, call_here, exits_as_errors

logger = logging.getLogger(__name__)

#: Largest finite float32, the dtype TRL builds reward tensors in (`torch.tensor(rewards, dtype=torch.float32)`).
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

#: Largest reward magnitude accepted from a reward function. TRL normalises rewards with a standard deviation computed
#: in float32 (`scale_rewards="group"` over each group, `"batch"` over the whole batch): the mean of the squared
#: deviations from the mean, whose sum is at most sum(r_i ** 2) <= n * MAX_ABS_REWARD ** 2. With 1e15 that sum stays
#: below FLOAT32_MAX (3.4e38) for any n <= 3.4e8 rewards, so no group or batch std can overflow to inf (which would
#: divide every advantage to 0). With `reward_weights` the weighted total of several functions can reach
#: sum(|w_k|) * 1e15; it stays overflow-free for batches of up to 3.4e8 / sum(|w_k|) ** 2 completions.
MAX_ABS_REWARD = 1e15

#: Keyword arguments TRL passes to every reward function that are the trainer's own objects: passed as they are, never
#: copied (the environments are stateful on purpose).
SHARED_REWARD_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")

_IMMUTABLE = (str, bytes, int, float, bool, complex, type(None))
_IMMUTABLE_TYPES = frozenset(_IMMUTABLE)


def checked_reward_function(func, name: str, max_abs_reward: float = MAX_ABS_REWARD, timeout: float | None = None,
                            watchdog: StuckRewardWatchdog | None = None):
    """Wrap a reward function so that it scores what was generated, and its failures and bad results raise an error
    naming the function and the row.

    The wrapper has the same sync/async nature as `func` (an `async def` wrapper around anything TRL awaits: an
    `async def` function, a `functools.partial` of one, an instance whose `__call__` is `async def`), so TRL calls
    it the same way; its `__name__` is `name` (the name TRL logs the function under), and the attributes of `func`
    are copied onto it. On every call:

    - The function gets its own copy of every list argument (`prompts`, `completions`, `completion_ids` and the data
      set's columns, down to the messages' dicts; strings and numbers are immutable and shared), so one that edits
      them (reverses `completions` in place, rewrites a column) changes neither what the next reward function scores
      nor what TRL logs. `SHARED_REWARD_KWARGS` (the trainer state, `log_extra`, `log_metric`, the environments)
      are passed as they are. Measured cost per call, 512 chat completions with their token ids: about 40 ms at 1k
      tokens each, 150 ms at 4k (on a busy 2-core CPU; `copy.deepcopy` takes 6-8x longer), small next to generating
      them.
    - With `timeout` (seconds; `RPGConfig.rpg_reward_timeout`), a call that has not returned by then raises
      `TimeoutError` naming the function. A synchronous function then runs in a worker thread, with the caller's
      grad mode, CUDA device and context variables; Python cannot stop a thread, so a function that never returns
      is left running in it (a daemon thread: it does not keep the process alive). An `async` function is cancelled
      at its next `await` (one that blocks the event loop without awaiting cannot be interrupted).
    - An exception is re-raised as `RuntimeError` naming the function and the batch size. The function is not called
      again to find the failing row (it may be slow or have side effects), so the row is not identified. So are a
      `SystemExit` (`sys.exit(...)` in the function: it would end the run with its status, 0 meaning success, with
      nothing saved) and a `KeyboardInterrupt` the function raised itself (one caused by an interrupt signal, a
      Ctrl-C, stays a Ctrl-C).
    - With `watchdog` (`StuckRewardWatchdog`: runs of several processes), a call still running after its bound ends
      the process, naming the function (the other processes would otherwise wait for its rewards without a word).
    - The result must be a list/tuple (or other sequence), a 1-d numpy array or a 1-d tensor with one reward per
      completion of the batch TRL passed (a function that shortened its copy of `completions` is named as such); a
      dict, a string, a set, a generator, ... raises `ValueError` naming the function and the type.
    - Each reward must be a real number or None. None and NaN mean "not scored" by this function (TRL's convention;
      a row no function scores is left out of its group's baseline and gets advantage 0).
    - A reward must be finite in float32, the dtype TRL computes rewards in (1e300 is inf there), and at most
      `max_abs_reward` (default `MAX_ABS_REWARD` = 1e15) in magnitude, so that the float32 std of a group or batch
      cannot overflow; otherwise `ValueError` names the function, the row and the value.
    """
    if getattr(func, "_rpg_checked", False):
        return func
    if timeout is not None and not (isinstance(timeout, numbers.Real) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"`rpg_reward_timeout`={timeout!r} is not allowed; it must be a number of seconds > 0, or "
                         "None for no limit.")

    defined = defined_at(func)
    defined = f" `{name}` is defined at {defined}." if defined else ""

    def failed(error, kwargs):
        completions = kwargs.get("completions")
        batch = f" on a batch of {len(completions)} completions" if completions is not None else ""
        where = raised_at(error, func)
        return RuntimeError(
            f"Reward function `{name}` raised {type(error).__name__}: {error}{batch}. The failing row was not "
            "identified: RPGTrainer does not call a reward function again to find it, since it may be slow or have "
            "side effects (see the traceback above for where it failed). Return None for a completion the "
            f"function cannot score.{f' It raised at {where}.' if where else defined}")

    def exited(error, kwargs):
        completions = kwargs.get("completions")
        batch = f" on a batch of {len(completions)} completions" if completions is not None else ""
        where = raised_at(error, func)
        where = f" It raised at {where}." if where else defined
        if isinstance(error, KeyboardInterrupt):
            return RuntimeError(
                f"Reward function `{name}` raised KeyboardInterrupt itself{batch}; no interrupt signal (Ctrl-C) "
                "arrived, so this is the function's error, not an interruption of the run. Return None for a "
                f"completion the function cannot score.{where}")
        code = error.code
        status = 0 if code is None else code if isinstance(code, int) else 1
        return RuntimeError(
            f"Reward function `{name}` raised SystemExit({code!r}){batch} (sys.exit({code!r})): a reward function "
            f"cannot end the run, which would have stopped at once with exit status {status}"
            f"{' (success)' if status == 0 else ''} and nothing saved; it stops with this error instead. Return "
            f"rewards (None for a completion the function cannot score).{where}")

    def timed_out(kwargs):
        completions = kwargs.get("completions")
        batch = f" on a batch of {len(completions)} completions" if completions is not None else ""
        return TimeoutError(f"Reward function `{name}` did not return within {timeout:g} s{batch} "
                            f"(rpg_reward_timeout={timeout:g}). Make it faster or raise rpg_reward_timeout; a "
                            "function that waits on a service should give up on its own and return None for the "
                            f"completions it cannot score.{defined}")

    def check(rewards, kwargs, private):
        try:
            return check_rewards(rewards, name, kwargs.get("completions"), kwargs.get("prompts"), max_abs_reward,
                                 shortened=_shortened(kwargs, private))
        except ValueError as error:  # the same error, saying where the function is
            error.args = (f"{error}{defined}", *error.args[1:])
            raise

    watched = watchdog.watch if watchdog is not None else lambda name, kwargs: contextlib.nullcontext()
    if is_async_callable(func):
        async def wrapper(*args, **kwargs):
            private = private_reward_inputs(kwargs)
            try:
                task = asyncio.ensure_future(exits_as_errors(func(*args, **private)))
            except Exception as error:
                raise failed(error, kwargs) from error
            try:
                with watched(name, kwargs):
                    done, _ = await asyncio.wait({task}, timeout=timeout)
            except asyncio.CancelledError:  # the caller gave up: so does the function
                task.cancel()
                raise
            if not done:
                task.cancel()
                raise timed_out(kwargs)
            try:
                rewards = task.result()
            except RewardExited as error:
                raise exited(error.error, kwargs) from error.error
            except Exception as error:
                raise failed(error, kwargs) from error
            return check(rewards, kwargs, private)
    else:
        def wrapper(*args, **kwargs):
            private = private_reward_inputs(kwargs)
            try:
                with watched(name, kwargs):
                    rewards = call_here(func, args, private) if timeout is None else _call_in_thread(
                        func, args, private, timeout, name)
            except _TimedOut:
                raise timed_out(kwargs) from None
            except RewardExited as error:
                raise exited(error.error, kwargs) from error.error
            except Exception as error:
                raise failed(error, kwargs) from error
            return check(rewards, kwargs, private)

    functools.update_wrapper(wrapper, func)  # copies __module__, __doc__, ... and the attributes of `func`
    wrapper.__name__ = wrapper.__qualname__ = name  # TRL names a callable by `__name__` (class name for instances)
    wrapper._rpg_checked = True
    return wrapper


def _code_of(func):
    """The code object of a reward function (a function, a `functools.partial` of one, or an instance's
    `__call__`), or None (a built-in)."""
    while isinstance(func, functools.partial):
        func = func.func
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None and not inspect.isroutine(func):
        code = getattr(getattr(type(func), "__call__", None), "__code__", None)
    return code


def _shown_path(path: str) -> str:
    """`path` relative to the working directory when it is inside it, else as it is."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # on another drive
        return path
    return path if relative.startswith(os.pardir) else relative


def defined_at(func) -> str:
    """Where reward function `func` is defined, `file:line` ('' when Python cannot tell, as for a built-in)."""
    code = _code_of(func)
    return f"{_shown_path(code.co_filename)}:{code.co_firstlineno}" if code is not None else ""


_LIBRARY_PATHS = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_path(name) for name in
                                                              ("stdlib", "platstdlib", "purelib", "platlib")} if p)


def raised_at(error: BaseException, func) -> str:
    """Where reward function `func` raised `error`: `file:line, in function` of the innermost frame of its traceback
    that is the user's code (not Python's, an installed package's or trl_rpg's), else the innermost in `func`'s
    own file; '' if there is none. The function named is the innermost named one (not a `<listcomp>`)."""
    frames = traceback.extract_tb(error.__traceback__)
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # trl_rpg/
    code = _code_of(func)

    def users(frame):
        path = os.path.realpath(frame.filename)
        return not path.startswith(_LIBRARY_PATHS + (package,)) and not frame.filename.startswith("<")

    mine = [f for f in frames if users(f)] or [f for f in frames if code is not None and
                                                f.filename == code.co_filename]
    if not mine:
        return ""
    named = next((f.name for f in reversed(mine) if not f.name.startswith("<")), mine[-1].name)  # not <listcomp>
    return f"{_shown_path(mine[-1].filename)}:{mine[-1].lineno}, in {named}"


def private_reward_inputs(kwargs: dict) -> dict:
    """The keyword arguments of one reward-function call with every list argument copied (`private_copy`), the
    trainer's own objects (`SHARED_REWARD_KWARGS`) and anything that is not a list passed as they are."""
    return {key: private_copy(value) if isinstance(value, list) and key not in SHARED_REWARD_KWARGS else value
            for key, value in kwargs.items()}


def private_copy(value):
    """A copy of `value` that shares nothing mutable with it: lists, tuples and dicts are copied all the way down,
    strings and numbers are shared (they are immutable), anything else is deep-copied."""
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, list):
        if set(map(type, value)) <= _IMMUTABLE_TYPES:  # the common case (token ids, texts): C-level passes only
            return list(value)
        return [private_copy(item) for item in value]
    if isinstance(value, dict):
        return {key: private_copy(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(private_copy(item) for item in value)
    return copy.deepcopy(value)


def _shortened(kwargs: dict, private: dict) -> str:
    """Which of `prompts` / `completions` the function shortened (its copies have fewer items), for the error."""
    names = [key for key in ("prompts", "completions")
             if isinstance(kwargs.get(key), list) and len(private[key]) != len(kwargs[key])]
    return " and ".join(f"`{key}` (to {len(private[key])} items)" for key in names)


class _TimedOut(Exception):
    """A reward-function call in a worker thread did not return in time."""


def _call_in_thread(func, args, kwargs, timeout: float, name: str):
    """`func(*args, **kwargs)` in a daemon thread with the caller's grad mode, CUDA device and context variables;
    its result or exception, or `_TimedOut` after `timeout` seconds (the thread is left running)."""
    outcome = {}
    context = contextvars.copy_context()
    grad_enabled = torch.is_grad_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def run():
        try:
            if device is not None:
                torch.cuda.set_device(device)
            with torch.set_grad_enabled(grad_enabled):
                outcome["rewards"] = context.run(func, *args, **kwargs)
        except BaseException as error:  # handed to the caller
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"reward function {name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise _TimedOut()
    if "error" in outcome:  # no signal reaches a worker thread: its KeyboardInterrupt is the function's own
        error = outcome["error"]
        raise RewardExited(error) if isinstance(error, (SystemExit, KeyboardInterrupt)) else error
    return outcome["rewards"]


def check_rewards(rewards, name: str, completions=None, prompts=None,
                  max_abs_reward: float = MAX_ABS_REWARD, shortened: str = "") -> list[float | None]:
    """Check the result of reward function `name` and return it as a list of floats and None (= not scored).

    `completions` (optional) gives the expected length; `prompts` (optional) is quoted in the errors; `shortened`
    names the arguments the function shortened (for the length error). See `checked_reward_function` for the rules.
    """
    values = _reward_values(rewards, name)
    if completions is not None and len(values) != len(completions):
        cause = (f"; it shortened its copy of {shortened}: a reward function must return one reward per completion "
                 "it was given, None for one it does not score") if shortened else ""
        raise ValueError(f"Reward function `{name}` returned {len(values)} rewards for {len(completions)} "
                         f"completions{cause}.")
    return [_checked_reward(value, name, row, prompts, max_abs_reward) for row, value in enumerate(values)]


def _reward_values(rewards, name: str) -> list:
    """The rewards as a list, if `rewards` is one of the accepted containers."""
    def wrong(what):
        return ValueError(f"Reward function `{name}` returned {what}; a reward function must return a list (or "
                          "tuple, 1-d numpy array, 1-d tensor) with one number per completion, None or NaN for 'not "
                          "scored'.")

    if inspect.isawaitable(rewards):
        if inspect.iscoroutine(rewards):
            rewards.close()  # never awaited: close it to silence the RuntimeWarning
        raise wrong(f"an awaitable ({type(rewards).__name__}) from a call TRL treats as synchronous (make the "
                    "function, or the class's `__call__`, `async def` so that TRL awaits it)")
    if isinstance(rewards, (torch.Tensor, np.ndarray)):
        if rewards.ndim != 1:
            raise wrong(f"a {type(rewards).__name__} of shape {tuple(rewards.shape)}")
        if rewards.dtype.is_complex if isinstance(rewards, torch.Tensor) else np.iscomplexobj(rewards):
            raise wrong(f"a complex {type(rewards).__name__}")
        return (rewards.detach().cpu() if isinstance(rewards, torch.Tensor) else rewards).tolist()
    if isinstance(rewards, (str, bytes)) or not isinstance(rewards, collections.abc.Sequence):  # not a dict
        raise wrong(f"a {type(rewards).__name__}")
    return list(rewards)


def _checked_reward(value, name, row, prompts, max_abs_reward) -> float | None:
    """One reward as a float (None when not scored), or `ValueError` naming the function and the row."""
    def where():
        prompt = f" (prompt: {prompts[row]!r:.200})" if prompts is not None and row < len(prompts) else ""
        return f"for row {row}{prompt}"

    if value is None:
        return None
    number = _as_real(value)
    if number is None:
        raise ValueError(f"Reward function `{name}` returned {value!r:.100} {where()}; rewards must be real numbers "
                         "or None.")
    try:
        number = float(number)
        shown = repr(number)
    except OverflowError:  # an int beyond float64
        shown, number = f"an integer of {number.bit_length()} bits", math.inf
    if math.isnan(number):
        return None  # NaN: not scored, like None
    with np.errstate(over="ignore"):
        overflows_float32 = math.isinf(np.float32(number))
    if overflows_float32:
        raise ValueError(f"Reward function `{name}` returned {shown} {where()}; rewards must be finite in float32, "
                         f"the dtype TRL computes rewards in (|reward| <= {max_abs_reward:g} is accepted; use None "
                         "for 'not scored').")
    if abs(number) > max_abs_reward:
        raise ValueError(f"Reward function `{name}` returned {shown} {where()}; rewards must be at most "
                         f"{max_abs_reward:g} in magnitude: TRL normalises rewards by a standard deviation computed "
                         "in float32, which larger rewards can overflow to inf (making every advantage 0). Rescale "
                         "the reward.")
    return number


def _as_real(value):
    """`value` if it is a real number (Python, numpy, or a 0-d array/tensor of one), else None."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 0 or (value.dtype.is_complex if isinstance(value, torch.Tensor) else np.iscomplexobj(value)):
            return None
        value = value.item()
    if isinstance(value, (numbers.Real, np.bool_)):
        return value
    return None


#: Logged once, at the first training batch that no reward function scored.
UNSCORED_BATCH_WARNING = (
    "RPGTrainer: no reward function scored any completion of a training batch (every reward is None or NaN), so it "
    "carries no learning signal. Check that the data set has the columns your reward functions read (e.g. "
    "math_reward reads `ground_truth`, `reward_model` or `answer`). A run in which no batch is scored fails at the "
    "end.")


@dataclass
class ScoringTally:
    """Training generation batches seen in one `train()` call, and how many had at least one scored reward: a run
    in which no batch is scored trains on nothing and must not succeed."""

    batches: int = 0
    scored: int = 0

    def add(self, rewards_per_round: list[torch.Tensor]) -> bool:
        """Count one batch (its rounds' gathered rewards); returns whether it is the first one left unscored."""
        self.batches += 1
        if any(not torch.isnan(r).all() for r in rewards_per_round):
            self.scored += 1
            return False
        return self.batches - self.scored == 1
