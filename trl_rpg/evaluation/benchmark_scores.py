"""Scores of a benchmark's completions: each completion against its reference answer (:func:`score_completions`,
the training reward's rule) and their mean@k over problems (:func:`mean_at_k`). No torch, no transformers.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

from ..rewards import score_completion

__all__ = ["mean_at_k", "score_completions"]


def score_completions(completions: Sequence[Any], ground_truths: Sequence[Any]) -> list[float]:
    """Score each completion (string or chat message list) against its reference answer: 1.0 correct, 0.0 wrong.

    The rule is :func:`~trl_rpg.rewards.score_completion`, the training reward's: the last answer the completion
    commits to (:func:`~trl_rpg.rewards.extract_answer`; no answer counts as wrong), compared with
    :func:`~trl_rpg.rewards.is_equivalent`.  A reference may be a list of acceptable answers.  Raises ``ValueError`` on
    a length mismatch or a missing reference.
    """
    if len(completions) != len(ground_truths):
        raise ValueError(f"Got {len(completions)} completions but {len(ground_truths)} ground truths.")
    scores = []
    for index, (completion, reference) in enumerate(zip(completions, ground_truths, strict=True)):
        score = score_completion(completion, reference)
        if score is None:
            raise ValueError(f"Missing ground truth for completion {index}.")
        scores.append(score)
    return scores


def mean_at_k(
    scores: Sequence[float], problem_ids: Sequence[Hashable], *, allow_uneven: bool = False
) -> dict[str, Any]:
    """mean@k: the average over problems of each problem's mean score over its k samples.

    Args:
        scores: one score per sample (1.0 correct / 0.0 wrong; fractional scores are averaged as they are).
        problem_ids: the problem of each sample.
        allow_uneven: by default all problems must have the same number k of samples (else ``ValueError``).  With
            ``allow_uneven=True`` problems may have different counts; each problem still weighs equally and ``k`` is
            ``None``.

    Returns:
        ``{"mean_at_k": float, "k": int | None, "num_problems": int, "num_samples": int, "pass_at_k": float,
        "per_problem": {problem_id: mean score}}`` where ``pass_at_k`` is the fraction of problems with at least one
        correct sample (score >= 0.5) and ``num_samples`` the total number of scored samples.  ``per_problem`` is in
        order of first appearance.
    """
    if len(scores) != len(problem_ids):
        raise ValueError(f"Got {len(scores)} scores but {len(problem_ids)} problem ids.")
    if len(scores) == 0:
        raise ValueError("mean_at_k needs at least one score.")
    groups: dict[Hashable, list[float]] = {}
    for score, pid in zip(scores, problem_ids, strict=True):
        if score is None or (isinstance(score, float) and math.isnan(score)):
            raise ValueError(f"Invalid score {score!r} for problem {pid!r}.")
        groups.setdefault(pid, []).append(float(score))
    counts = {len(v) for v in groups.values()}
    if len(counts) > 1 and not allow_uneven:
        raise ValueError(
            f"Problems have different numbers of samples ({sorted(counts)}); pass allow_uneven=True to average anyway."
        )
    per_problem = {pid: sum(v) / len(v) for pid, v in groups.items()}
    return {
        "mean_at_k": sum(per_problem.values()) / len(per_problem),
        "k": counts.pop() if len(counts) == 1 else None,
        "num_problems": len(per_problem),
        "num_samples": len(scores),
        "pass_at_k": sum(any(s >= 0.5 for s in v) for v in groups.values()) / len(groups),
        "per_problem": per_problem,
    }
