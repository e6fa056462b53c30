"""Benchmark evaluation (mean@k on AIME 2024, AIME 2025 and AMC 2023), as reported in the RPG paper.

The three benchmarks are bundled as parquet files in ``trl_rpg/data`` (verl/DAPO format: ``prompt`` chat list,
``reward_model.ground_truth``, ``extra_info.raw_problem``...), each problem repeated 32 times, so that sampling one
completion per row and averaging gives mean@32:

    >>> from trl_rpg.evaluation import evaluate_benchmarks
    >>> results = evaluate_benchmarks(model, tokenizer, max_new_tokens=8192)  # doctest: +SKIP
    >>> results["aime24"]["mean_at_k"]  # doctest: +SKIP

Scoring is :func:`trl_rpg.rewards.score_completion` and the reference of a row is
:func:`trl_rpg.rewards.reference_answer`: the very rule and columns of the training reward
:func:`trl_rpg.rewards.math_reward`.

Two generation backends (``backend=``): ``"transformers"`` (the default: batched, left-padded ``model.generate``
on a loaded model) and ``"vllm"`` (for the paper's scale, 3,200 completions of up to 8k tokens per benchmark: one
``vllm.LLM.generate`` call that samples the k completions of every problem at once, ``SamplingParams(n=k)`` per
problem, from a saved model's path or an ``LLM``; needs vLLM installed). Both return the same statistics.

torch / transformers are only imported by :func:`generate_completions` (and so :func:`evaluate_model`); vllm only by
the ``"vllm"`` backend.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .rewards import completion_to_text, extract_answer, reference_answer, score_completion

if TYPE_CHECKING:  # pragma: no cover
    import datasets


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

#: Benchmark name -> bundled parquet file (in ``trl_rpg/data``).
BENCHMARKS: dict[str, str] = {
    "aime24": "aime-2024.parquet",
    "aime25": "aime25.parquet",
    "amc23": "amc-23.parquet",
}


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def _data_file(filename: str, data_dir: str | Path | None) -> Path:
    if data_dir is not None:
        return Path(data_dir) / filename
    try:
        from importlib.resources import files

        resource = files(__package__ or "trl_rpg").joinpath("data", filename)
        path = Path(str(resource))
        if path.is_file():
            return path
    except Exception:  # (namespace-package quirks, zip imports...: use the module directory)
        logger.debug("importlib.resources lookup failed for %s", filename, exc_info=True)
    return Path(__file__).resolve().parent / "data" / filename


def problem_text(row: Mapping[str, Any]) -> str:
    """The problem of a data set row, which identifies it: ``extra_info.raw_problem`` if present, else the prompt
    (a string, or the contents of its chat messages), else a ``problem`` / ``question`` column."""
    extra = row.get("extra_info")
    if isinstance(extra, Mapping) and extra.get("raw_problem"):
        return str(extra["raw_problem"])
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if prompt:
        return "\n".join(completion_to_text([m]) for m in prompt)
    return str(row.get("problem", row.get("question", "")))


def load_benchmark(name: str, data_dir: str | Path | None = None) -> datasets.Dataset:
    """Load a bundled benchmark as an in-memory ``datasets.Dataset``.

    Args:
        name: one of ``BENCHMARKS`` (``"aime24"``, ``"aime25"``, ``"amc23"``); the parquet file stem (e.g.
            ``"aime-2024"``) is accepted too.
        data_dir: directory holding the parquet file; defaults to the package's ``trl_rpg/data``.

    Returns:
        The parquet's rows and columns (``prompt``, ``reward_model``, ``extra_info``, ``data_source``, ``ability``),
        plus

        * ``ground_truth`` (str): ``reward_model["ground_truth"]``;
        * ``problem_id`` (int): 0-based id of the problem, numbered in order of first appearance of
          ``extra_info["raw_problem"]``.  (``extra_info["index"]`` is *not* a problem id in every file: in AIME 2025
          and AMC 2023 it numbers the 32 copies of each problem.)
        * ``sample_index`` (int): 0-based index of the row among the copies of its problem (in file order).
    """
    import datasets  # lazy: keep `import trl_rpg.evaluation` light
    import pyarrow.parquet as pq

    key = str(name).strip().lower()
    stems = {Path(f).stem.lower(): n for n, f in BENCHMARKS.items()}
    key = stems.get(key, key)
    if key not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}; allowed names: {sorted(BENCHMARKS)}.")
    path = _data_file(BENCHMARKS[key], data_dir)
    if not path.is_file():
        raise FileNotFoundError(f"Benchmark file for {key!r} not found: {path}")
    dataset = datasets.Dataset(pq.read_table(path))

    ground_truths: list[str] = []
    problem_ids: list[int] = []
    sample_indices: list[int] = []
    ids: dict[str, int] = {}
    counts: dict[int, int] = {}
    for row in dataset.select_columns(["prompt", "reward_model", "extra_info"]):
        gold = reference_answer(row)
        if gold is None:
            raise ValueError(f"{path.name}: a row has no reward_model.ground_truth")
        ground_truths.append(gold)
        pid = ids.setdefault(problem_text(row), len(ids))
        problem_ids.append(pid)
        sample_indices.append(counts.get(pid, 0))
        counts[pid] = counts.get(pid, 0) + 1
    dataset = dataset.add_column("ground_truth", ground_truths)
    dataset = dataset.add_column("problem_id", problem_ids)
    dataset = dataset.add_column("sample_index", sample_indices)
    return dataset


# ---------------------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------------------------


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


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        if isinstance(source, Iterable):
            ids.update(int(i) for i in source)
        else:
            ids.add(int(source))
    return ids


def _prompt_text(tokenizer: Any, prompt: Any, chat_template_kwargs: Mapping[str, Any] | None) -> str:
    if isinstance(prompt, str):  # already-formatted prompt
        return prompt
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **dict(chat_template_kwargs or {})
    )


@dataclass
class Generations:
    """What `generate_completions` returns, one entry per prompt."""

    texts: list[str]  # decoded completions, special tokens stripped
    lengths: list[int]  # tokens, up to and including EOS
    truncated: list[bool]  # no EOS within max_new_tokens


def generate_completions(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int,
                         temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, batch_size: int = 32,
                         seed: int | None = None, generation_kwargs: Mapping[str, Any] | None = None) -> Generations:
    """Generate one completion per (already formatted) prompt: left-padded, batched ``model.generate``.

    ``temperature=0`` decodes greedily, otherwise samples with ``temperature``, ``top_p``, ``top_k`` (0 = off, which
    overrides a model's default ``generation_config.top_k``). ``seed`` seeds python / numpy / torch
    (``transformers.set_seed``) first; ``generation_kwargs`` override the rest. The model is put in eval mode and its
    training mode restored; the tokenizer's padding side (and a missing pad token, for which EOS stands in) too.
    Used by the benchmark evaluation (:func:`evaluate_model`) and by the toy task's evaluation.
    """
    import torch  # lazy: the data / scoring helpers do not need torch
    from transformers import set_seed

    eos_ids = _eos_ids(model, tokenizer)
    gen_kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if temperature and temperature > 0:
        gen_kwargs.update(do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=int(top_k))
    else:
        gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if getattr(getattr(model, "generation_config", None), "eos_token_id", None) is None and eos_ids:
        gen_kwargs["eos_token_id"] = sorted(eos_ids)
    gen_kwargs.update(dict(generation_kwargs or {}))

    old_padding_side, old_pad_token = tokenizer.padding_side, tokenizer.pad_token
    was_training = getattr(model, "training", False)
    device = next(model.parameters()).device
    out = Generations([], [], [])
    try:
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise ValueError("The tokenizer has neither a pad token nor an EOS token.")
            tokenizer.pad_token = tokenizer.eos_token
        gen_kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
        model.eval()
        if seed is not None:
            set_seed(seed)
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(list(prompts[start : start + batch_size]), return_tensors="pt", padding=True,
                              add_special_tokens=False).to(device)
            with torch.no_grad():
                ids = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     **gen_kwargs)
            for row in ids[:, batch["input_ids"].shape[1] :].tolist():
                end = next((i for i, t in enumerate(row) if t in eos_ids), None)
                out.truncated.append(end is None)
                row = row if end is None else row[: end + 1]
                out.lengths.append(len(row))
                out.texts.append(tokenizer.decode(row, skip_special_tokens=True))
            logger.info("generate_completions: %d/%d completions", len(out.texts), len(prompts))
    finally:
        tokenizer.padding_side = old_padding_side
        if old_pad_token is None:
            tokenizer.pad_token = None
        if was_training:
            model.train()
    return out


def vllm_engine(model: Any, *, seed: int = 0, **llm_kwargs: Any) -> Any:
    """The ``vllm.LLM`` the ``"vllm"`` backend generates with: ``model`` itself if it is one, else built from the path
    of a saved model (``LLM(model=path, seed=seed, **llm_kwargs)``)."""
    if not isinstance(model, (str, os.PathLike)):
        if hasattr(model, "parameters"):  # a loaded torch model
            raise TypeError("backend='vllm' generates with vLLM, from the path of a saved model (or a vllm.LLM), not "
                            "from a loaded torch model: save it first (save_pretrained) and pass the path, or use "
                            "backend='transformers'.")
        return model
    if importlib.util.find_spec("vllm") is None:
        raise ImportError("backend='vllm' needs vLLM installed (`pip install vllm`); without it use "
                          "backend='transformers'.")
    from vllm import LLM

    return LLM(model=str(model), seed=seed, **llm_kwargs)


def generate_with_vllm(llm: Any, tokenizer: Any, prompts: Sequence[str], samples: Sequence[int], *,
                       max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                       seed: int | None = None, generation_kwargs: Mapping[str, Any] | None = None) -> Generations:
    """``samples[i]`` completions of each (already formatted) prompt ``prompts[i]``, all in one ``llm.generate`` call:
    one ``SamplingParams(n=samples[i])`` per prompt, seeded ``seed + i`` (its own random stream, whatever the batch).

    The prompts are tokenized as :func:`generate_completions` tokenizes them (no special tokens added) and the
    completions decoded as it decodes them; ``temperature=0`` decodes greedily; ``top_k=0`` is off;
    ``generation_kwargs`` are further ``SamplingParams`` fields. A completion is truncated when vLLM stopped it at
    ``max_new_tokens`` (``finish_reason == "length"``). Returns the completions prompt by prompt.
    """
    from vllm import SamplingParams

    params = [SamplingParams(n=k, max_tokens=max_new_tokens, temperature=float(temperature or 0.0),
                             top_p=float(top_p), top_k=int(top_k), seed=None if seed is None else seed + i,
                             **dict(generation_kwargs or {})) for i, k in enumerate(samples)]
    requests = [{"prompt_token_ids": tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts]
    out = Generations([], [], [])
    for request in llm.generate(requests, params, use_tqdm=False):
        for completion in request.outputs:
            out.texts.append(tokenizer.decode(list(completion.token_ids), skip_special_tokens=True))
            out.lengths.append(len(completion.token_ids))
            out.truncated.append(completion.finish_reason == "length")
    logger.info("generate_with_vllm: %d completions of %d prompts", len(out.texts), len(prompts))
    return out


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
