"""Generating completions of already formatted prompts, the two backends of the evaluation: batched, left-padded
``model.generate`` on a loaded model (:func:`generate_completions`, also the toy's and SmolLM2's generation loop), or
one ``vllm.LLM.generate`` call sampling k completions of each prompt (:func:`vllm_engine`,
:func:`generate_with_vllm`). Both return :class:`Generations`.

torch / transformers are imported only by :func:`generate_completions`, vllm only by the vLLM functions.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Generations", "generate_completions", "generate_with_vllm", "vllm_engine"]

logger = logging.getLogger(__name__)


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
    Used by the benchmark evaluation (:func:`trl_rpg.evaluation.evaluate.evaluate_model`) and by the toy task's
    evaluation.
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

