"""Real-model learning benchmark: RPG-REINFORCE (UFKL, URKL), GRPO and DAPO on SmolLM2-135M-Instruct (LoRA, CPU).

    python -m benchmarks.smollm2            # 4 methods x 3 seeds x 24 steps (about an hour on 2 quiet cores)
    python -m benchmarks.smollm2 --quick    # 2 methods x 1 seed x 4 steps (a smoke run, minutes)
    python -m benchmarks.smollm2 --resume benchmarks/results/smollm2.json     # continue an interrupted run
    python -m benchmarks.smollm2 --summarize benchmarks/results/smollm2.json  # tables and plot of a results file

The model is the registry's SmolLM2-135M-Instruct (``trl_rpg.smollm2.prepare_smollm2``); the task is
``trl_rpg.smollm2.task`` (single-digit addition through the model's chat template, reward 1 when the reply ends and
its last number is the sum); the RL settings are the demo's (``trl_rpg.cli.smollm2_demo``: 16 replies per optimizer
step
at temperature 1, LoRA on the last 8 layers, learning rate 5e-4) with each generation batch reused for ``reuse``
optimizer steps, as the toy learning benchmark does. The methods are the toy benchmark's
(``benchmarks.learning.METHODS`` and ``RPG_COMMON``: beta 0.04 for GRPO and the RPG variants, DAPO without KL).
Every method of a seed starts from the same model and sees the same prompts; held-out accuracy (30 problems never
trained on: greedy, and the mean of ``eval_samples`` replies sampled at temperature 1) is measured at step 0 (once
per seed) and every ``eval_every`` steps. Runs are spread over ``--workers`` processes with one torch thread each.
The JSON (``benchmarks/results/smollm2.json``) is rewritten after every run (``complete`` false until the
end), so an interrupted run loses only the runs in flight; the plot is written next to it (``smollm2.png``).

What it can show: whether each method moves a real pretrained model on a verifiable task, how far in a fixed
budget, and paired differences between methods (same seed: same prompts and sampling seed) with 95% intervals. What
it cannot: anything about long training, large models or hard reasoning (a 135M model, single-digit sums, 24 steps);
with 3 seeds, only large differences are detectable. Results: docs/benchmarks.md, "SmolLM2-135M-Instruct".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass

from ._common import (
    CACHE_DIR,
    WorkerPool,
    ci95,
    default_results_path,
    fmt,
    init_worker,
    loadavg,
    machine_info,
    markdown_table,
    mean_std,
    save_figure,
    write_json,
)
from .learning import METHODS, RPG_COMMON

DEFAULT_METHODS = ("RPG-REINFORCE-UFKL", "RPG-REINFORCE-URKL", "GRPO", "DAPO")


@dataclass
class Settings:
    seeds: tuple = (0, 1, 2)
    methods: tuple = DEFAULT_METHODS
    generation_batches: int = 6  # budget: optimizer steps = generation_batches * reuse
    reuse: int = 4  # optimizer steps per generation batch (steps 2..4 of each batch are off-policy)
    eval_every: int = 12  # optimizer steps between held-out evaluations (step 0 once per seed, and the last step)
    eval_samples: int = 4  # sampled replies per held-out problem (plus one greedy reply)
    operands: str = "single-digit"  # the task's problems (trl_rpg.smollm2.task.OPERANDS)
    max_completion_length: int = 16  # tokens a reply may take (training and held-out evaluation)
    temperature: float = 1.0  # sampling temperature of training and of the held-out sampled accuracy
    workers: int = 2
    model_cache: str | None = None  # None: trl_rpg's cache folder
    output_dir: str = os.path.join(CACHE_DIR, "smollm2-runs")

    @property
    def max_steps(self) -> int:
        return self.generation_batches * self.reuse


FULL = Settings()
QUICK = Settings(seeds=(0,), methods=("RPG-REINFORCE-URKL", "GRPO"), generation_batches=1, eval_every=4,
                 eval_samples=1)


# ---------------------------------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------------------------------


def _evaluate(model, tokenizer, s: Settings, seed: int) -> dict:
    from trl_rpg.smollm2 import task

    return task.evaluate(model, tokenizer, task.make_dataset(split="test", operands=s.operands),
                         samples=s.eval_samples, seed=seed, max_completion_length=s.max_completion_length,
                         temperature=s.temperature)


def evaluate_start(s: Settings, path: str, seed: int) -> dict:
    """Held-out accuracy of the untrained model with the sampling seed of ``seed`` (shared by its methods)."""
    init_worker()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return {"seed": seed, "accuracy": _evaluate(AutoModelForCausalLM.from_pretrained(path),
                                                AutoTokenizer.from_pretrained(path), s, seed)}


def run_config(s: Settings, method: str, seed: int, out: str, setting: dict | None = None):
    """``("rpg" | "grpo", config)`` of one run: the demo's settings, the layout, the method's own, then ``setting``
    (a tuned learning rate and beta, `benchmarks/smollm2_tuned.py`)."""
    from trl import GRPOConfig

    from trl_rpg import RPGConfig
    from trl_rpg.cli.smollm2_demo import smollm2_config_kwargs

    spec = dict(METHODS[method])
    kind = spec.pop("trainer")
    kwargs = smollm2_config_kwargs(out, seed=seed, max_steps=s.max_steps, steps_per_generation=s.reuse,
                                   max_completion_length=s.max_completion_length, temperature=s.temperature,
                                   **{**(RPG_COMMON if kind == "rpg" else {}), **spec, **(setting or {})})
    return kind, (RPGConfig if kind == "rpg" else GRPOConfig)(**kwargs)


_LOG_KEYS = ("kl", "entropy", "rpg/w_mean", "rpg/w_max", "rpg/clip_frac_high", "rpg/clip_frac_low",
             "rpg/clip_frac_dual", "clip_ratio/region_mean", "completions/mean_length", "completions/clipped_ratio")


def train_one(s: Settings, path: str, method: str, seed: int, setting: dict | None = None) -> dict:
    """Train ``method`` (at ``setting``: see :func:`run_config`) from the untrained model; return held-out accuracy and
    the reward of each generation batch."""
    init_worker()
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from trl_rpg import RPGTrainer
    from trl_rpg.cli.smollm2_demo import TRAIN_PROMPTS, smollm2_lora
    from trl_rpg.smollm2 import task

    tag = "".join(f"-{k}{v:g}" for k, v in sorted((setting or {}).items()))
    kind, config = run_config(s, method, seed, os.path.join(s.output_dir, f"{method}-seed{seed}-r{s.reuse}{tag}"),
                              setting)
    tokenizer = AutoTokenizer.from_pretrained(path)
    accuracy: list = []

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % s.eval_every == 0 or state.global_step == state.max_steps:
                accuracy.append((state.global_step, _evaluate(model, tokenizer, s, seed)))

    t0 = time.perf_counter()
    trainer = (RPGTrainer if kind == "rpg" else GRPOTrainer)(
        model=AutoModelForCausalLM.from_pretrained(path), processing_class=tokenizer,
        reward_funcs=task.arithmetic_reward, args=config,
        train_dataset=task.make_dataset(TRAIN_PROMPTS, seed=seed, operands=s.operands),
        peft_config=smollm2_lora(), callbacks=[Evaluate()])
    trainer.remove_callback(PrinterCallback)  # the logs go to the results file
    trainer.train()
    logs = trainer.state.log_history
    # the reward of each generation batch: logged at the step that generated it (RPG logs it again on reuse steps)
    rewards = [row["reward"] for row in logs if "reward" in row and (row["step"] - 1) % s.reuse == 0]
    means = {}
    for key in _LOG_KEYS:
        values = [row[key] for row in logs if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
        if values:
            means[key] = round(statistics.fmean(values), 5)
    return {"method": method, "seed": seed, "accuracy": accuracy, "rewards": rewards,
            "total_s": round(time.perf_counter() - t0, 1), "log_means": means}


# ---------------------------------------------------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------------------------------------------------


def jobs(s: Settings) -> list[tuple[str, int]]:
    """(method, seed) of every run, seed-major with the methods interleaved, so a partial result holds whole seeds."""
    return [(m, seed) for seed in s.seeds for m in s.methods]


def _settings_dict(s: Settings) -> dict:
    settings = asdict(s)
    settings.pop("output_dir"), settings.pop("model_cache")
    settings.update(max_steps=s.max_steps, methods_config={m: METHODS[m] for m in s.methods}, rpg_common=RPG_COMMON)
    return settings


def settings_from_dict(d: dict) -> Settings:
    """The :class:`Settings` a results file was made with (``--resume``, ``--summarize``)."""
    known = {f.name for f in dataclasses.fields(Settings)} - {"output_dir", "model_cache"}
    return Settings(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known})


def run(s: Settings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    """Measure each seed's start, train every (method, seed) not already in ``previous``; write the partial result
    to ``json_path`` after every run (``complete`` false until the end); return runs and summary."""
    from trl_rpg.smollm2 import prepare_smollm2

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    info = machine_info()
    path = prepare_smollm2(s.model_cache, log=log)
    t0 = time.perf_counter()
    prev_wall = (previous or {}).get("wall_s") or 0.0
    loads = list((previous or {}).get("loadavg_samples") or []) + [loadavg()]
    finished = {(r["method"], r["seed"]): r for r in (previous or {}).get("runs", [])}
    todo = [j for j in jobs(s) if j not in finished]
    runs = list(finished.values())
    starts = {x["seed"]: x for x in (previous or {}).get("starts", [])}
    result = {"settings": _settings_dict(s), "machine": info, "complete": False, "loadavg_samples": loads,
              "starts": [], "runs": runs}
    if previous is not None:
        result["machine_earlier"] = previous.get("machine_earlier", []) + [previous.get("machine")]
    with WorkerPool(s.workers) as pool:
        missing = [seed for seed in s.seeds if seed not in starts]
        for r in pool.map(evaluate_start, [(s, path, seed) for seed in missing]):
            starts[r["seed"]] = r
        result["starts"] = [starts[seed] for seed in s.seeds]
        log(f"start ({time.perf_counter() - t0:.0f}s): " + ", ".join(
            f"seed {r['seed']} greedy {r['accuracy']['greedy']:.3f} sampled {r['accuracy']['sampled']:.3f}"
            for r in result["starts"]))
        log(f"{len(todo)} runs to do ({len(finished)} already done)")

        def done(i, r):
            r["accuracy"].insert(0, (0, starts[r["seed"]]["accuracy"]))  # step 0: the seed's shared start
            runs.append(r)
            loads.append(loadavg())
            result["wall_s"] = round(time.perf_counter() - t0 + prev_wall, 1)
            if json_path:
                write_json(json_path, result)
            last = r["accuracy"][-1][1]
            log(f"  [{len(runs)}/{len(todo) + len(finished)}] {r['method']} seed {r['seed']}: sampled "
                f"{last['sampled']:.3f}, greedy {last['greedy']:.3f} ({r['total_s']}s, "
                f"{time.perf_counter() - t0:.0f}s elapsed, load {loads[-1]})")

        pool.map(train_one, [(s, path, m, seed) for m, seed in todo], on_result=done)
    order = {j: i for i, j in enumerate(jobs(s))}
    runs.sort(key=lambda r: order.get((r["method"], r["seed"]), len(order)))
    result.update(complete=True, wall_s=round(time.perf_counter() - t0 + prev_wall, 1), loadavg_end=loadavg(),
                  summary=summarize(runs))
    return result


def _final(r: dict, kind: str) -> float:
    return r["accuracy"][-1][1][kind]


def summarize(runs: list[dict]) -> dict:
    """Per method: final held-out accuracy (sampled, greedy; mean and sd over seeds) and gain over the start; paired
    differences (same seed) to GRPO and DAPO with 95% t-intervals."""
    methods = list(dict.fromkeys(r["method"] for r in runs))
    out: dict = {"methods": {}, "paired": {}}
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        row = {"n_seeds": len(rs), "s_per_run": statistics.fmean(r["total_s"] for r in rs)}
        for kind in ("sampled", "greedy"):
            row[f"{kind}_start"] = mean_std([r["accuracy"][0][1][kind] for r in rs])[0]
            row[f"{kind}_mean"], row[f"{kind}_std"] = mean_std([_final(r, kind) for r in rs])
            row[f"{kind}_gain"] = mean_std([_final(r, kind) - r["accuracy"][0][1][kind] for r in rs])[0]
        row["reward_first"] = statistics.fmean(r["rewards"][0] for r in rs) if all(r["rewards"] for r in rs) else None
        row["reward_last"] = statistics.fmean(r["rewards"][-1] for r in rs) if all(r["rewards"] for r in rs) else None
        out["methods"][m] = row
    for base in ("GRPO", "DAPO"):
        by_seed = {r["seed"]: r for r in runs if r["method"] == base}
        for m in methods:
            pairs = [(r, by_seed[r["seed"]]) for r in runs if r["method"] == m and r["seed"] in by_seed]
            if m == base or not pairs:
                continue
            out["paired"][f"{m} - {base}"] = {
                kind: ci95([_final(a, kind) - _final(b, kind) for a, b in pairs]) for kind in ("sampled", "greedy")}
    return out


def markdown(result: dict) -> str:
    summary, s = result["summary"], result["settings"]
    header = ["method", "held-out sampled: start → last (mean ± sd)", "held-out greedy: start → last (mean ± sd)",
              "train reward first → last batch", "s/run"]
    rows = [[m, f"{fmt(r['sampled_start'])} → {fmt(r['sampled_mean'])} ± {fmt(r['sampled_std'])}",
             f"{fmt(r['greedy_start'])} → {fmt(r['greedy_mean'])} ± {fmt(r['greedy_std'])}",
             f"{fmt(r['reward_first'])} → {fmt(r['reward_last'])}", fmt(r["s_per_run"], 0)]
            for m, r in summary["methods"].items()]
    paired = [[name, f"{d['sampled']['mean']:+.3f} ± {fmt(d['sampled']['half_width'])}",
               f"{d['greedy']['mean']:+.3f} ± {fmt(d['greedy']['half_width'])}"]
              for name, d in summary["paired"].items()]
    text = (f"SmolLM2-135M-Instruct, LoRA, {s['max_steps']} optimizer steps = {s['generation_batches']} generation "
            f"batches x {s['reuse']} steps, {len(s['seeds'])} seeds; held-out: 30 problems, greedy and "
            f"{s['eval_samples']} samples at T=1 each.\n\n" + markdown_table(header, rows))
    if paired:
        text += ("\n\nPaired by seed, difference in final held-out accuracy, mean ± 95% t-interval half-width (an "
                 "interval containing 0: no detectable difference):\n\n"
                 + markdown_table(["comparison", "sampled", "greedy"], paired))
    return text


def plot(result: dict, path: str) -> str | None:
    """Three panels: held-out accuracy sampled at T = 1 and greedy (mean over seeds, band ± s.e.m., the step-0 point
    each seed's shared start), and the training reward of each generation batch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    runs, s = result["runs"], result["settings"]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))

    def band(ax, xs, cols, color=None, label=None):
        mean = [statistics.fmean(c) for c in cols]
        (line,) = ax.plot(xs, mean, label=label, linewidth=1.8, color=color, marker="o", markersize=3)
        if len(cols[0]) > 1:
            sem = [statistics.stdev(c) / math.sqrt(len(c)) for c in cols]
            ax.fill_between(xs, [m - e for m, e in zip(mean, sem)], [m + e for m, e in zip(mean, sem)],
                            color=line.get_color(), alpha=0.15)
        return line

    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        n = min(len(r["accuracy"]) for r in rs)
        steps = [st for st, _ in rs[0]["accuracy"][:n]]
        line = band(axes[0], steps, [[r["accuracy"][i][1]["sampled"] for r in rs] for i in range(n)], label=m)
        band(axes[1], steps, [[r["accuracy"][i][1]["greedy"] for r in rs] for i in range(n)], color=line.get_color(),
             label=m)
        nb = min(len(r["rewards"]) for r in rs)
        if nb:
            band(axes[2], [i * s["reuse"] for i in range(nb)], [[r["rewards"][i] for r in rs] for i in range(nb)],
                 color=line.get_color(), label=m)
    n_seeds = len({r["seed"] for r in runs})
    axes[0].set(xlabel="optimizer step", ylabel="held-out accuracy, sampled (T = 1)",
                title=f"Held-out, sampled at T = 1 (mean, band ± s.e.m., {n_seeds} seeds)")
    axes[1].set(xlabel="optimizer step", ylabel="held-out accuracy, greedy", title="Held-out, greedy")
    axes[2].set(xlabel="optimizer step at generation", ylabel="mean reward of the generation batch",
                title="Training reward (mean of each generation batch, T = 1)")
    axes[0].legend(fontsize=8, loc="lower right")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    fig.suptitle(f"SmolLM2-135M-Instruct, LoRA: {s['max_steps']} optimizer steps = {s['generation_batches']} "
                 f"generation batches x {s['reuse']}", fontsize=10)
    return save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--quick", action="store_true", help="1 seed, 2 methods, 4 steps (a smoke run)")
    p.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help="override the methods")
    p.add_argument("--generation-batches", type=int, help="override the budget (generation batches)")
    p.add_argument("--workers", type=int, help="parallel worker processes (default 2)")
    p.add_argument("--output", help="JSON path (default benchmarks/results/smollm2.json; --quick: "
                                     "outputs/benchmarks/smollm2_quick.json); the plot goes next to it")
    p.add_argument("--resume", metavar="JSON", help="continue a partial results file with its settings")
    p.add_argument("--summarize", metavar="JSON", help="recompute the summary, tables and plot of a results file")
    a = p.parse_args(argv)
    if a.summarize or a.resume:
        with open(a.summarize or a.resume) as f:
            previous = json.load(f)
        s = settings_from_dict(previous["settings"])
        json_path = a.summarize or a.resume
        if a.workers:
            s.workers = a.workers
        if a.summarize:
            previous["summary"] = summarize(previous["runs"])
            result = previous
        else:
            result = run(s, json_path=json_path, previous=previous)
    else:
        s = dataclasses.replace(QUICK if a.quick else FULL)
        for name in ("seeds", "methods"):
            if getattr(a, name):
                setattr(s, name, tuple(getattr(a, name)))
        if a.generation_batches:
            s.generation_batches = a.generation_batches
        if a.workers:
            s.workers = a.workers
        json_path = a.output or default_results_path("smollm2", a.quick)
        result = run(s, json_path=json_path)
    png = plot(result, os.path.splitext(json_path)[0] + ".png")
    result["plot"] = os.path.basename(png) if png else None
    write_json(json_path, result)
    m = result["machine"]
    print(f"\n## SmolLM2-135M-Instruct ({m['date_utc']}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})\ncommand: `{m['command']}`; {m.get('nproc')} cores, "
          f"wall {result.get('wall_s', 0):.0f}s, load at start {m.get('loadavg_start')}, at end "
          f"{result.get('loadavg_end')}\n\n{markdown(result)}\n\nJSON: {json_path}\nplot: {png}")
    return result


if __name__ == "__main__":
    main()
