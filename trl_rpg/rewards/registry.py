"""Reward functions by name (the ``--reward_funcs`` of ``trl-rpg train``), and the data-set columns they read.

* :data:`REWARD_FUNCS` / :func:`register_reward` / :func:`get_reward_func` -- reward functions by name: the library's
  (``math_reward``, ``paper_math_reward``, ``soft_overlong_punishment``) and TRL's (``accuracy_reward``,
  ``reasoning_accuracy_reward``, ``think_format_reward``).  The command line adds the toy task's ``toy_reward``
  (:mod:`trl_rpg.cli`).
* :func:`check_reward_columns` -- fail early when a data set lacks the columns the reward functions read
  (:func:`reward_columns`: a function's ``required_columns``).

The module does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .functions import make_overlong_punishment, math_reward, paper_math_reward
from .grading import ANSWER_COLUMNS

__all__ = ["REWARD_FUNCS", "RewardEntry", "check_reward_columns", "get_reward_func", "register_reward",
           "reward_columns", "reward_func_name"]


@dataclass(frozen=True)
class RewardEntry:
    """A reward function selectable by name: ``build(**settings)`` returns the callable.

    ``settings`` are the run's ``max_completion_length`` and ``soft_punish_cache`` (a builder takes what it needs);
    ``columns`` are the dataset columns the function reads (any one of them; empty: none).
    """

    name: str
    build: Callable[..., Callable]
    columns: tuple[str, ...] = ()
    help: str = ""


#: Registry of reward functions by name: name -> :class:`RewardEntry` (filled by :func:`register_reward`).
REWARD_FUNCS: dict[str, RewardEntry] = {}


def register_reward(name: str, *, columns: Sequence[str] = (), help: str = ""):
    """Decorator registering a reward-function builder under ``name`` (the style of
    :func:`trl_rpg.objectives.per_token.register_objective`).  The builder is called with the run's settings as keyword
    arguments and returns the reward callable."""

    def decorator(build):
        REWARD_FUNCS[name] = RewardEntry(name=name, build=build, columns=tuple(columns), help=help)
        return build

    return decorator


def get_reward_func(name: str, **settings: Any) -> Callable:
    """The reward function registered as ``name``, built with ``settings`` (``max_completion_length``,
    ``soft_punish_cache``), with its dataset columns declared (:func:`check_reward_columns` reads them).  Raises
    ``ValueError`` naming the registered names (and the closest one) for an unknown name."""
    entry = REWARD_FUNCS.get(name)
    if entry is None:
        import difflib

        close = difflib.get_close_matches(name, list(REWARD_FUNCS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown reward function {name!r}: use one of {list(REWARD_FUNCS)} or a dotted import path "
                         f"such as 'my_lib.rewards.custom_reward'.{hint}")
    func = entry.build(**settings)
    if entry.columns and reward_columns(func) == ():
        func.required_columns = entry.columns
    return func


def reward_columns(func: Any) -> tuple[str, ...]:
    """The dataset columns a reward function declares it reads (its ``required_columns`` attribute; it needs any one
    of them), or ``()`` when it declares none (then it is not checked)."""
    declared = getattr(func, "required_columns", None)
    if declared is None:
        return ()
    return (declared,) if isinstance(declared, str) else tuple(declared)


def reward_func_name(func: Any) -> str:
    """A readable name of a reward function (a function, a ``functools.partial``, a callable object, a model id)."""
    if isinstance(func, str):
        return func
    inner = getattr(func, "func", func)  # functools.partial
    return getattr(inner, "__name__", None) or type(inner).__name__


def check_reward_columns(reward_funcs: Any, column_names: Sequence[str] | None, name: str | None = None) -> None:
    """Check that a data set has the columns the reward functions read, before any model is loaded.

    Args:
        reward_funcs: a reward function or a list of them (any callables, model ids or modules; only those that
            declare ``required_columns`` are checked, see :func:`reward_columns`).
        column_names: the data set's columns (``dataset.column_names``); ``None`` (e.g. a streamed data set whose
            columns are unknown) skips the check.
        name: what the error calls the data set (e.g. ``"eval_dataset['aime']"``); ``None``: "the data set".

    Raises:
        ValueError: naming, for each reward function that finds none of its columns, the columns it looks for, and
            the columns the data set has.
    """
    if column_names is None:
        return
    funcs = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs or [])
    present = list(column_names)
    missing = []
    for func in funcs:
        needed = reward_columns(func)
        if needed and not any(column in present for column in needed):
            looked_for = f"the column {needed[0]!r}" if len(needed) == 1 else f"one of the columns {list(needed)}"
            missing.append(f"reward function {reward_func_name(func)!r} reads {looked_for}")
    if missing:
        called = "the data set" if name is None else f"`{name}`"
        raise ValueError(f"{called[0].upper()}{called[1:]} lacks the columns its reward functions read: "
                         f"{'; '.join(missing)}; {called} has the columns {present}. Rename or add a column, or "
                         "choose reward functions that read the columns you have.")


# ---------------------------------------------------------------------------------------------------------------------
# The registered reward functions
# ---------------------------------------------------------------------------------------------------------------------


@register_reward("math_reward", columns=ANSWER_COLUMNS,
                 help="1 if the final answer (`Answer:` line or \\boxed{}) matches the reference (math-verify, else "
                      "normalised string), else 0; reads `ground_truth`, `reward_model.ground_truth` or `answer` (the "
                      "default)")
def _build_math_reward(**settings: Any) -> Callable:
    return math_reward


@register_reward("paper_math_reward", columns=ANSWER_COLUMNS,
                 help="math_reward's grading with the paper's values: +1 correct, -1 otherwise (the RPG authors' "
                      "scorer)")
def _build_paper_math_reward(**settings: Any) -> Callable:
    return paper_math_reward


@register_reward("soft_overlong_punishment",
                 help="DAPO's soft overlong punishment (uses max_completion_length and soft_punish_cache)")
def _build_soft_overlong_punishment(*, max_completion_length: int, soft_punish_cache: int, **settings: Any):
    return make_overlong_punishment(max_completion_length, min(soft_punish_cache, max_completion_length))


def _register_trl_reward(name: str, columns: tuple[str, ...], help: str) -> None:
    def build(**settings: Any) -> Callable:
        import trl.rewards  # lazy: trl imports torch

        return getattr(trl.rewards, name)

    register_reward(name, columns=columns, help=help)(build)


_register_trl_reward("accuracy_reward", ("solution",), "TRL's math-verify accuracy (reads `solution`)")
_register_trl_reward("reasoning_accuracy_reward", ("solution",),
                     "TRL's accuracy after the reasoning block (reads `solution`)")
_register_trl_reward("think_format_reward", (), "TRL's <think>...</think> format reward")
