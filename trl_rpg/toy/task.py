"""The toy reasoning task and the tiny model of the demo, the tests and the benchmarks.

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
  teacher* that usually fumbles carries and borrows (see the Task section below), so that the warmed-up model is
  only partially right and RL with a verifiable reward has something to fix. A plain torch loop rather than TRL's
  ``SFTTrainer``, which was measured slower on this task (docs/benchmarks.md, "The toy task").
* :func:`evaluate_accuracy` -- held-out accuracy by (greedy) generation; :func:`generate_completions` (the generation
  loop is :func:`trl_rpg.evaluation.generate_completions`).
* :func:`build_toy_model` -- tokenizer + model + warm-up in one deterministic, optionally cached call.
* :data:`RECOMMENDED_RL_ARGS` -- ``GRPOConfig`` keyword arguments that were measured to work on this task on CPU,
  and the ``EVAL_*`` constants for the held-out evaluation.

What the warm-up and RL reach on this task, and how long they take, is measured in docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import time
from typing import Any

import torch

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

# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|end|>"
BOS_TOKEN = "<|bos|>"
UNK_TOKEN = "<|unk|>"
SYSTEM_TOKEN = "<|system|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN, SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN]

# Every character the task (and a little free text) needs; one token per character.
_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \n+-*/=?,.:;!()#<>'\"_"

# Each message is rendered as <role-marker>content; an assistant turn ends with eos. The generation prompt is the
# assistant marker, so the model's completion is exactly "<content><eos>".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>' + message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tokenizer():
    """Character-level ``PreTrainedTokenizerFast`` (WordLevel over a fixed character vocabulary).

    Special tokens: pad ``<|pad|>`` (id 0), eos ``<|end|>``, bos ``<|bos|>``, unk, and the chat markers
    ``<|system|>``, ``<|user|>``, ``<|assistant|>``. Left padding, no automatically added special tokens (the chat
    template adds bos), and a decoder that concatenates characters without spaces.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in _CHARS:
        if ch not in vocab:
            vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one piece per character
    tok.decoder = decoders.Fuse()  # "".join(tokens)
    tok.add_special_tokens(SPECIAL_TOKENS)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN],
        padding_side="left",
        truncation_side="left",
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------------

DEFAULT_MODEL_KWARGS: dict[str, Any] = {"hidden_size": 96, "num_layers": 2, "num_heads": 4}


def build_model(tokenizer, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0, **kw):
    """A randomly initialised tiny ``Qwen2ForCausalLM`` matching ``tokenizer``.

    Extra keyword arguments override ``Qwen2Config`` fields (e.g. ``intermediate_size``, ``num_key_value_heads``).
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    cfg = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 4 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "use_cache": True,
    }
    cfg.update(kw)
    config = Qwen2Config(**cfg)
    with _seeded(seed):
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        do_sample=False,
        max_new_tokens=MAX_COMPLETION_LENGTH,
    )
    return model


class _seeded:
    """Context manager: seed torch's and Python's global RNGs, restore the previous states on exit."""

    def __init__(self, seed: int):
        self.seed = seed

    def __enter__(self):
        self._torch_state = torch.random.get_rng_state()
        self._py_state = random.getstate()
        torch.manual_seed(self.seed)
        random.seed(self.seed)

    def __exit__(self, *exc):
        torch.random.set_rng_state(self._torch_state)
        random.setstate(self._py_state)
        return False


# ---------------------------------------------------------------------------------------------------------------------
# Task
# ---------------------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------------------
# SFT warm-up and evaluation
# ---------------------------------------------------------------------------------------------------------------------

DEFAULT_SFT_STEPS = 400
DEFAULT_SFT_LR = 3e-3
DEFAULT_SFT_BATCH_SIZE = 64
DEFAULT_SFT_CLEAN_FRACTION = 0.5  # first half of the warm-up on correct solutions, then the imperfect teacher
TRAIN_NUM_PROBLEMS = 1500  # problems used by the demo for SFT and RL (drawn from the train pool)

EVAL_NUM_PROBLEMS = 500  # held-out problems used to measure accuracy
EVAL_SEED = 0
EVAL_MAX_NEW_TOKENS = MAX_COMPLETION_LENGTH
EVAL_BATCH_SIZE = 500


def make_eval_dataset():
    """The standard held-out evaluation set (``EVAL_NUM_PROBLEMS`` test-split problems, ``EVAL_SEED``)."""
    return make_dataset(EVAL_NUM_PROBLEMS, seed=EVAL_SEED, split="test")


def _prompt_strings(tokenizer, dataset) -> list[str]:
    return [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in dataset["prompt"]]


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sft_warmup(
    model,
    tokenizer,
    dataset,
    steps: int = DEFAULT_SFT_STEPS,
    lr: float = DEFAULT_SFT_LR,
    seed: int = 0,
    batch_size: int = DEFAULT_SFT_BATCH_SIZE,
    slip_rate: float = TEACHER_SLIP_RATE,
    clean_fraction: float = DEFAULT_SFT_CLEAN_FRACTION,
    weight_decay: float = 0.0,
    warmup_steps: int = 20,
    min_lr_ratio: float = 0.0,
    log_every: int = 0,
) -> list[float]:
    """Short supervised warm-up on worked solutions: correct ones first, then an imperfect teacher's.

    Each step draws ``batch_size`` problems from ``dataset`` (its ``prompt`` column) and a fresh worked solution for
    each (:func:`worked_solution`): during the first ``clean_fraction`` of the steps all solutions are correct, after
    that the teacher fumbles each carry/borrow step with probability ``slip_rate`` (``slip_rate=0`` or
    ``clean_fraction=1`` trains on correct solutions only). The clean first phase makes the arithmetic itself
    converge reliably across seeds within the short budget. The loss covers the completion
    tokens including eos. A plain torch loop: AdamW, linear warm-up then cosine decay to ``min_lr_ratio * lr``, all
    randomness from ``seed``, so the result is deterministic for a seed (at a fixed thread count). Returns the
    per-step losses; the model is left in eval mode.
    """
    exprs = [messages[-1]["content"] for messages in dataset["prompt"]]
    prompt_ids = [_encode(tokenizer, p) for p in _prompt_strings(tokenizer, dataset)]
    n = len(exprs)
    rng = random.Random(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    clean_steps = round(clean_fraction * steps)

    def make_batch(step: int):
        idx = [rng.randrange(n) for _ in range(batch_size)]
        rate = 0.0 if step < clean_steps else slip_rate
        completions = [worked_solution(exprs[i], slip_rate=rate, rng=rng) for i in idx]
        comp_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
        seqs = [prompt_ids[i] + c + [eos] for i, c in zip(idx, comp_ids, strict=True)]
        width = max(len(x) for x in seqs)
        input_ids = torch.full((batch_size, width), pad, dtype=torch.long)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for row, (i, seq) in enumerate(zip(idx, seqs, strict=True)):  # right padding for training
            input_ids[row, : len(seq)] = torch.tensor(seq)
            attention_mask[row, : len(seq)] = 1
            labels[row, len(prompt_ids[i]) : len(seq)] = torch.tensor(seq[len(prompt_ids[i]) :])
        return input_ids, attention_mask, labels

    def lr_factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    model.train()
    losses = []
    for step in range(steps):
        input_ids, attention_mask, labels = (t.to(device) for t in make_batch(step))
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"sft step {step + 1}/{steps} loss {sum(losses[-log_every:]) / log_every:.4f}")
    model.eval()
    return losses


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
    stripped. The generation loop is :func:`trl_rpg.evaluation.generate_completions`."""
    from trl_rpg.evaluation import generate_completions as generate

    return generate(model, tokenizer, _prompt_strings(tokenizer, dataset), max_new_tokens=max_new_tokens,
                    temperature=0.0 if greedy else temperature, batch_size=batch_size).texts


def evaluate_accuracy(model, tokenizer, dataset, **generation) -> float:
    """Share of ``dataset`` problems whose generated completion earns ``toy_reward`` 1.0 (greedy by default;
    ``generation``: the options of :func:`generate_completions`)."""
    completions = generate_completions(model, tokenizer, dataset, **generation)
    rewards = toy_reward(completions, list(dataset["answer"]))
    return sum(rewards) / max(1, len(rewards))


# ---------------------------------------------------------------------------------------------------------------------
# One-call builder (with an optional on-disk cache)
# ---------------------------------------------------------------------------------------------------------------------

_MARKER_FILE = "trl_rpg_toy.json"
_BUILD_VERSION = 2


def build_toy_model(
    output_dir: str | os.PathLike | None = None,
    seed: int = 0,
    sft_steps: int = DEFAULT_SFT_STEPS,
    sft_lr: float = DEFAULT_SFT_LR,
    sft_batch_size: int = DEFAULT_SFT_BATCH_SIZE,
    slip_rate: float = TEACHER_SLIP_RATE,
    sft_clean_fraction: float = DEFAULT_SFT_CLEAN_FRACTION,
    num_train_problems: int = TRAIN_NUM_PROBLEMS,
    model_kwargs: dict[str, Any] | None = None,
    use_cache: bool = True,
    num_threads: int | None = 1,
    verbose: bool = False,
):
    """Tokenizer + tiny model + SFT warm-up in one deterministic call. Returns ``(model, tokenizer)``.

    If ``output_dir`` is given, both are saved there with ``save_pretrained`` together with a marker file that
    records the build settings; a later call with the same settings (and ``use_cache=True``) loads them instead of
    rebuilding. Either way the returned model's ``config._name_or_path`` is then ``output_dir``, which TRL needs to
    create the reference model when ``beta != 0`` (without ``output_dir`` the model exists only in memory; use
    ``beta=0`` or pass ``output_dir``). ``num_threads`` sets torch's intra-op thread count for the warm-up only (the
    previous value is restored; ``None`` leaves it alone). The default, one thread, makes the result independent of
    the caller's setting and is the fastest choice for a model this small (docs/benchmarks.md, "The toy task").
    """
    model_kwargs = {**DEFAULT_MODEL_KWARGS, **(model_kwargs or {})}
    settings = {
        "version": _BUILD_VERSION,
        "seed": seed,
        "sft_steps": sft_steps,
        "sft_lr": sft_lr,
        "sft_batch_size": sft_batch_size,
        "slip_rate": slip_rate,
        "sft_clean_fraction": sft_clean_fraction,
        "num_train_problems": num_train_problems,
        "model_kwargs": model_kwargs,
        "task": {
            "num_terms": NUM_TERMS,
            "first_operand_range": list(FIRST_OPERAND_RANGE),
            "operand_range": list(OPERAND_RANGE),
        },
    }
    if output_dir is not None and use_cache:
        marker = os.path.join(output_dir, _MARKER_FILE)
        if os.path.isfile(marker):
            with open(marker) as f:
                saved = json.load(f)
            if saved == json.loads(json.dumps(settings)):
                from transformers import AutoTokenizer, Qwen2ForCausalLM

                tokenizer = AutoTokenizer.from_pretrained(output_dir)
                model = Qwen2ForCausalLM.from_pretrained(output_dir)
                model.eval()
                if verbose:
                    print(f"loaded cached toy model from {output_dir}")
                return model, tokenizer

    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=seed, **model_kwargs)
    dataset = make_dataset(num_train_problems, seed=seed, split="train")
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        sft_warmup(
            model,
            tokenizer,
            dataset,
            steps=sft_steps,
            lr=sft_lr,
            seed=seed,
            batch_size=sft_batch_size,
            slip_rate=slip_rate,
            clean_fraction=sft_clean_fraction,
            log_every=50 if verbose else 0,
        )
    finally:
        torch.set_num_threads(previous_threads)
    if verbose:
        print(f"SFT warm-up: {sft_steps} steps in {time.perf_counter() - t0:.1f}s")

    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        with open(os.path.join(output_dir, _MARKER_FILE), "w") as f:
            json.dump(settings, f, indent=2)
        # As if loaded with from_pretrained: TRL builds the reference model (beta != 0) from this path.
        model.config._name_or_path = str(output_dir)
    return model, tokenizer


# GRPOConfig keyword arguments measured to work on this task on CPU (add ``output_dir``, ``seed``, and e.g.
# ``beta``/``epsilon``/``epsilon_high`` as needed). One optimizer step = 64 completions (8 prompts x 8 samples); each
# generation round samples 128 completions and is used for 2 optimizer steps (the second one off-policy, so the
# importance ratio/clipping path is exercised). lr 3e-4 and above (without warm-up) degrades the model at first; step
# times and learning curves are in docs/benchmarks.md.
RECOMMENDED_RL_ARGS: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "max_steps": 200,
    "per_device_train_batch_size": 64,
    "num_generations": 8,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 2,
    "max_completion_length": MAX_COMPLETION_LENGTH,
    "temperature": 1.0,
    "learning_rate": 1e-4,
    "beta": 0.0,
    "scale_rewards": "none",
    "gradient_checkpointing": False,  # GRPOConfig defaults to True; recomputation only costs time at this size
}
