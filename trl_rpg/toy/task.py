"""The toy reasoning task and the tiny model of the demo, the tests and the benchmarks: every public name of the
toy's modules in one place (``from trl_rpg.toy import task as toy``; ``toy.X``).

Everything is built locally (nothing is downloaded):

* :func:`build_tokenizer` -- a character-level ``PreTrainedTokenizerFast`` (WordLevel over a fixed character
  vocabulary) with pad/eos/bos and ``<|user|>``/``<|assistant|>`` markers and a chat template.
* :func:`build_model` -- a randomly initialised tiny ``Qwen2ForCausalLM`` matching a tokenizer: the package's one
  tiny-model builder (the tests and ``scripts/gpu_check.py`` use it too).
* The task -- chained single-digit addition/subtraction such as ``"7+5-3=?"``. The model writes its working step by
  step and the last number is the final answer: ``"7+5=12,12-3=9"`` (at most 15 characters + eos). Every
  intermediate result is >= 0. The problems are split once, independently of any seed, into disjoint train and
  held-out pools (:func:`split_problems`).
* :func:`make_dataset` -- a ``datasets.Dataset`` with a conversational ``prompt`` and a string ``answer``.
* :func:`toy_reward` -- a TRL reward function: 1.0 for a correct final answer, else 0.0.
* :func:`sft_warmup` -- a short supervised warm-up: first on correct worked solutions, then on an *imperfect
  teacher* that usually fumbles carries and borrows (see ``problems.py``), so that the warmed-up model is
  only partially right and RL with a verifiable reward has something to fix. A plain torch loop rather than TRL's
  ``SFTTrainer``, which was measured slower on this task (docs/benchmarks.md, "The toy task").
* :func:`evaluate_accuracy` -- held-out accuracy by (greedy) generation; :func:`generate_completions` (the generation
  loop is :func:`trl_rpg.evaluation.evaluate.generate_completions`).
* :func:`build_toy_model` -- tokenizer + model + warm-up in one deterministic, optionally cached call.
* :data:`RECOMMENDED_RL_ARGS` -- ``GRPOConfig`` keyword arguments that were measured to work on this task on CPU,
  and the ``EVAL_*`` constants for the held-out evaluation.

The modules, one job each: ``tokenizer.py`` (the tokenizer and chat template), ``model.py`` (the tiny model),
``problems.py`` (the task, its data set and reward), ``warmup.py`` (the supervised warm-up), ``accuracy.py``
(held-out accuracy), ``build.py`` (the one-call builder and the recommended RL settings). Within the toy they import
one another relatively and the rest of the package absolutely (``benchmarks/_common.py`` freezes a copy of them).

What the warm-up and RL reach on this task, and how long they take, is measured in docs/benchmarks.md.
"""

from __future__ import annotations

from .accuracy import (
    EVAL_BATCH_SIZE,
    EVAL_MAX_NEW_TOKENS,
    EVAL_NUM_PROBLEMS,
    EVAL_SEED,
    evaluate_accuracy,
    generate_completions,
    make_eval_dataset,
)
from .build import RECOMMENDED_RL_ARGS, TRAIN_NUM_PROBLEMS, build_toy_model
from .model import DEFAULT_MODEL_KWARGS, build_model
from .problems import (
    FIRST_OPERAND_RANGE,
    MAX_COMPLETION_LENGTH,
    NUM_TERMS,
    OPERAND_RANGE,
    SPLIT_SEED,
    TEACHER_SLIP_RATE,
    TEST_FRACTION,
    all_problems,
    extract_answer,
    make_dataset,
    solve,
    split_problems,
    toy_reward,
    worked_solution,
)
from .tokenizer import ASSISTANT_TOKEN, BOS_TOKEN, CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, USER_TOKEN, build_tokenizer
from .warmup import DEFAULT_SFT_BATCH_SIZE, DEFAULT_SFT_CLEAN_FRACTION, DEFAULT_SFT_LR, DEFAULT_SFT_STEPS, sft_warmup

__all__ = [
    "ASSISTANT_TOKEN",
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "DEFAULT_MODEL_KWARGS",
    "DEFAULT_SFT_BATCH_SIZE",
    "DEFAULT_SFT_CLEAN_FRACTION",
    "DEFAULT_SFT_LR",
    "DEFAULT_SFT_STEPS",
    "EOS_TOKEN",
    "EVAL_BATCH_SIZE",
    "EVAL_MAX_NEW_TOKENS",
    "EVAL_NUM_PROBLEMS",
    "EVAL_SEED",
    "FIRST_OPERAND_RANGE",
    "MAX_COMPLETION_LENGTH",
    "NUM_TERMS",
    "OPERAND_RANGE",
    "PAD_TOKEN",
    "RECOMMENDED_RL_ARGS",
    "SPLIT_SEED",
    "TEACHER_SLIP_RATE",
    "TEST_FRACTION",
    "TRAIN_NUM_PROBLEMS",
    "USER_TOKEN",
    "all_problems",
    "build_model",
    "build_tokenizer",
    "build_toy_model",
    "evaluate_accuracy",
    "extract_answer",
    "generate_completions",
    "make_dataset",
    "make_eval_dataset",
    "sft_warmup",
    "solve",
    "split_problems",
    "toy_reward",
    "worked_solution",
]
