"""`trl-rpg demo --async`: `AsyncRPGTrainer` against TRL's `AsyncGRPOTrainer` on the toy task, on CPU, every sample
`staleness` policy versions old.

TRL's asynchronous trainer needs a vLLM server and a GPU kernel; here the CPU stand-ins take their place
(`trl_rpg.toy.StaleRolloutWorker`, `VarlenAttention`, inside `async_trainer_on_cpu`): the worker keeps every policy
version the trainer sends and draws each group with the version `staleness` before the current one, so every sample
is exactly that many versions old as TRL measures it (`max_staleness` is the same: nothing is dropped). Both trainers
start from the same warmed-up toy model (built on the spot, cached in `output_dir/toy-model`), see the same prompts in
the same order and the same seed; the held-out accuracy (greedy, problems never trained on) is measured at the start
and after each run, and the difference printed.

Settings: 96 optimizer steps of 64 completions (8 prompts x 8), constant learning rate 1.5e-4 for both, TRL's
advantages (reward - group mean) / group std; AsyncGRPO is TRL's loss as it is (PPO clip 0.2, no KL); AsyncRPG is
RPG-REINFORCE with RPG-Style Clip (0.2, 0.28, c = 10), the KL term (`rpg_divergence="urkl"`) towards the version that
sampled each sample, beta 1.0 (the paper's 1e-4 is far too small against std-normalised advantages:
docs/benchmarks.md section 6). These are provisional: the tuned settings come from the benefit benchmark of issue
#43 (in progress). One seed on one machine is an illustration, not a measurement of which is better: the demo prints
what it measured and claims nothing (the benchmark, `python -m benchmarks.asynchronous`, has the intervals).

    >>> from trl_rpg.cli.async_toy_demo import run_async_demo
    >>> result = run_async_demo("rpg-demo-async", staleness=8)  # doctest: +SKIP
    >>> result["accuracy"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from ..toy import task as toy

__all__ = ["ASYNC_DEMO_BETA", "ASYNC_DEMO_EVAL_PROBLEMS", "ASYNC_DEMO_LEARNING_RATE", "ASYNC_DEMO_MAX_STEPS",
           "ASYNC_DEMO_STALENESS", "ASYNC_METHODS", "QUICK", "async_demo_config", "comparison_lines",
           "run_async_demo"]

#: Optimizer steps of each run (the asynchronous benchmark's).
ASYNC_DEMO_MAX_STEPS = 96
#: Policy versions between the version that samples and the one that trains (`--staleness`).
ASYNC_DEMO_STALENESS = 8
#: Constant learning rate of both trainers; provisional (the benefit benchmark, issue #43, tunes it).
ASYNC_DEMO_LEARNING_RATE = 1.5e-4
#: AsyncRPG's beta; provisional (the benchmark's sweep chose 1.0 at staleness 8; issue #43 tunes it).
ASYNC_DEMO_BETA = 1.0
#: Held-out problems of each evaluation.
ASYNC_DEMO_EVAL_PROBLEMS = 256
#: `--quick`: a check that the demo runs (its accuracies mean little).
QUICK = {"max_steps": 2, "sft_steps": 20, "num_eval_problems": 32}
#: The two runs: (name, its trainer's settings beyond the shared ones).
ASYNC_METHODS: dict[str, dict[str, Any]] = {
    "AsyncGRPO": {},  # TRL's asynchronous trainer as it is: PPO clip (epsilon 0.2), no KL term
    "AsyncRPG": {"beta": ASYNC_DEMO_BETA, "rpg_divergence": "urkl", "rpg_estimator": "reinforce", "epsilon": 0.2,
                 "epsilon_high": 0.28, "rpg_dual_clip_c": 10.0},
}
_BATCH, _GENERATIONS = 64, 8


def async_demo_config(method: str, output_dir: str, seed: int, max_steps: int, staleness: int,
                      learning_rate: float = ASYNC_DEMO_LEARNING_RATE, **overrides):
    """The config of one run: `AsyncGRPOConfig` for "AsyncGRPO", `AsyncRPGConfig` for "AsyncRPG"."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from ..trainers.async_config import AsyncRPGConfig

    kwargs = dict(output_dir=output_dir, seed=seed, data_seed=seed, max_steps=max_steps, learning_rate=learning_rate,
                  lr_scheduler_type="constant", per_device_train_batch_size=_BATCH, num_generations=_GENERATIONS,
                  max_completion_length=toy.MAX_COMPLETION_LENGTH, temperature=1.0, gradient_accumulation_steps=1,
                  max_staleness=staleness, token_budget=0, use_cpu=True, bf16=False, report_to="none",
                  save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, log_level="error",
                  gradient_checkpointing=False, **ASYNC_METHODS[method])
    kwargs.update(overrides if method == "AsyncRPG" else {})
    return (AsyncRPGConfig if method == "AsyncRPG" else AsyncGRPOConfig)(**kwargs)


def _train(method: str, model_path: str, tokenizer, train_dataset, args, staleness: int, seed: int):
    """Train one method from `model_path` with the stale CPU worker; return the trainer."""
    from transformers.trainer_callback import PrinterCallback
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from .._compat import async_trainer_on_cpu
    from ..toy.async_rollouts import StaleRolloutWorker, VarlenAttention
    from ..trainers.async_trainer import AsyncRPGTrainer

    worker = StaleRolloutWorker(model_path, train_dataset, toy.toy_reward, tokenizer, num_generations=_GENERATIONS,
                                max_completion_length=args.max_completion_length, temperature=args.temperature,
                                staleness=staleness, seed=seed, groups_per_call=_BATCH // _GENERATIONS)
    cls = AsyncRPGTrainer if method == "AsyncRPG" else AsyncGRPOTrainer
    with async_trainer_on_cpu(VarlenAttention):
        trainer = cls(model_path, toy.toy_reward, args, train_dataset, tokenizer, rollout_worker=worker,
                      weight_transfer=worker)
        trainer.remove_callback(PrinterCallback)  # no per-step log dicts
        trainer.train()
    return trainer


def comparison_lines(accuracy: dict[str, float], staleness: int, num_problems: int) -> list[str]:
    """The demo's verdict, as printed: the three held-out accuracies, then AsyncRPG - AsyncGRPO in points."""
    difference = (accuracy["AsyncRPG"] - accuracy["AsyncGRPO"]) * 100
    return [f"  held-out accuracy: start {accuracy['start']:.1%}, AsyncGRPO {accuracy['AsyncGRPO']:.1%}, "
            f"AsyncRPG {accuracy['AsyncRPG']:.1%}",
            f"  AsyncRPG - AsyncGRPO: {difference:+.1f} points (staleness {staleness}, one seed, {num_problems} "
            "problems: an illustration; the benchmark with intervals is docs/benchmarks.md section 6)"]


def _accuracy(model, tokenizer, eval_dataset) -> float:
    """Held-out accuracy of a trained model: generated with SDPA (the trainer left TRL's packed tree attention)."""
    model.set_attn_implementation("sdpa")
    return toy.evaluate_accuracy(model, tokenizer, eval_dataset)


def run_async_demo(output_dir: str = "rpg-demo-async", seed: int = 0, max_steps: int = ASYNC_DEMO_MAX_STEPS,
                   staleness: int = ASYNC_DEMO_STALENESS, num_threads: int = 1, sft_steps: int | None = None,
                   num_eval_problems: int = ASYNC_DEMO_EVAL_PROBLEMS, rl_overrides: dict[str, Any] | None = None,
                   verbose: bool = True) -> dict[str, Any]:
    """Train AsyncGRPO, then AsyncRPG, from the same toy model with every sample `staleness` versions old; print and
    return the held-out accuracy at the start and after each, and their difference (`metrics.json` in
    `output_dir`). `rl_overrides`: more `AsyncRPGConfig` settings for the AsyncRPG run (e.g. `rpg_divergence`)."""
    from .toy_demo import _quiet

    if staleness < 0 or max_steps < 1:
        raise ValueError(f"run_async_demo: staleness must be >= 0 and max_steps >= 1 (got {staleness}, {max_steps}).")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL's "experimental API" notice
    threads = max(1, min(int(num_threads), os.cpu_count() or 1))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with _quiet():
            return _run(output_dir, seed, max_steps, staleness, threads, sft_steps, num_eval_problems,
                        rl_overrides or {}, print if verbose else (lambda *a, **k: None))
    finally:
        torch.set_num_threads(previous_threads)


def _run(output_dir, seed, max_steps, staleness, threads, sft_steps, num_eval_problems, rl_overrides, say):
    t0 = time.perf_counter()
    say(f"trl-rpg demo --async: AsyncRPG against AsyncGRPO on a toy arithmetic task, CPU ({threads} "
        f"thread{'s' if threads > 1 else ''}), every sample {staleness} policy versions old, output in {output_dir}/")
    say("[1/4] building the tiny model and warming it up (cached in toy-model/) ...", flush=True)
    model_path = os.path.join(output_dir, "toy-model")
    build = {"seed": seed, **({} if sft_steps is None else {"sft_steps": sft_steps})}
    model, tokenizer = toy.build_toy_model(model_path, **build)
    eval_dataset = toy.make_dataset(num_eval_problems, seed=toy.EVAL_SEED, split="test")
    train_dataset = toy.make_dataset(toy.TRAIN_NUM_PROBLEMS, seed=seed, split="train")
    accuracy = {"start": toy.evaluate_accuracy(model, tokenizer, eval_dataset)}
    seconds = {"warmup": round(time.perf_counter() - t0, 1)}
    say(f"[2/4] held-out accuracy at the start: {accuracy['start']:.1%} ({len(eval_dataset)} unseen problems)")
    for i, method in enumerate(ASYNC_METHODS, start=3):
        args = async_demo_config(method, os.path.join(output_dir, method), seed, max_steps, staleness,
                                 **rl_overrides)
        what = ("TRL's loss, PPO clip, no KL" if method == "AsyncGRPO" else
                f"RPG's loss, {args.rpg_divergence} KL towards each sample's sampler, beta {args.beta}")
        say(f"[{i}/4] {method} ({what}): {max_steps} steps of {_BATCH} completions, learning rate "
            f"{args.learning_rate} ...", flush=True)
        t = time.perf_counter()
        trainer = _train(method, model_path, tokenizer, train_dataset, args, staleness, seed)
        accuracy[method] = _accuracy(trainer.model, tokenizer, eval_dataset)
        seconds[method] = round(time.perf_counter() - t, 1)
        say(f"      held-out accuracy after {method}: {accuracy[method]:.1%} ({seconds[method]:.0f}s)")
    difference = accuracy["AsyncRPG"] - accuracy["AsyncGRPO"]
    seconds["total"] = round(time.perf_counter() - t0, 1)
    result = {"accuracy": accuracy, "difference": difference, "staleness": staleness, "max_steps": max_steps,
              "seed": seed, "num_eval_problems": len(eval_dataset), "learning_rate": ASYNC_DEMO_LEARNING_RATE,
              "beta": rl_overrides.get("beta", ASYNC_DEMO_BETA), "seconds": seconds, "output_dir": output_dir}
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    say("")
    for line in comparison_lines(accuracy, staleness, len(eval_dataset)):
        say(line)
    say(f"  total time {seconds['total']:.0f}s; metrics in {output_dir}/metrics.json")
    return result
