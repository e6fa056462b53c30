"""The toy model in one call: tokenizer, tiny model and warm-up, deterministic and optionally cached on disk
(:func:`build_toy_model`), and the RL settings measured to work on the task on CPU (:data:`RECOMMENDED_RL_ARGS`)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from trl_rpg._compat import no_activation_checkpointing

from .model import DEFAULT_MODEL_KWARGS, build_model
from .problems import (
    FIRST_OPERAND_RANGE,
    MAX_COMPLETION_LENGTH,
    NUM_TERMS,
    OPERAND_RANGE,
    TEACHER_SLIP_RATE,
    make_dataset,
)
from .tokenizer import build_tokenizer
from .warmup import DEFAULT_SFT_BATCH_SIZE, DEFAULT_SFT_CLEAN_FRACTION, DEFAULT_SFT_LR, DEFAULT_SFT_STEPS, sft_warmup

__all__ = ["RECOMMENDED_RL_ARGS", "TRAIN_NUM_PROBLEMS", "build_toy_model"]

TRAIN_NUM_PROBLEMS = 1500  # problems used by the demo for SFT and RL (drawn from the train pool)

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
    # GRPOConfig defaults to True; recomputation only costs time at this size (transformers' current name for it)
    **no_activation_checkpointing(),
}
