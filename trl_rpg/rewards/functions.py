"""The reward functions: the paper's math reward, and DAPO's soft overlong punishment (TRL's).

* :func:`math_reward` -- TRL reward function, ``1.0`` if correct, ``0.0`` if not, ``None`` if the row has no reference
  (the scoring rule is :mod:`trl_rpg.rewards.grading`'s).
* :func:`make_overlong_punishment` -- DAPO soft overlong punishment, re-exported from TRL.

The module does not import torch.
"""

from __future__ import annotations

import logging
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

__all__ = ["make_overlong_punishment", "math_reward"]

logger = logging.getLogger(__name__)


def _column(values: Sequence[Any] | None, n: int, name: str) -> list[Any]:
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"`{name}` has {len(values)} entries but there are {n} completions.")
    return values


def math_reward(
    completions: Sequence[Any],
    ground_truth: Sequence[Any] | None = None,
    reward_model: Sequence[Mapping[str, Any] | None] | None = None,
    answer: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """TRL reward function: 1.0 if the completion's final answer matches the reference, else 0.0.

    The reference of each row is :func:`reference_answer`: the ``ground_truth`` column, else ``reward_model``'s
    ``"ground_truth"``, else ``answer``; the completion is scored by :func:`score_completion`.

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
    n = len(completions)
    columns = {name: _column(values, n, name) for name, values in
               (("ground_truth", ground_truth), ("reward_model", reward_model), ("answer", answer))}
    rewards: list[float | None] = []
    extracted: list[str] = []
    references: list[str] = []
    for index, completion in enumerate(completions):
        reference = reference_answer({name: values[index] for name, values in columns.items()})
        prediction = extract_answer(completion_to_text(completion))
        rewards.append(score_answer(prediction, reference))
        extracted.append("" if prediction is None else prediction)
        references.append(" | ".join(_reference_values(reference)))
    log_extra = kwargs.get("log_extra")
    if callable(log_extra):
        try:
            log_extra("extracted_answer", extracted)
            log_extra("ground_truth", references)
        except Exception:  # logging must never break training
            logger.debug("log_extra failed", exc_info=True)
    return rewards


math_reward.__name__ = "math_reward"
math_reward.__qualname__ = "math_reward"
#: The dataset columns math_reward reads (any one of them): see :func:`check_reward_columns`.
math_reward.required_columns = ANSWER_COLUMNS


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
