"""Grading an answer: the one scoring rule shared by the training reward (:func:`trl_rpg.rewards.math_reward`) and
the benchmark evaluation (:mod:`trl_rpg.evaluation.evaluate`), built from three modules of one job each:

* :mod:`trl_rpg.rewards.extraction` -- :func:`extract_answer`: the last answer a completion commits to (an ``Answer:``
  line or a ``\\boxed{}``).
* :mod:`trl_rpg.rewards.normalization` -- :func:`normalize_answer`: the canonical string used for exact comparison.
* :mod:`trl_rpg.rewards.verification` -- :func:`is_equivalent`: ``math-verify`` equivalence (if installed, with a
  timeout) OR normalised-string / exact-number equality.

This module scores with them:

* :func:`completion_to_text` -- the text of a completion (a string or a conversational message list).
* :func:`reference_answer` -- a row's reference answer (:data:`ANSWER_COLUMNS`: ``ground_truth``,
  ``reward_model.ground_truth``, ``answer``).
* :func:`score_completion` / :func:`score_answer` -- the score of a completion / of an extracted answer.

Every public name of the three is importable from here too (``from trl_rpg.rewards.grading import extract_answer``).
No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .extraction import extract_answer
from .normalization import normalize_answer
from .verification import MATH_VERIFY_TIMEOUT_S, MAX_SYMBOLIC_ANSWER_CHARS, is_equivalent

__all__ = [
    "ANSWER_COLUMNS",
    "MATH_VERIFY_TIMEOUT_S",
    "MAX_SYMBOLIC_ANSWER_CHARS",
    "completion_to_text",
    "extract_answer",
    "is_equivalent",
    "normalize_answer",
    "reference_answer",
    "score_answer",
    "score_completion",
]


def completion_to_text(completion: Any) -> str:
    """Text of a completion given as a string or as a conversational list of messages.

    For a message list the content of the last ``assistant`` message (else the last message) is used; multimodal
    content (a list of ``{"type": "text", "text": ...}`` parts) is concatenated.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        content = completion.get("content", "")
    else:
        messages = list(completion)
        if not messages:
            return ""
        assistant = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"]
        message = assistant[-1] if assistant else messages[-1]
        content = message.get("content", "") if isinstance(message, Mapping) else message
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping):
            if part.get("type", "text") == "text":
                parts.append(str(part.get("text", "")))
        else:
            parts.append(str(part))
    return "".join(parts)


#: The dataset columns that hold a row's reference answer, in the order they are read: a ``ground_truth`` string (or
#: list of acceptable answers), a verl/DAPO ``reward_model`` dict with a ``"ground_truth"`` key, a plain ``answer``.
ANSWER_COLUMNS = ("ground_truth", "reward_model", "answer")


def _reference_values(value: Any) -> list[str]:
    """The non-empty reference strings in one column value (a string, a number, or a list of them)."""
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    return [str(v).strip() for v in values if v is not None and str(v).strip()]


def reference_answer(row: Mapping[str, Any]) -> str | list[str] | None:
    """The reference answer of one dataset row, read from the first of :data:`ANSWER_COLUMNS` that holds one.

    ``row["ground_truth"]``, else ``row["reward_model"]["ground_truth"]``, else ``row["answer"]``; empty strings and
    ``None`` count as missing.  Returns the stripped string, a list of strings when the column holds several
    acceptable answers, or ``None`` when the row has no reference.
    """
    reward_model = row.get("reward_model")
    for value in (row.get("ground_truth"),
                  reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None,
                  row.get("answer")):
        values = _reference_values(value)
        if values:
            return values if isinstance(value, (list, tuple)) else values[0]
    return None


def score_answer(answer: str | None, reference: Any) -> float | None:
    """Score an extracted answer against a reference: ``1.0`` if :func:`is_equivalent` to it (or, for a list of
    references, to any of them), ``0.0`` if not or if there is no answer, ``None`` if there is no reference."""
    references = _reference_values(reference)
    if not references:
        return None
    if answer is None:
        return 0.0
    return 1.0 if any(is_equivalent(answer, r) for r in references) else 0.0


def score_completion(completion: Any, reference: Any) -> float | None:
    """Score a completion (a string or a conversational message list): :func:`extract_answer` of its text, then
    :func:`score_answer`.  This is the rule of both the training reward :func:`math_reward` and the benchmark
    evaluation (:mod:`trl_rpg.evaluation.evaluate`)."""
    return score_answer(extract_answer(completion_to_text(completion)), reference)
