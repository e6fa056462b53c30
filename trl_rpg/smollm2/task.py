"""The real model's task: addition asked in plain English, with a verifiable reward.

``"What is 7 + 5? Reply with only the number."`` as a chat message; SmolLM2-135M-Instruct's chat template adds its
default system prompt. The reward (:func:`arithmetic_reward`) is 1.0 when the reply ends (eos within the completion
budget) and its last number is the sum, else 0.0: ``"12"``, ``"7 + 5 = 12"`` and ``"The answer is 12."`` score 1,
``"7 + 5 = 13"`` or a reply cut off at the token limit 0. The untrained model partly does it: it mostly answers
correctly when decoding greedily, but at temperature 1 it often rambles past the limit or misadds
(docs/smollm2.md gives the measured start), so RL has something to fix.

Two sizes of operand (``operands``): ``"single-digit"`` (0-9, the demo's: 100 problems split once, independently of
any seed, into 70 training and 30 held-out ones) and ``"two-digit"`` (10-99, with carries: 8,100 problems, 64
held out, the rest for training; the untrained model answers about a fifth to a third of them greedily and few when
sampling at temperature 1, so a short RL run leaves every method clearly below 100%: `benchmarks/smollm2_tuned.py`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "MAX_COMPLETION_LENGTH",
    "OPERANDS",
    "QUESTION",
    "arithmetic_reward",
    "evaluate",
    "last_number",
    "make_dataset",
    "split_problems",
]

QUESTION = "What is {a} + {b}? Reply with only the number."
#: Tokens a reply may take: "7 + 5 = 12" is 8 tokens and eos one more.
MAX_COMPLETION_LENGTH = 16
_SPLIT_SEED = 39
#: operand range (inclusive) and number of held-out problems, by operand size
OPERANDS = {"single-digit": ((0, 9), 30), "two-digit": ((10, 99), 64)}
_NUMBER = re.compile(r"-?\d+")


def _check_operands(operands: str) -> None:
    if operands not in OPERANDS:
        raise ValueError(f"operands must be one of {', '.join(map(repr, OPERANDS))}; got {operands!r}")


def split_problems(operands: str = "single-digit") -> dict[str, list[tuple[int, int]]]:
    """The fixed partition of the problems ``(a, b)``, both operands in the range of ``operands`` (:data:`OPERANDS`),
    into ``"train"`` and ``"test"``."""
    _check_operands(operands)
    (low, high), test_size = OPERANDS[operands]
    pool = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    random.Random(_SPLIT_SEED).shuffle(pool)
    return {"test": sorted(pool[:test_size]), "train": sorted(pool[test_size:])}


def make_dataset(n: int | None = None, seed: int = 0, split: str = "train", operands: str = "single-digit"):
    """A conversational ``datasets.Dataset`` (``prompt``: one user message, ``answer``: the sum as a string) of ``n``
    problems from ``split`` of ``operands``' problems in a seeded order (the whole split when ``n`` is None; cycled
    when ``n`` is larger)."""
    from datasets import Dataset

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    pool = split_problems(operands)[split]
    rng = random.Random(f"{split}-{seed}" if operands == "single-digit" else f"{operands}-{split}-{seed}")
    chosen: list[tuple[int, int]] = []
    while len(chosen) < (len(pool) if n is None else n):
        order = pool[:]
        rng.shuffle(order)
        chosen.extend(order[: (len(pool) if n is None else n) - len(chosen)])
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": QUESTION.format(a=a, b=b)}] for a, b in chosen],
        "answer": [str(a + b) for a, b in chosen],
    })


def last_number(text: str) -> str | None:
    """The last integer written in ``text`` (``"7 + 5 = 12."`` -> ``"12"``), or None."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def _text(completion: Any) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def arithmetic_reward(completions: list, answer: list, completion_ids: Sequence[Sequence[int]] | None = None,
                      eos_token_id: int | None = None, **kwargs) -> list[float]:
    """TRL reward function: 1.0 where the reply's last number is ``answer`` and the reply ended, else 0.0.

    A reply ended when its token ids (TRL's ``completion_ids``, up to and including eos) end with an eos: the
    ``eos_token_id`` given, else SmolLM2's ``<|im_end|>`` (id 2). Without ``completion_ids``
    (a caller that has only texts) every reply counts as ended."""
    eos = 2 if eos_token_id is None else eos_token_id
    ids = completion_ids if completion_ids is not None else [None] * len(completions)
    rewards = []
    for completion, ref, tokens in zip(completions, answer, ids, strict=True):
        ended = tokens is None or (len(tokens) > 0 and tokens[-1] == eos)
        rewards.append(1.0 if ended and last_number(_text(completion)) == str(ref).strip() else 0.0)
    return rewards


def evaluate(model, tokenizer, dataset, *, samples: int = 0, temperature: float = 1.0, seed: int = 0,
             batch_size: int = 64, max_completion_length: int = MAX_COMPLETION_LENGTH) -> dict[str, float]:
    """Held-out accuracy: ``greedy`` (one greedy reply per problem) and, with ``samples > 0``, ``sampled`` (the mean
    reward of ``samples`` replies per problem at ``temperature``), with :func:`arithmetic_reward`'s rule (a reply cut
    off at ``max_completion_length`` tokens scores 0)."""
    from trl_rpg.evaluation.evaluate import generate_completions

    prompts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
               for p in dataset["prompt"]]
    answers = list(dataset["answer"])

    def score(generations, refs) -> float:
        rewards = [0.0 if cut else 1.0 if last_number(text) == ref else 0.0
                   for text, cut, ref in zip(generations.texts, generations.truncated, refs, strict=True)]
        return sum(rewards) / max(1, len(rewards))

    result = {"greedy": score(generate_completions(model, tokenizer, prompts, max_new_tokens=max_completion_length,
                                                   batch_size=batch_size), answers)}
    if samples > 0:
        result["sampled"] = score(generate_completions(model, tokenizer, prompts * samples,
                                                       max_new_tokens=max_completion_length, temperature=temperature,
                                                       batch_size=batch_size, seed=seed), answers * samples)
    return result
