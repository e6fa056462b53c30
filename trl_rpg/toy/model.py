"""The package's one tiny-model builder: a randomly initialised ``Qwen2ForCausalLM`` matching a tokenizer
(:func:`build_model`; the tests and ``scripts/gpu_check.py`` use it too)."""

from __future__ import annotations

import random
from typing import Any

import torch

from .problems import MAX_COMPLETION_LENGTH

__all__ = ["DEFAULT_MODEL_KWARGS", "build_model"]

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
