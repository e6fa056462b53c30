"""The toy model's supervised warm-up (:func:`sft_warmup`): correct worked solutions first, then an imperfect
teacher's, so that RL with a verifiable reward has something to fix. A plain torch loop rather than TRL's
``SFTTrainer``, which was measured slower on this task (docs/benchmarks.md, "The toy task")."""

from __future__ import annotations

import math
import random

import torch

from .problems import TEACHER_SLIP_RATE, worked_solution
from .tokenizer import _prompt_strings

__all__ = ["DEFAULT_SFT_BATCH_SIZE", "DEFAULT_SFT_CLEAN_FRACTION", "DEFAULT_SFT_LR", "DEFAULT_SFT_STEPS", "sft_warmup"]

DEFAULT_SFT_STEPS = 400
DEFAULT_SFT_LR = 3e-3
DEFAULT_SFT_BATCH_SIZE = 64
DEFAULT_SFT_CLEAN_FRACTION = 0.5  # first half of the warm-up on correct solutions, then the imperfect teacher


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
