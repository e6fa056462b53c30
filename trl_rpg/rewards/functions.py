"""The reward functions: math correctness with the values of your choice, and DAPO's soft overlong punishment (TRL's).

* :func:`math_reward` -- TRL reward function, ``1.0`` if correct, ``0.0`` if not (TRL's ``accuracy_reward``
  convention), ``None`` if the row has no reference; the scoring rule is :mod:`trl_rpg.rewards.grading`'s.
* :func:`paper_math_reward` -- the same grading with the paper's values, ``+1.0`` / ``-1.0`` (the RPG authors' scorer,
  ``verl/utils/reward_score/math_dapo.py`` of github.com/complex-reasoning/RPG, returns ``1.0 if correct else -1.0``).
* :func:`make_math_reward` -- the same grading with any values (TRL-style factory, like
  ``trl.rewards.get_soft_overlong_punishment``).
* :func:`make_overlong_punishment` -- DAPO soft overlong punishment, re-exported from TRL.

The values matter under RPG's default ``scale_rewards="none"`` (advantage = reward - group mean, not divided by the
std): ``+1/-1`` doubles every advantage against ``1/0``, so ``beta``, the overlong penalty (0 to -1) and
``max_grad_norm`` weigh half as much against the reward signal. The paper's settings are for ``+1/-1``.

The module does not import torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .grading import (
    ANSWER_COLUMNS,
    _reference_values,
    completion_to_text,
    extract_answer,
    reference_answer,
    score_answer,
)

__all__ = ["make_math_reward", "make_overlong_punishment", "math_reward", "paper_math_reward"]

logger = logging.getLogger(__name__)


def _column(values: Sequence[Any] | None, n: int, name: str) -> list[Any]:
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"`{name}` has {len(values)} entries but there are {n} completions.")
    return values


def _graded(completions, ground_truth, reward_model, answer, correct: float, incorrect: float,
            log_extra) -> list[float | None]:
    """`correct` / `incorrect` per completion (`None` without a reference), logging the extracted answers."""
    n = len(completions)
    columns = {name: _column(values, n, name) for name, values in
               (("ground_truth", ground_truth), ("reward_model", reward_model), ("answer", answer))}
    rewards: list[float | None] = []
    extracted: list[str] = []
    references: list[str] = []
    for index, completion in enumerate(completions):
        reference = reference_answer({name: values[index] for name, values in columns.items()})
        prediction = extract_answer(completion_to_text(completion))
        score = score_answer(prediction, reference)
        rewards.append(None if score is None else correct if score == 1.0 else incorrect)
        extracted.append("" if prediction is None else prediction)
        references.append(" | ".join(_reference_values(reference)))
    if callable(log_extra):
        try:
            log_extra("extracted_answer", extracted)
            log_extra("ground_truth", references)
        except Exception:  # logging must never break training
            logger.debug("log_extra failed", exc_info=True)
    return rewards


def math_reward(
    completions: Sequence[Any],
    ground_truth: Sequence[Any] | None = None,
    reward_model: Sequence[Mapping[str, Any] | None] | None = None,
    answer: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """TRL reward function: 1.0 if the completion's final answer matches the reference, else 0.0.

    These are the values of TRL's ``accuracy_reward``; the paper's are +1 / -1 (:func:`paper_math_reward`; any other
    pair: :func:`make_math_reward`). The reference of each row is :func:`reference_answer`: the ``ground_truth``
    column, else ``reward_model``'s ``"ground_truth"``, else ``answer``; the completion is scored by
    :func:`score_completion` (how that differs from the authors' strict ``Answer:`` match: docs/rewards.md).

    Args:
        completions: completions as strings, or as conversational message lists (``[{"role": "assistant",
            "content": ...}]``).
        ground_truth: dataset column with the reference answer of each row (a string; a list of strings means "any
            of these").
        reward_model: dataset column in the verl/DAPO parquet format: dicts with a ``"ground_truth"`` key.
        answer: a plain answer column (as in ``problem``/``answer`` data sets).
        **kwargs: other dataset columns and trainer-provided arguments (``prompts``, ``completion_ids``,
            ``log_extra``, ...).  If the trainer passes a ``log_extra`` callable, the extracted answers and the
            references are logged to the completions table.

    Returns:
        One value per completion: ``1.0`` (correct), ``0.0`` (wrong or no extractable answer), or ``None`` when the
        row has no reference answer (TRL treats ``None`` as "not scored by this function").
    """
    return _graded(completions, ground_truth, reward_model, answer, 1.0, 0.0, kwargs.get("log_extra"))


math_reward.__name__ = "math_reward"
math_reward.__qualname__ = "math_reward"
#: The dataset columns math_reward reads (any one of them): see :func:`check_reward_columns`.
math_reward.required_columns = ANSWER_COLUMNS
math_reward.values = (1.0, 0.0)


def make_math_reward(correct: float = 1.0, incorrect: float = 0.0, *, name: str = "math_reward") -> Callable:
    """:func:`math_reward`'s grading with the values of your choice: a TRL reward function named ``name`` (TRL logs
    it as ``rewards/<name>/mean``; ``dynamic_sampling_metric`` refers to it by that name) that gives ``correct`` to
    a correct final answer, ``incorrect`` to any other completion and ``None`` to a row without a reference.

    ``make_math_reward(1.0, -1.0)`` is the paper's reward (:func:`paper_math_reward`, under the name
    ``"paper_math_reward"``). Raises ``ValueError`` unless both values are finite numbers with ``correct >
    incorrect`` (otherwise the policy would be pushed towards wrong answers, or learn nothing).
    """
    for label, value in (("correct", correct), ("incorrect", incorrect)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"make_math_reward: `{label}`={value!r} is not allowed; it must be a finite number.")
    if not correct > incorrect:
        raise ValueError(f"make_math_reward: `correct`={correct!r} must be greater than `incorrect`={incorrect!r} "
                         "(the reward of a correct answer above that of a wrong one).")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"make_math_reward: `name`={name!r} is not allowed; use a Python identifier (TRL logs "
                         "the reward under it).")
    correct, incorrect = float(correct), float(incorrect)

    def reward(completions, ground_truth=None, reward_model=None, answer=None, **kwargs):
        return _graded(completions, ground_truth, reward_model, answer, correct, incorrect, kwargs.get("log_extra"))

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = (f"{name}: {correct} if the completion's final answer matches the reference, else {incorrect} "
                      "(None without a reference); trl_rpg.rewards.make_math_reward.")
    reward.required_columns = ANSWER_COLUMNS
    reward.values = (correct, incorrect)
    return reward


#: The paper's reward: +1 for a correct final answer, -1 otherwise (as the RPG authors' scorer), graded as
#: :func:`math_reward` grades. At module level, so it pickles by name.
paper_math_reward = make_math_reward(1.0, -1.0, name="paper_math_reward")


def make_overlong_punishment(max_completion_length: int, soft_punish_cache: int) -> Callable[..., list[float]]:
    """DAPO soft overlong punishment (Eq. 13 of the DAPO paper), as implemented by TRL.

    Returns TRL's ``trl.rewards.get_soft_overlong_punishment(max_completion_length, soft_punish_cache)``: a picklable
    reward function of ``completion_ids`` giving ``0`` for completions of at most ``max_completion_length -
    soft_punish_cache`` tokens, a linear penalty down to ``-1`` up to ``max_completion_length`` tokens, and ``-1``
    beyond.  Its ``__name__`` is ``"soft_overlong_punishment_reward"``.
    """
    if max_completion_length <= 0:
        raise ValueError(f"max_completion_length must be positive, got {max_completion_length}.")
    if not 0 <= soft_punish_cache <= max_completion_length:
        raise ValueError(
            f"soft_punish_cache must be in [0, max_completion_length={max_completion_length}], "
            f"got {soft_punish_cache}."
        )
    from trl.rewards import get_soft_overlong_punishment  # lazy: trl imports torch

    return get_soft_overlong_punishment(max_completion_len=max_completion_length, soft_punish_cache=soft_punish_cache)
