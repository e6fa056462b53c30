"""Benchmark evaluation (mean@k on AIME 2024, AIME 2025 and AMC 2023), as reported in the RPG paper.

The three benchmarks are bundled as parquet files in ``trl_rpg/data`` (verl/DAPO format: ``prompt`` chat list,
``reward_model.ground_truth``, ``extra_info.raw_problem``...), each problem repeated 32 times, so that sampling one
completion per row and averaging gives mean@32:

    >>> from trl_rpg.evaluation.evaluate import evaluate_benchmarks
    >>> results = evaluate_benchmarks(model, tokenizer, max_new_tokens=8192)  # doctest: +SKIP
    >>> results["aime24"]["mean_at_k"]  # doctest: +SKIP

Scoring is :func:`trl_rpg.rewards.score_completion` and the reference of a row is
:func:`trl_rpg.rewards.reference_answer`: the very rule and columns of the training reward
:func:`trl_rpg.rewards.math_reward`.

Two generation backends (``backend=``): ``"transformers"`` (the default: batched, left-padded ``model.generate``
on a loaded model) and ``"vllm"`` (for the paper's scale, 3,200 completions of up to 8k tokens per benchmark: one
``vllm.LLM.generate`` call that samples the k completions of every problem at once, ``SamplingParams(n=k)`` per
problem, from a saved model's path or an ``LLM``; needs vLLM installed). Both return the same statistics.

This module's one job is the evaluation itself: a data set's rows selected and grouped by problem, their prompts
formatted, generated, scored and averaged (:func:`evaluate_model`, :func:`evaluate_benchmarks`). The parts have a
module each, whose public names it hands on (``trl_rpg.evaluation.evaluate.X``): ``benchmark_data`` (the bundled files,
:func:`load_benchmark`, :func:`problem_text`), ``benchmark_scores`` (:func:`score_completions`, :func:`mean_at_k`),
``generation`` (:func:`generate_completions`, :func:`vllm_engine`, :func:`generate_with_vllm`).

torch / transformers are only imported by :func:`generate_completions` (and so :func:`evaluate_model`); vllm only by
the ``"vllm"`` backend.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..rewards import extract_answer, reference_answer
from .benchmark_data import BENCHMARKS, load_benchmark, problem_text
from .benchmark_scores import mean_at_k, score_completions
from .generation import Generations, generate_completions, generate_with_vllm, vllm_engine

__all__ = [
    "BACKENDS",
    "BENCHMARKS",
    "Generations",
    "evaluate_benchmarks",
    "evaluate_model",
    "generate_completions",
    "generate_with_vllm",
    "load_benchmark",
    "mean_at_k",
    "problem_text",
    "score_completions",
    "vllm_engine",
]

logger = logging.getLogger(__name__)

#: Generation backends of :func:`evaluate_model`: batched ``model.generate`` (default), or one vLLM call.
BACKENDS = ("transformers", "vllm")


def _rows(dataset: Any) -> list[dict[str, Any]]:
    if hasattr(dataset, "to_list"):
        return dataset.to_list()
    return [dict(r) for r in dataset]


def _row_gold(row: Mapping[str, Any]) -> str | list[str]:
    gold = reference_answer(row)
    if gold is None:
        raise ValueError("A dataset row has no reference answer: none of `ground_truth`, "
                         "`reward_model['ground_truth']`, `answer`.")
    return gold


def _select_rows(
    rows: list[dict[str, Any]], num_samples: int | None, max_problems: int | None
) -> tuple[list[dict[str, Any]], list[Hashable]]:
    """Group rows by problem (order of first appearance); keep the first ``max_problems`` problems and the first
    ``num_samples`` rows of each.  Returns the selected rows (grouped by problem) and their problem ids."""
    groups: dict[Hashable, list[dict[str, Any]]] = {}
    keys: dict[str, int] = {}
    for row in rows:
        pid = row.get("problem_id")
        if pid is None:
            pid = keys.setdefault(problem_text(row), len(keys))
        groups.setdefault(pid, []).append(row)
    selected_groups = list(groups.items())
    if max_problems is not None:
        if max_problems < 1:
            raise ValueError(f"max_problems must be >= 1, got {max_problems}.")
        selected_groups = selected_groups[:max_problems]
    if num_samples is not None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
        short = [pid for pid, g in selected_groups if len(g) < num_samples]
        if short:
            raise ValueError(f"num_samples={num_samples} but problems {short[:5]} have fewer rows.")
    selected: list[dict[str, Any]] = []
    pids: list[Hashable] = []
    for pid, group in selected_groups:
        for row in group[:num_samples] if num_samples is not None else group:
            selected.append(row)
            pids.append(pid)
    return selected, pids


def _prompt_text(tokenizer: Any, prompt: Any, chat_template_kwargs: Mapping[str, Any] | None) -> str:
    if isinstance(prompt, str):  # already-formatted prompt
        return prompt
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **dict(chat_template_kwargs or {})
    )


def _one_prompt_per_problem(prompts: Sequence[str], problem_ids: Sequence[Hashable]) -> tuple[list[str], list[int]]:
    """The prompt of each problem and its number of rows (rows come grouped by problem, `_select_rows`)."""
    unique: dict[Hashable, str] = {}
    counts: dict[Hashable, int] = {}
    for prompt, pid in zip(prompts, problem_ids, strict=True):
        if unique.setdefault(pid, prompt) != prompt:
            raise ValueError(f"backend='vllm' samples the k completions of a problem from one prompt, but problem "
                             f"{pid!r} has rows with different prompts; use backend='transformers'.")
        counts[pid] = counts.get(pid, 0) + 1
    return list(unique.values()), list(counts.values())


def evaluate_model(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 32,
    num_samples: int | None = None,
    max_problems: int | None = None,
    seed: int = 0,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    generation_kwargs: Mapping[str, Any] | None = None,
    return_completions: bool = True,
    backend: str = "transformers",
    llm_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Generate one completion per dataset row with ``model.generate`` (or vLLM) and compute mean@k.

    Each row's ``prompt`` (a chat message list; a plain string is used as is) is formatted with
    ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``, and the prompts are left-padded and generated
    in batches of ``batch_size``.  Rows are grouped by ``problem_id`` (added by :func:`load_benchmark`; derived from
    ``extra_info.raw_problem`` / the prompt when absent) and the reference answer is
    :func:`~trl_rpg.rewards.reference_answer` (the ``ground_truth`` column, else ``reward_model["ground_truth"]``,
    else ``answer``).

    Args:
        model: a ``transformers`` causal LM (anything with ``generate``); it is put in eval mode during the call and
            its training mode is restored afterwards.
        tokenizer: its tokenizer, with a chat template; if it has no pad token, the EOS token is used for padding.
        dataset: a ``datasets.Dataset`` (or a sequence of row dicts).
        max_new_tokens: generation budget per completion.
        temperature: sampling temperature; ``0`` means greedy decoding (then use ``num_samples=1``: all copies of a
            problem would get the same completion).
        top_p: nucleus sampling threshold (1.0 = off).
        top_k: top-k sampling (0 = off; this overrides a model's default ``generation_config.top_k``).
        batch_size: number of rows per ``generate`` call.
        num_samples: if set, only the first ``num_samples`` rows (copies) of *each problem* are evaluated, giving
            mean@``num_samples`` over all problems.  ``None`` uses every row (mean@32 on the bundled benchmarks).
        max_problems: if set, only the first ``max_problems`` problems (in order of first appearance) are evaluated.
        seed: seeds python / numpy / torch RNGs (``transformers.set_seed``) before generating.
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template``
            (e.g. ``{"enable_thinking": False}``).
        generation_kwargs: extra keyword arguments for ``model.generate`` (override the ones above).
        return_completions: include per-row ``completions``, ``extracted_answers``, ``ground_truths``, ``scores``,
            ``problem_ids`` and ``completion_lengths`` in the result.
        backend: ``"transformers"`` (default) or ``"vllm"``: then ``model`` is the path of a saved model (or a
            ``vllm.LLM``), the k rows of each problem are its k completions from one ``LLM.generate`` call
            (:func:`generate_with_vllm`; ``batch_size`` is unused) and ``generation_kwargs`` are ``SamplingParams``
            fields.
        llm_kwargs: extra ``vllm.LLM`` arguments when the ``"vllm"`` backend builds it from a path (e.g.
            ``{"gpu_memory_utilization": 0.5, "max_model_len": 9216}``).

    Returns:
        :func:`mean_at_k`'s dict (``mean_at_k``, ``k``, ``num_problems``, ``num_samples``, ``pass_at_k``,
        ``per_problem``) plus ``mean_completion_length`` (tokens, up to and including EOS), ``truncated_fraction``
        (completions without EOS within ``max_new_tokens``), ``generation`` (the settings used) and, if
        ``return_completions``, the per-row lists named above.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not allowed; choose one of {list(BACKENDS)}.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    rows, problem_ids = _select_rows(_rows(dataset), num_samples, max_problems)
    if not rows:
        raise ValueError("The dataset is empty.")
    ground_truths = [_row_gold(r) for r in rows]
    prompts = [_prompt_text(tokenizer, r["prompt"], chat_template_kwargs) for r in rows]

    if backend == "vllm":
        unique, samples = _one_prompt_per_problem(prompts, problem_ids)
        generated = generate_with_vllm(vllm_engine(model, seed=seed, **dict(llm_kwargs or {})), tokenizer, unique,
                                       samples, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       top_k=top_k, seed=seed, generation_kwargs=generation_kwargs)
    else:
        generated = generate_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, top_k=top_k, batch_size=batch_size,
                                         seed=seed, generation_kwargs=generation_kwargs)
    completions, lengths, truncated = generated.texts, generated.lengths, generated.truncated

    scores = score_completions(completions, ground_truths)
    stats = mean_at_k(scores, problem_ids)
    stats["mean_completion_length"] = sum(lengths) / len(lengths)
    stats["truncated_fraction"] = sum(truncated) / len(truncated)
    stats["generation"] = {
        "backend": backend,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "num_samples": num_samples,
        "max_problems": max_problems,
    }
    if return_completions:
        stats.update(
            completions=completions,
            extracted_answers=[extract_answer(c) for c in completions],
            ground_truths=ground_truths,
            scores=scores,
            problem_ids=problem_ids,
            completion_lengths=lengths,
        )
    return stats


def evaluate_benchmarks(
    model: Any,
    tokenizer: Any,
    names: Sequence[str] = ("aime24", "aime25", "amc23"),
    *,
    data_dir: str | Path | None = None,
    **kwargs: Any,
) -> dict[str, dict[str, Any]]:
    """Run :func:`evaluate_model` on each named bundled benchmark; ``kwargs`` are passed to :func:`evaluate_model`
    (``max_new_tokens`` is required; with ``backend="vllm"`` the engine is built once for all).  Returns
    ``{name: stats}``."""
    if isinstance(names, str):
        names = (names,)
    if kwargs.get("backend") == "vllm":
        model = vllm_engine(model, seed=kwargs.get("seed", 0), **dict(kwargs.pop("llm_kwargs", None) or {}))
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        dataset = load_benchmark(name, data_dir=data_dir)
        results[name] = evaluate_model(model, tokenizer, dataset, **kwargs)
        logger.info("%s: mean@%s = %.4f", name, results[name]["k"], results[name]["mean_at_k"])
    return results
