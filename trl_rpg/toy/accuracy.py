"""Held-out accuracy of a toy model: the standard evaluation set, its completions by (greedy) generation, and the
share that earns the reward."""

from __future__ import annotations

from .problems import MAX_COMPLETION_LENGTH, make_dataset, toy_reward
from .tokenizer import _prompt_strings

__all__ = ["EVAL_BATCH_SIZE", "EVAL_MAX_NEW_TOKENS", "EVAL_NUM_PROBLEMS", "EVAL_SEED", "evaluate_accuracy",
           "generate_completions", "make_eval_dataset"]

EVAL_NUM_PROBLEMS = 500  # held-out problems used to measure accuracy
EVAL_SEED = 0
EVAL_MAX_NEW_TOKENS = MAX_COMPLETION_LENGTH
EVAL_BATCH_SIZE = 500


def make_eval_dataset():
    """The standard held-out evaluation set (``EVAL_NUM_PROBLEMS`` test-split problems, ``EVAL_SEED``)."""
    return make_dataset(EVAL_NUM_PROBLEMS, seed=EVAL_SEED, split="test")


def generate_completions(
    model,
    tokenizer,
    dataset,
    max_new_tokens: int = EVAL_MAX_NEW_TOKENS,
    greedy: bool = True,
    batch_size: int = EVAL_BATCH_SIZE,
    temperature: float = 1.0,
) -> list[str]:
    """Decode one completion per prompt of ``dataset`` (greedy, or sampled at ``temperature``); special tokens are
    stripped. The generation loop is :func:`trl_rpg.evaluation.evaluate.generate_completions`."""
    from trl_rpg.evaluation.evaluate import generate_completions as generate

    return generate(model, tokenizer, _prompt_strings(tokenizer, dataset), max_new_tokens=max_new_tokens,
                    temperature=0.0 if greedy else temperature, batch_size=batch_size).texts


def evaluate_accuracy(model, tokenizer, dataset, **generation) -> float:
    """Share of ``dataset`` problems whose generated completion earns ``toy_reward`` 1.0 (greedy by default;
    ``generation``: the options of :func:`generate_completions`)."""
    completions = generate_completions(model, tokenizer, dataset, **generation)
    rewards = toy_reward(completions, list(dataset["answer"]))
    return sum(rewards) / max(1, len(rewards))
