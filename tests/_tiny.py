"""A tiny local model, tokenizer and data set for trainer tests (no downloads)."""

import os
import shutil
import sys
from pathlib import Path

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from trl_rpg.toy import build_model

CHARS = list("0123456789+-*=? abcdefghijklmnopqrstuvwxyz:")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}={% endif %}"
    )
    return tokenizer


def tiny_model(tokenizer=None, seed: int = 0, hidden_size: int = 32, layers: int = 2) -> Qwen2ForCausalLM:
    """A random tiny Qwen2 for `tokenizer`, built by the package's one tiny-model builder (`trl_rpg.toy`)."""
    tokenizer = tokenizer or tiny_tokenizer()
    return build_model(tokenizer, hidden_size=hidden_size, num_layers=layers, num_heads=4, seed=seed,
                       num_key_value_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=128,
                       bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)


def save_tiny_model(path: str, seed: int = 0, **kwargs) -> str:
    """Save a tiny random model and its tokenizer to `path` (a local directory usable as `model=path`)."""
    if not os.path.exists(os.path.join(path, "config.json")):
        tokenizer = tiny_tokenizer()
        tiny_model(tokenizer, seed=seed, **kwargs).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def tiny_dataset(n: int = 16, conversational: bool = False) -> Dataset:
    prompts = [f"{i % 10}+{(3 * i) % 10}" for i in range(n)]
    if conversational:
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    return Dataset.from_dict({"prompt": prompts})


def length_reward(completions, **kwargs):
    """A dense reward that a tiny model can move in a few steps: longer completions (up to 8 chars) score higher."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [min(len(t), 8) / 8.0 for t in texts]


def digit_reward(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def cpu_args(output_dir, **overrides) -> dict:
    """GRPO/RPG config kwargs for a fast CPU run."""
    args = dict(
        output_dir=str(output_dir), per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        max_steps=4, learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
        save_strategy="no", seed=0, dataloader_num_workers=0,
    )
    args.update(overrides)
    return args


def console_script() -> list[str]:
    """The installed `trl-rpg` script next to this interpreter (else the same entry point through python -c)."""
    script = Path(sys.executable).with_name("trl-rpg")
    if script.exists():
        return [str(script)]
    found = shutil.which("trl-rpg")
    return [found] if found else [sys.executable, "-c", "import sys; from trl_rpg.cli import main; sys.exit(main())"]
