"""The toy task: chained single-digit addition/subtraction such as ``"7+5-3=?"``, its worked solutions (correct, or
an imperfect teacher's), the fixed train / held-out split, the data set and the verifiable reward."""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

__all__ = [
    "FIRST_OPERAND_RANGE",
    "MAX_COMPLETION_LENGTH",
    "NUM_TERMS",
    "OPERAND_RANGE",
    "SPLIT_SEED",
    "TEACHER_SLIP_RATE",
    "TEST_FRACTION",
    "all_problems",
    "extract_answer",
    "make_dataset",
    "solve",
    "split_problems",
    "toy_reward",
    "worked_solution",
]

#
# Problems are chains like "7+5-3": a first operand in FIRST_OPERAND_RANGE followed by NUM_TERMS-1 steps "+d"/"-d"
# with d in OPERAND_RANGE, keeping every intermediate result >= 0 (2025 problems; 506 held out). The reference
# completion works step by step: "7+5=12,12-3=9"; the number after the last "=" is the final answer. A step
# "crosses" when it needs a carry (units digits sum to >= 10) or a borrow (units digit of the running value smaller
# than d). Of the held-out problems 38% have no crossing step, 41% one and 20% two.
#
# The SFT warm-up first shows correct solutions, then imitates an *imperfect teacher* that, on a crossing step,
# makes a classic mistake with probability ``slip_rate`` (a forgotten carry, 7+5 -> 2; smaller-from-larger units
# on a borrow, 12-3 -> 11) and carries on from the wrong value. The warmed-up model therefore solves the
# no-crossing problems, greedily gets most crossing problems wrong (held-out greedy accuracy ~40%), but samples
# the right carry/borrow about a quarter of the time at temperature 1: groups of 8 samples have mixed rewards, and
# a verifiable-reward RL run quickly learns to carry/borrow properly, which transfers to the held-out problems
# (with RECOMMENDED_RL_ARGS: ~40% -> 68-79% after 25 steps, 77-84% after 200). Teacher chains may go negative
# after a slip ("7+5=2,2-8=-6"); the correct ones never do.

NUM_TERMS = 3  # operands per problem, e.g. "7+5-3"
FIRST_OPERAND_RANGE = (0, 9)  # inclusive range of the first operand
OPERAND_RANGE = (1, 9)  # inclusive range of the later operands
TEST_FRACTION = 0.25  # share of all problems held out (never in the train split)
SPLIT_SEED = 1234  # fixed: the split never depends on a caller's seed
TEACHER_SLIP_RATE = 0.7  # probability that the imperfect teacher fumbles a carry/borrow step
MAX_COMPLETION_LENGTH = 20  # longest reference completion is 15 characters + eos


def _task_settings(num_terms=None, first_operand_range=None, operand_range=None) -> tuple:
    return (
        NUM_TERMS if num_terms is None else int(num_terms),
        tuple(FIRST_OPERAND_RANGE if first_operand_range is None else first_operand_range),
        tuple(OPERAND_RANGE if operand_range is None else operand_range),
    )


def _crosses(value: int, op: str, d: int) -> bool:
    """Whether ``value op d`` needs a carry (``+``) or a borrow (``-``)."""
    return (value % 10) + d >= 10 if op == "+" else (value % 10) < d


def all_problems(num_terms: int | None = None, first_operand_range=None, operand_range=None) -> list[str]:
    """Every valid problem expression (all intermediate results >= 0), in a fixed order."""
    num_terms, (f_lo, f_hi), (lo, hi) = _task_settings(num_terms, first_operand_range, operand_range)
    problems = []
    for first in range(f_lo, f_hi + 1):
        for rest in itertools.product("+-", range(lo, hi + 1), repeat=num_terms - 1):
            text, value, ok = str(first), first, True
            for op, d in zip(rest[0::2], rest[1::2]):
                value = value + d if op == "+" else value - d
                if value < 0:
                    ok = False
                    break
                text += f"{op}{d}"
            if ok:
                problems.append(text)
    return problems


def split_problems(test_fraction: float = TEST_FRACTION, **task_kw) -> dict[str, list[str]]:
    """Fixed, seed-independent partition of all problems into disjoint ``"train"`` and ``"test"`` pools."""
    pool = sorted(all_problems(**task_kw))
    random.Random(SPLIT_SEED).shuffle(pool)
    n_test = round(len(pool) * test_fraction)
    return {"test": sorted(pool[:n_test]), "train": sorted(pool[n_test:])}


def _parse_expression(expr: str) -> tuple[int, list[tuple[str, int]]]:
    expr = expr.split("=")[0]
    tokens = re.findall(r"\d+|[+-]", expr)
    first = int(tokens[0])
    steps = [(tokens[i], int(tokens[i + 1])) for i in range(1, len(tokens) - 1, 2)]
    return first, steps


def solve(expr: str) -> int:
    """Value of an expression such as ``"7+5-3"`` (a trailing ``"=?"`` is ignored)."""
    value, steps = _parse_expression(expr)
    for op, d in steps:
        value = value + d if op == "+" else value - d
    return value


def _slip(value: int, op: str, d: int) -> int:
    """The teacher's classic mistakes: a forgotten carry (7+5=2, 18+5=13) or, for a borrow, subtracting the smaller
    units digit from the larger one (12-3=11, 21-7=26)."""
    tens, units = divmod(value, 10)
    if op == "+":
        return tens * 10 + (units + d) % 10
    return tens * 10 + (d - units)


def worked_solution(expr: str, slip_rate: float = 0.0, rng: random.Random | None = None) -> str:
    """A worked completion: ``"7+5-3"`` -> ``"7+5=12,12-3=9"`` (the last number is the final answer).

    With ``slip_rate > 0`` this is the imperfect teacher: each carry/borrow step is, with probability
    ``slip_rate``, done wrongly (see :func:`_slip`) and the chain continues from that value.
    """
    value, steps = _parse_expression(expr)
    rng = rng if rng is not None else random
    parts = []
    for op, d in steps:
        new = value + d if op == "+" else value - d
        if slip_rate > 0.0 and _crosses(value, op, d) and rng.random() < slip_rate:
            new = _slip(value, op, d)
        parts.append(f"{value}{op}{d}={new}")
        value = new
    return ",".join(parts)


def _prompt_text(expr: str) -> str:
    return f"{expr}=?"


def make_dataset(n: int, seed: int = 0, split: str = "train", **task_kw):
    """A ``datasets.Dataset`` of ``n`` problems drawn from the ``split`` pool (``"train"`` or ``"test"``).

    Columns: ``prompt`` (``[{"role": "user", "content": "7+5-3=?"}]``) and ``answer`` (``"9"``). Problems are
    sampled without replacement while ``n`` fits in the pool (beyond that the pool is cycled in new shuffles).
    ``task_kw`` may override ``num_terms``, ``first_operand_range``, ``operand_range`` and ``test_fraction``.
    """
    from datasets import Dataset

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    pool = split_problems(**task_kw)[split]
    rng = random.Random(f"{split}-{seed}")
    chosen: list[str] = []
    while len(chosen) < n:
        order = pool[:]
        rng.shuffle(order)
        chosen.extend(order[: n - len(chosen)])
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": _prompt_text(e)}] for e in chosen],
            "answer": [str(solve(e)) for e in chosen],
        }
    )


_ANSWER_RE = re.compile(r"=\s*(-?\d+)\s*$")


def extract_answer(completion: Any) -> str | None:
    """The final answer of a completion (string or chat list): the integer after the last ``"="`` when the completion
    ends with it (e.g. ``"7+5=12,12-3=9"`` -> ``"9"``), else ``None``."""
    from trl_rpg.rewards import completion_to_text

    match = _ANSWER_RE.search(completion_to_text(completion).strip())
    return match.group(1) if match else None


def toy_reward(completions: list, answer: list, **kwargs) -> list[float]:
    """TRL reward function: 1.0 where the completion's final answer equals the reference answer, else 0.0."""
    rewards = []
    for completion, ref in zip(completions, answer, strict=True):
        got = extract_answer(completion)
        rewards.append(1.0 if got is not None and int(got) == int(ref) else 0.0)
    return rewards
