"""`trl-rpg demo`: RPG training of a tiny model on a toy arithmetic-reasoning task, on CPU, with no download.

The model is built on the spot (`trl_rpg.toy.task.build_toy_model`: a character-level tokenizer and a small Qwen2 model
warmed up on worked solutions such as `"8+7=15,15-9=6"` written by an imperfect teacher who often forgets a carry or
a borrow). `RPGTrainer` then trains it with the toy reward (1 for a correct final answer) under RPG's defaults
(RPG-REINFORCE with the unnormalised reverse KL, beta = 1e-4, RPG-Style Clip, the sampler as reference, each
generation batch reused). Held-out accuracy (greedy decoding, problems never seen in training) is measured before,
during and after. Outputs, in `output_dir`: the trained model and tokenizer, `curves.png` (reward and accuracy over
steps), `metrics.json` and a model card.

    >>> from trl_rpg.cli.toy_demo import run_demo
    >>> result = run_demo("rpg-demo")  # doctest: +SKIP
    >>> result["accuracy_before"], result["accuracy_after"]  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from .._compat import no_activation_checkpointing
from ..toy import task as toy

__all__ = ["DEMO_EVAL_EVERY", "DEMO_MAX_STEPS", "DEMO_MIN_GAIN", "DEMO_RL_ARGS", "complete_demo_card",
           "demo_config_kwargs", "plot_curves", "run_demo"]

#: RL optimizer steps of the default demo. Measured (seeds 0-6, held-out accuracy every 5 steps): most of the gain
#: arrives within 15-25 steps and accuracy is flat after ~25 (up to ~40 for the slowest seed, 2); 200 steps spent
#: most of the run on that plateau.
DEMO_MAX_STEPS = 40
#: Held-out evaluation every this many steps (plus before and after training).
DEMO_EVAL_EVERY = 5
#: The demo's settings on top of `toy.RECOMMENDED_RL_ARGS`: Adam at 1e-3 wrecks a warmed-up model this small within
#: a few dozen steps (measured); 1e-4, constant, improves it steadily.
DEMO_RL_ARGS: dict[str, Any] = dict(learning_rate=1e-4, lr_scheduler_type="constant")
#: Smallest rise of held-out accuracy (absolute) the default demo is tested to deliver. Measured gains (40 steps):
#: seeds 0-7 on one 2-core machine +0.228 to +0.434 (mean 0.32); on another, seed 0 +0.368 and seed 2 +0.148 (the
#: same seed gave +0.302 on the first: CPU arithmetic differs in the last bits and the runs diverge). The bar is
#: half the lowest gain seen on any machine. What it catches (measured, seed 0): a run that does not learn gains
#: exactly 0 (learning_rate=0: 0.400 -> 0.400) and an objective of the wrong sign loses accuracy
#: (reward_weights=[-1]: 0.400 -> 0.048).
DEMO_MIN_GAIN = 0.07

# Settings of toy.RECOMMENDED_RL_ARGS that RPGConfig sets itself, to its RPG defaults: the demo keeps RPG's
# objective (divergence, estimator, beta, clip) rather than a GRPO-flavoured override.
_RPG_OWNED = ("beta", "epsilon", "epsilon_high", "loss_type", "rpg_divergence", "rpg_estimator", "rpg_dual_clip_c")


def demo_config_kwargs(output_dir: str, seed: int = 0, max_steps: int = DEMO_MAX_STEPS, **overrides) -> dict:
    """`RPGConfig` keyword arguments of the demo: the toy task's recommended CPU settings, RPG's objective."""
    kwargs = {k: v for k, v in toy.RECOMMENDED_RL_ARGS.items() if k not in _RPG_OWNED}
    kwargs.update(DEMO_RL_ARGS)
    kwargs.update(output_dir=output_dir, seed=seed, max_steps=max_steps, disable_tqdm=True, report_to="none",
                  save_strategy="no", logging_steps=1, use_cpu=True, bf16=False, dataloader_num_workers=0,
                  **no_activation_checkpointing())  # TRL's default is on: pure overhead on a model this small
    kwargs.update(overrides)
    return kwargs


class _DemoCallback(TrainerCallback):
    """Records reward per step and held-out accuracy every `eval_every` steps; prints one line per step."""

    def __init__(self, tokenizer, eval_dataset, eval_every: int, verbose: bool, t0: float):
        self.tokenizer, self.eval_dataset, self.eval_every = tokenizer, eval_dataset, eval_every
        self.verbose, self.t0 = verbose, t0
        self.rewards: list[tuple[int, float]] = []  # (step, mean reward of the generation batch scored then)
        self.accuracy: list[tuple[int, float]] = []
        self.model = None
        self._printed = 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.model = model

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.rewards.append((state.global_step, float(logs["reward"])))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        every = self.eval_every or max(1, state.max_steps // 10)
        if self.verbose and (step % every == 0 or step == state.max_steps):
            recent = [r for _, r in self.rewards[self._printed:]]
            self._printed = len(self.rewards)
            if recent:
                print(f"  step {step:4d}/{state.max_steps}  training reward {sum(recent) / len(recent):.3f}  "
                      f"[{time.perf_counter() - self.t0:4.0f}s]", flush=True)
        if self.eval_every and step % self.eval_every == 0 and step < state.max_steps:
            self.evaluate(model or self.model, step)

    def evaluate(self, model, step: int) -> float:
        accuracy = toy.evaluate_accuracy(model, self.tokenizer, self.eval_dataset)
        self.accuracy.append((step, accuracy))
        if self.verbose:
            print(f"  step {step:4d}  held-out accuracy {accuracy:.1%}", flush=True)
        return accuracy


def plot_curves(rewards: list[tuple[int, float]], accuracy: list[tuple[int, float]], path: str,
                title: str = "RPG on the toy arithmetic task", log_history: list[dict] | None = None,
                accuracy_label: str = "held-out accuracy (greedy)") -> str:
    """Write the demo's PNG: `trl_rpg.evaluation.plots.draw_run`'s panels of `log_history` (reward, divergence, the
    range of
    `w`, clip fractions; the reward alone from `rewards` without it) with the held-out accuracy on the reward panel."""
    from ..evaluation.plots import draw_run

    history = log_history if log_history is not None else [{"step": s, "reward": r} for s, r in rewards]
    return draw_run(history, path, title=title, extra={accuracy_label: accuracy} if accuracy else None)


def run_demo(
    output_dir: str = "rpg-demo",
    seed: int = 0,
    max_steps: int = DEMO_MAX_STEPS,
    eval_every: int | None = DEMO_EVAL_EVERY,
    num_threads: int = 1,
    sft_steps: int | None = None,
    num_eval_problems: int = toy.EVAL_NUM_PROBLEMS,
    num_train_problems: int = toy.TRAIN_NUM_PROBLEMS,
    toy_cache_dir: str | None = None,
    rl_overrides: dict[str, Any] | None = None,
    plot: bool = True,
    verbose: bool = True,
) -> dict[str, Any]:
    """Build the toy model, measure held-out accuracy, train with RPG, measure again; save model, plot, metrics.

    Args:
        output_dir: where the trained model + tokenizer, `curves.png`, `metrics.json` and `README.md` go.
        seed: seed of the model initialisation, the warm-up and RL.
        max_steps: RL optimizer steps.
        eval_every: held-out evaluation every this many steps (`None`/0: only before and after).
        num_threads: torch CPU threads. One is fastest for a model this small: its matrix products are too small
            to split, and on a busy machine a second thread mostly waits (measured: 3-10x slower with 2 threads).
        sft_steps: supervised warm-up steps (default: `toy.DEFAULT_SFT_STEPS`).
        num_eval_problems: held-out problems used for accuracy.
        num_train_problems: training problems (the prompts RL samples from).
        toy_cache_dir: if set, the warmed-up toy model is cached there (`toy.build_toy_model(output_dir=...)`).
        rl_overrides: extra `RPGConfig` keyword arguments (e.g. `{"rpg_divergence": "fkl"}`).
        plot: write `curves.png`.
        verbose: print progress.

    Returns:
        `{"accuracy_before", "accuracy_after", "rewards", "accuracy", "seconds", "output_dir", "plot", ...}`.
    """
    threads = max(1, min(int(num_threads), os.cpu_count() or 1))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with _quiet():
            return _run_demo(output_dir, seed, max_steps, eval_every, threads, sft_steps, num_eval_problems,
                             num_train_problems, toy_cache_dir, rl_overrides, plot, verbose)
    finally:
        torch.set_num_threads(previous_threads)


#: An example problem of the toy task, in its prompt format (`toy.make_dataset`), and the teacher's solution.
CARD_EXAMPLE = ("8+7-9=?", "8+7=15,15-9=6")


def card_quick_start(load_as: str) -> str:
    """The model card's quick start: the toy prompt format, greedy decoding (what the accuracy measures)."""
    problem, solution = CARD_EXAMPLE
    return f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained({load_as!r})
tokenizer = AutoTokenizer.from_pretrained({load_as!r})
# the toy task's prompt: a chain of single-digit additions and subtractions, as a chat message
prompt = tokenizer.apply_chat_template([{{"role": "user", "content": {problem!r}}}], tokenize=False,
                                       add_generation_prompt=True)
inputs = tokenizer(prompt, return_tensors="pt", return_token_type_ids=False)
output = model.generate(**inputs, max_new_tokens={toy.MAX_COMPLETION_LENGTH}, do_sample=False)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))  # e.g. {solution}
```"""


def complete_demo_card(path: str, load_as: str, args, *, seed: int, n_params: int, sft_steps: int,
                       accuracy_before: float, accuracy_after: float, num_eval_problems: int, steps: int) -> None:
    """Make TRL's generic card (written by `RPGTrainer.create_model_card`) the card of the demo model: a quick start
    in the toy prompt format, what the training did, and the measured held-out accuracy before and after."""
    import re

    with open(path) as f:
        card = f.read()
    reuse = args.steps_per_generation // args.gradient_accumulation_steps
    procedure = (
        f"A {n_params / 1e3:.0f}k-parameter Qwen2-architecture model with a character-level tokenizer, built on the "
        f"spot by `trl_rpg.toy` (nothing downloaded), warmed up for {sft_steps} supervised steps on worked solutions "
        f"(`{CARD_EXAMPLE[0]}` -> `{CARD_EXAMPLE[1]}`) by an imperfect teacher who often forgets a carry or a "
        f"borrow, then trained with `RPGTrainer` for {steps} optimizer steps on the reward \"1 if the final answer "
        f"is right\": estimator `{args.rpg_estimator}`, divergence `{args.rpg_divergence}`, beta {args.beta}, "
        f"reference `{args.rpg_reference}`, {args.num_generations} completions per prompt at temperature "
        f"{args.temperature}, each generation batch reused for {reuse} optimizer steps, learning rate "
        f"{args.learning_rate}, seed {seed}. Made by `trl-rpg demo` (`trl_rpg.cli.toy_demo.run_demo`); "
        "`curves.png` shows the training reward and the held-out accuracy over the steps.")
    results = (
        f"## Results\n\nHeld-out accuracy (greedy decoding, {num_eval_problems} problems never seen in training): "
        f"**{accuracy_before:.1%} before RPG, {accuracy_after:.1%} after** "
        f"({(accuracy_after - accuracy_before) * 100:+.1f} points).\n\n")
    quick_start = re.compile(r"(## Quick start\n\n)```python\n.*?```", re.S)
    card, found = quick_start.subn(lambda m: m.group(1) + card_quick_start(load_as), card, count=1)
    if not found:
        card += f"\n## Quick start\n\n{card_quick_start(load_as)}\n"
    training = re.compile(r"## Training procedure\n\s*")
    card, found = training.subn(lambda m: results + "## Training procedure\n\n" + procedure + "\n\n", card, count=1)
    if not found:
        card += f"\n{results}## Training procedure\n\n{procedure}\n"
    with open(path, "w") as f:
        f.write(card)


@contextlib.contextmanager
def _quiet():
    """Silence library warnings and info logs during the demo; restore everything afterwards."""
    from transformers import logging as hf_logging

    names = ("trl", "accelerate", "datasets", "DeepSpeed", "torch.distributed", "trl_rpg")
    levels = {name: logging.getLogger(name).level for name in names}
    verbosity = hf_logging.get_verbosity()
    progress_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress_bars:
            hf_logging.enable_progress_bar()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _run_demo(output_dir, seed, max_steps, eval_every, threads, sft_steps, num_eval_problems, num_train_problems,
              toy_cache_dir, rl_overrides, plot, verbose):
    from ..trainers.config import RPGConfig
    from ..trainers.trainer import RPGTrainer

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    say = print if verbose else (lambda *a, **k: None)
    say(f"trl-rpg demo: RPG on a toy arithmetic task, CPU ({threads} thread{'s' if threads > 1 else ''}), "
        f"output in {output_dir}/")

    # 1. Tiny model + supervised warm-up on an imperfect teacher's solutions (built here, no download)
    build_kwargs: dict[str, Any] = dict(seed=seed, num_train_problems=num_train_problems)
    if sft_steps is not None:
        build_kwargs["sft_steps"] = sft_steps
    say("[1/4] building the tiny model and warming it up on an imperfect teacher's worked solutions ...", flush=True)
    model, tokenizer = toy.build_toy_model(output_dir=toy_cache_dir, **build_kwargs)
    timings["warmup"] = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    say(f"      {n_params / 1e3:.0f}k parameters, warm-up done in {timings['warmup']:.0f}s")

    # 2. Held-out accuracy before RL
    eval_dataset = toy.make_dataset(num_eval_problems, seed=toy.EVAL_SEED, split="test")
    train_dataset = toy.make_dataset(num_train_problems, seed=seed, split="train")
    t = time.perf_counter()
    accuracy_before = toy.evaluate_accuracy(model, tokenizer, eval_dataset)
    timings["eval_before"] = time.perf_counter() - t
    say(f"[2/4] held-out accuracy before RPG: {accuracy_before:.1%} ({len(eval_dataset)} unseen problems)")

    # 3. RPG
    args = RPGConfig(**demo_config_kwargs(output_dir, seed=seed, max_steps=max_steps, **(rl_overrides or {})))
    say(f"[3/4] RPG training: {max_steps} steps, divergence={args.rpg_divergence}, estimator={args.rpg_estimator}, "
        f"beta={args.beta}, reference={args.rpg_reference}, {args.num_generations} completions per prompt, each "
        f"batch reused for {args.steps_per_generation // args.gradient_accumulation_steps} steps")
    callback = _DemoCallback(tokenizer, eval_dataset, eval_every or 0, verbose, t0)
    callback.accuracy.append((0, accuracy_before))
    t = time.perf_counter()
    trainer = RPGTrainer(model=model, reward_funcs=toy.toy_reward, args=args, train_dataset=train_dataset,
                         processing_class=tokenizer, callbacks=[callback])
    trainer.remove_callback(PrinterCallback)  # the demo prints its own one-line-per-step progress
    trainer.train()
    timings["rl"] = time.perf_counter() - t

    # 4. Held-out accuracy after RL, outputs
    t = time.perf_counter()
    accuracy_after = toy.evaluate_accuracy(trainer.model, tokenizer, eval_dataset)
    callback.accuracy.append((trainer.state.global_step, accuracy_after))
    timings["eval_after"] = time.perf_counter() - t

    os.makedirs(output_dir, exist_ok=True)
    trainer.save_model(output_dir)
    tokenizer.save_pretrained(output_dir)
    trainer.create_model_card(model_name=os.path.basename(os.path.abspath(output_dir)), dataset_name="toy arithmetic")
    complete_demo_card(os.path.join(output_dir, "README.md"), output_dir, args, seed=seed, n_params=n_params,
                       sft_steps=build_kwargs.get("sft_steps", toy.DEFAULT_SFT_STEPS),
                       accuracy_before=accuracy_before, accuracy_after=accuracy_after,
                       num_eval_problems=len(eval_dataset), steps=trainer.state.global_step)
    plot_path = None
    if plot:
        try:
            plot_path = plot_curves(callback.rewards, callback.accuracy, os.path.join(output_dir, "curves.png"),
                                    log_history=trainer.state.log_history)
        except ImportError:
            say("      (matplotlib is not installed: no plot; pip install 'trl-rpg[demo]')")
    timings["total"] = time.perf_counter() - t0
    result = {
        "accuracy_before": accuracy_before,
        "accuracy_after": accuracy_after,
        "rewards": callback.rewards,
        "accuracy": callback.accuracy,
        "num_eval_problems": len(eval_dataset),
        "max_steps": max_steps,
        "seed": seed,
        "threads": threads,
        "seconds": timings,
        "rpg": {"divergence": args.rpg_divergence, "estimator": args.rpg_estimator, "beta": args.beta,
                "reference": args.rpg_reference, "epsilon": args.epsilon, "epsilon_high": args.epsilon_high,
                "dual_clip_c": args.rpg_dual_clip_c, "learning_rate": args.learning_rate},
        "output_dir": output_dir,
        "plot": plot_path,
    }
    with open(os.path.join(output_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)

    say(f"[4/4] held-out accuracy after RPG:  {accuracy_after:.1%}")
    say("")
    say(f"  accuracy before: {accuracy_before:.1%}   after: {accuracy_after:.1%}   "
        f"({(accuracy_after - accuracy_before) * 100:+.1f} points, {len(eval_dataset)} held-out problems)")
    say(f"  model saved to {output_dir}/, plot: {plot_path or '(none)'}, total time {timings['total']:.0f}s")
    return result
