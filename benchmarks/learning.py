"""Learning benchmark: RPG variants against GRPO and DAPO on the toy arithmetic task (the paper's Table 3 in
miniature).

    python -m benchmarks.learning            # full: 6 methods x 10 seeds x 100 steps (20-35 min on 2 CPU cores)
    python -m benchmarks.learning --quick    # 6 methods x 2 seeds x 16 steps (under 5 min)
    python -m benchmarks.learning --resume benchmarks/results/learning.json  # continue an interrupted run
    python -m benchmarks.learning_tuned [--find-regime] [--quick]   # every arm tuned alike (issue 43): its own
                                             # command (benchmarks/learning_tuned.py)

Every method starts, for a given seed, from the *same* briefly supervised tiny Qwen2 model
(``trl_rpg.toy.build_toy_model``, built once per seed and cached under ``benchmarks/.cache``), trains on the same
prompts with the same seed, learning rate, batch layout and budget, and reuses each generation batch for several
optimizer steps (``steps_per_generation = REUSE``) so that the later steps of each batch are off-policy. Held-out
accuracy (greedy decoding on problems never seen in training) is measured every ``eval_every`` optimizer steps.

Runs are spread over ``--workers`` processes with one torch thread each (on a small CPU, several threads per tiny
model oversubscribe the cores and run many times slower).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from ._common import (
    CACHE_DIR,
    WorkerPool,
    build_checkpoint,
    checkpoint_dir,  # noqa: F401  (part of this module's interface)
    ci95,
    default_results_path,
    fmt,
    freeze_toy,
    init_worker,
    loadavg,
    machine_info,
    markdown_table,
    mean_std,
    moved_flag,
    save_figure,
    toy_fingerprint,
    toy_module,
    toy_rl_kwargs,
    toy_rl_run,
    write_json,
)

# KL coefficient of the KL-regularised methods. The paper's 1e-4 does nothing measurable in a 100-step toy run; 0.04 is
# the DeepSeekMath / former TRL GRPO default, used for GRPO and, unchanged, for every RPG variant.
KL_BETA = 0.04
REUSE = 4  # optimizer steps per generation batch (batch reuse: steps 2..4 of each batch are off-policy)

METHODS: dict[str, dict] = {
    "RPG-REINFORCE-UFKL": {"trainer": "rpg", "rpg_divergence": "ufkl", "rpg_estimator": "reinforce"},
    "RPG-REINFORCE-URKL": {"trainer": "rpg", "rpg_divergence": "urkl", "rpg_estimator": "reinforce"},
    "RPG-UFKL": {"trainer": "rpg", "rpg_divergence": "ufkl", "rpg_estimator": "differentiable"},
    "RPG-URKL": {"trainer": "rpg", "rpg_divergence": "urkl", "rpg_estimator": "differentiable"},
    "GRPO": {"trainer": "grpo", "loss_type": "grpo", "beta": KL_BETA, "epsilon": 0.2, "scale_rewards": "group"},
    "DAPO": {"trainer": "grpo", "loss_type": "dapo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28,
             "scale_rewards": "group"},
}
# Ablations, not in the default set (run them with --methods): what separates RPG-REINFORCE-URKL from DAPO here.
ABLATIONS: dict[str, dict] = {
    "RPG-REINFORCE-URKL std-scaled": {"trainer": "rpg", "rpg_divergence": "urkl", "rpg_estimator": "reinforce",
                                      "scale_rewards": "group"},
    "RPG-REINFORCE-URKL beta=0": {"trainer": "rpg", "rpg_divergence": "urkl", "rpg_estimator": "reinforce",
                                  "beta": 0.0},
    # GRPO's k3 without TRL's importance weight (use_bias_correction_kl=False): the paper's contribution iii
    "GRPO k3 unweighted": {"trainer": "grpo", "loss_type": "grpo", "beta": KL_BETA, "epsilon": 0.2,
                           "scale_rewards": "group", "use_bias_correction_kl": False},
}
DEFAULT_METHODS = tuple(METHODS)
METHODS.update(ABLATIONS)
# RPG settings shared by all four RPG variants (the paper's defaults apart from beta): reference = sampling policy,
# RPG-Style Clip (0.2, 0.28, c=10), advantage = reward - group mean, token-mean aggregation.
RPG_COMMON = {"beta": KL_BETA, "epsilon": 0.2, "epsilon_high": 0.28, "rpg_dual_clip_c": 10.0,
              "rpg_reference": "sampling", "scale_rewards": "none", "loss_type": "dapo"}


@dataclass
class Settings:
    seeds: tuple = tuple(range(10))
    methods: tuple = DEFAULT_METHODS
    generation_batches: int = 25  # budget: optimizer steps = generation_batches * REUSE
    reuse: int = REUSE
    # Fixed here (None would take trl_rpg.toy.task.RECOMMENDED_RL_ARGS's value). lr 3e-4: with batch reuse, 1e-3 made
    # the tiny model's held-out accuracy collapse in trial runs, for every method.
    per_device_train_batch_size: int | None = 64  # completions per optimizer step
    num_generations: int | None = 8  # completions per prompt (group size)
    learning_rate: float | None = 3e-4
    temperature: float | None = 1.0
    max_completion_length: int | None = None  # None: trl_rpg.toy.task.MAX_COMPLETION_LENGTH
    num_train_problems: int = 2000
    eval_problems: int = 256
    eval_every: int = 4  # optimizer steps between held-out evaluations (step 0 is always evaluated)
    # None: half-way from the SFT accuracy (mean over seeds) to the best method's mean final accuracy
    target_accuracy: float | None = None
    sft_steps: int | None = None  # None: trl_rpg.toy.task defaults
    workers: int = 2
    toy_path: str | None = None  # set by run(): a frozen copy of the toy task (trl_rpg/toy) every worker imports
    cache_dir: str = os.path.join(CACHE_DIR, "toy")
    output_dir: str = os.path.join(CACHE_DIR, "runs")

    @property
    def max_steps(self) -> int:
        return self.generation_batches * self.reuse


FULL = Settings()
QUICK = Settings(seeds=(0, 1), generation_batches=4, eval_problems=128)


# ---------------------------------------------------------------------------------------------------------------------
# Worker side (the toy-task machinery is shared with benchmarks/offpolicy.py: see _common.py)
# ---------------------------------------------------------------------------------------------------------------------

# Names kept for callers of this module.
_init_worker = init_worker
_toy = toy_module


def effective_rl_args(s: Settings) -> dict:
    """The batch / optimizer settings every method shares (``RECOMMENDED_RL_ARGS`` plus the overrides)."""
    toy = toy_module(s)

    args = {k: v for k, v in toy.RECOMMENDED_RL_ARGS.items() if k in (
        "per_device_train_batch_size", "num_generations", "learning_rate", "temperature", "max_completion_length",
        "gradient_checkpointing")}
    args.setdefault("max_completion_length", toy.MAX_COMPLETION_LENGTH)
    for name in list(args) + ["temperature"]:
        if getattr(s, name, None) is not None:
            args[name] = getattr(s, name)
    args.update(steps_per_generation=s.reuse, gradient_accumulation_steps=1, max_steps=s.max_steps,
                generation_batch_size=args["per_device_train_batch_size"] * s.reuse)
    return args


def _config(s: Settings, method: str, seed: int, out: str, overrides: dict | None = None):
    """(trainer kind, config) of one run; `overrides` (e.g. a tuned learning rate and beta) win over the method's."""
    from trl import GRPOConfig

    from trl_rpg import RPGConfig

    spec = dict(METHODS[method])
    trainer = spec.pop("trainer")
    if trainer == "rpg":
        return trainer, RPGConfig(**toy_rl_kwargs(s, seed, out, s.reuse, s.max_steps,
                                                  {**RPG_COMMON, **spec, **(overrides or {})}))
    return trainer, GRPOConfig(**toy_rl_kwargs(s, seed, out, s.reuse, s.max_steps, {**spec, **(overrides or {})}))


# What each run keeps of the trainers' logs (RPG: rpg/*; GRPO: the k3 KL; TRL: clip_ratio/*); "/" = prefix.
_LOGGED = ("rpg/", "loss", "kl", "entropy", "grad_norm", "clip_ratio/region_mean", "clip_ratio/high_mean",
           "clip_ratio/low_mean")


def train_one(s: Settings, method: str, seed: int, overrides: dict | None = None) -> dict:
    """Train ``method`` from the seed's SFT checkpoint; return accuracy and reward curves."""
    init_worker()
    from trl import GRPOTrainer

    from trl_rpg import RPGTrainer

    tag = "".join(f"-{k}{v:g}" for k, v in sorted((overrides or {}).items())) + (
        f"-reuse{s.reuse}" if overrides else "")
    kind, config = _config(s, method, seed, os.path.join(s.output_dir, f"{method}-seed{seed}{tag}"), overrides)
    r = toy_rl_run(s, seed, RPGTrainer if kind == "rpg" else GRPOTrainer, config, s.eval_every, log_keys=_LOGGED)
    return {"method": method, "seed": seed, "accuracy": r["accuracy"], "rewards": r["rewards"],
            "train_s": r["train_s"], "total_s": r["total_s"], "samples": r["samples"], "steps": r["steps"],
            "prompt_digest": r["prompt_digest"], "log_means": _thin_logs(r["logs"])}


_LOG_KEYS = ("loss", "kl", "entropy", "rpg/w_mean", "rpg/w_max", "rpg/clip_frac_high", "rpg/clip_frac_low",
             "rpg/clip_frac_dual", "clip_ratio/region_mean")


def _thin_logs(logs: list[dict]) -> dict:
    """Keep the results file small: the run's mean of a few logged metrics (kl, entropy, w, clip fractions)."""
    out = {}
    for k in _LOG_KEYS:
        vals = [row[k] for row in logs if isinstance(row.get(k), (int, float)) and math.isfinite(row[k])]
        if vals:
            out[k] = round(statistics.fmean(vals), 5)
    return out

# ---------------------------------------------------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------------------------------------------------


def run(s: Settings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    """Build the checkpoints, run every (method, seed) not already in ``previous``, return the raw results and the
    summary; with ``json_path``, the partial result is written there after every run (``complete`` false until the
    end), so an interrupted run loses only the runs in flight (``--resume``)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    info = machine_info()
    freeze_toy(s)
    t0 = time.perf_counter()
    prev_wall = (previous or {}).get("wall_s") or 0.0
    loads = list((previous or {}).get("loadavg_samples") or []) + [loadavg()]
    runs = list((previous or {}).get("runs", []))
    finished = {(r["method"], r["seed"]) for r in runs}
    result = {"settings": _settings_dict(s), "machine": info, "complete": False, "loadavg_samples": loads,
              "runs": runs}
    if previous is not None:
        result["machine_earlier"] = previous.get("machine_earlier", []) + [previous.get("machine")]
    with WorkerPool(s.workers) as pool:
        sft = pool.map(build_checkpoint, [(s, seed) for seed in s.seeds])
        result["sft"] = sft
        log(f"SFT checkpoints ready ({time.perf_counter() - t0:.0f}s): "
            + ", ".join(f"seed {r['seed']} acc {r['sft_accuracy']:.3f}" for r in sft))
        loads.append(loadavg())

        def done(i, r):
            runs.append(r)
            loads.append(loadavg())
            result["wall_s"] = round(time.perf_counter() - t0 + prev_wall, 1)
            if json_path:
                write_json(json_path, result)
            log(f"  {r['method']} seed {r['seed']}: held-out acc {r['accuracy'][0][1]:.3f} -> "
                f"{r['accuracy'][-1][1]:.3f} ({r['train_s']}s, {time.perf_counter() - t0:.0f}s elapsed)")

        jobs = [(s, m, seed) for seed in s.seeds for m in s.methods  # methods interleaved within each seed
                if (m, seed) not in finished]
        pool.map(train_one, jobs, on_result=done)
    order = {(m, seed): i for i, (m, seed) in enumerate((m, seed) for seed in s.seeds for m in s.methods)}
    runs.sort(key=lambda r: order.get((r["method"], r["seed"]), len(order)))
    result.update(complete=True, wall_s=round(time.perf_counter() - t0 + prev_wall, 1),
                  summary=summarize(s, sft, runs))
    return result


def _settings_dict(s: Settings) -> dict:
    d = asdict(s)
    d.pop("cache_dir"), d.pop("output_dir")
    d["max_steps"] = s.max_steps
    d["kl_beta"] = KL_BETA
    d["rl_args"] = effective_rl_args(s)
    d["toy_fingerprint"] = toy_fingerprint(s.toy_path)
    d.pop("toy_path")
    d["methods_config"] = {m: METHODS[m] for m in s.methods}
    d["rpg_common"] = RPG_COMMON
    return d


def settings_from_dict(d: dict) -> Settings:
    """The :class:`Settings` a results file was made with (``--resume``, ``--summarize``)."""
    known = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()
                       if k in known and k not in ("cache_dir", "output_dir", "toy_path")})


def summarize(s: Settings, sft: list[dict], runs: list[dict]) -> dict:
    sft_acc = statistics.fmean(r["sft_accuracy"] for r in sft)
    if s.target_accuracy is not None:
        target = s.target_accuracy
    else:  # half-way from the SFT start to the best method's mean final accuracy ("half of the best gain")
        finals = [statistics.fmean(r["accuracy"][-1][1] for r in runs if r["method"] == m) for m in s.methods
                  if any(r["method"] == m for r in runs)]
        best_final = max(finals) if finals else sft_acc
        target = round(sft_acc + 0.5 * max(best_final - sft_acc, 0.02), 3)
    out = {"target_accuracy": target, "sft_accuracy": sft_acc, "methods": {}}
    for m in s.methods:
        rs = [r for r in runs if r["method"] == m]
        if not rs:
            continue
        last = [r["accuracy"][-1][1] for r in rs]
        best = [max(a for _, a in r["accuracy"]) for r in rs]
        reach = []
        for r in rs:
            hit = next((step for step, a in r["accuracy"] if a >= target), None)
            reach.append(hit)
        hits = [h for h in reach if h is not None]
        # stability: across-seed std of the per-generation-batch mean reward, averaged over batches
        n = min(len(r["rewards"]) for r in rs)
        if len(rs) > 1 and n > 0:
            spread = statistics.fmean(statistics.stdev(r["rewards"][i] for r in rs) for i in range(n))
        else:
            spread = float("nan")
        # within-run roughness: mean |change| of the batch reward between consecutive batches
        rough = statistics.fmean(
            statistics.fmean(abs(b - a) for a, b in zip(r["rewards"][:-1], r["rewards"][1:]))
            for r in rs if len(r["rewards"]) > 1) if n > 1 else float("nan")
        last_mean, last_sd = mean_std(last)
        best_mean, best_sd = mean_std(best)
        gain_mean, gain_sd = mean_std([r["accuracy"][-1][1] - r["accuracy"][0][1] for r in rs])
        out["methods"][m] = {
            "gain_mean": gain_mean, "gain_std": gain_sd,
            "n_seeds": len(rs), "last_mean": last_mean, "last_std": last_sd, "last_min": min(last),
            "last_max": max(last),
            "best_mean": best_mean, "best_std": best_sd, "steps_to_target": reach,
            "steps_to_target_mean": (statistics.fmean(hits) if hits else None), "reached": f"{len(hits)}/{len(rs)}",
            # median over all seeds, a seed that never reaches the target counting as +infinity
            "steps_to_target_median": statistics.median([h if h is not None else math.inf for h in reach]),
            "reward_first": statistics.fmean(r["rewards"][0] for r in rs) if n else None,
            "reward_last": statistics.fmean(r["rewards"][n - 1] for r in rs) if n else None,
            "reward_seed_spread": spread, "reward_roughness": rough,
            "train_s_mean": statistics.fmean(r["train_s"] for r in rs),
        }
    # Paired differences: same seed = same SFT start, same prompts; the seed-to-seed variation of the start cancels.
    out["paired"] = {}
    for base in ("GRPO", "DAPO"):
        if base not in s.methods:
            continue
        by_seed = {r["seed"]: r for r in runs if r["method"] == base}
        for m in s.methods:
            if m == base:
                continue
            pairs = [(r, by_seed[r["seed"]]) for r in runs if r["method"] == m and r["seed"] in by_seed]
            if not pairs:
                continue
            d_last = [a["accuracy"][-1][1] - b["accuracy"][-1][1] for a, b in pairs]
            d_best = [max(x for _, x in a["accuracy"]) - max(x for _, x in b["accuracy"]) for a, b in pairs]
            out["paired"][f"{m} - {base}"] = {
                "n": len(pairs), "last": _ci(d_last), "best": _ci(d_best),
                "wins": sum(d > 0 for d in d_last), "ties": sum(d == 0 for d in d_last),
                "losses": sum(d < 0 for d in d_last),
            }
    return out


def _ci(xs: list[float]) -> dict:
    """Mean and 95% t-interval half-width of paired differences."""
    return ci95(xs)


def markdown(result: dict) -> str:
    summ = result["summary"]
    s = result["settings"]
    header = ["method", f"held-out acc, last (mean ± sd, n={len(s['seeds'])})", "last min–max",
              "gain over SFT start (mean ± sd)", "best (mean ± sd)",
              f"steps to {summ['target_accuracy']:.2f} (median; seeds reaching)",
              "train reward first → last batch", "reward seed-spread ↓", "reward roughness ↓", "s/run"]
    rows = []
    for m, r in summ["methods"].items():
        rows.append([
            m, f"{fmt(r['last_mean'])} ± {fmt(r['last_std'])}", f"{fmt(r['last_min'])}–{fmt(r['last_max'])}",
            f"{fmt(r['gain_mean'], 3)} ± {fmt(r['gain_std'])}", f"{fmt(r['best_mean'])} ± {fmt(r['best_std'])}",
            f"{_steps(r['steps_to_target_median'], s['max_steps'])} ({r['reached']})",
            f"{fmt(r['reward_first'])} → {fmt(r['reward_last'])}", fmt(r["reward_seed_spread"]),
            fmt(r["reward_roughness"]), fmt(r["train_s_mean"], 0),
        ])
    prow = []
    for name, r in summ.get("paired", {}).items():
        prow.append([name, f"{r['last']['mean']:+.3f} ± {fmt(r['last']['half_width'])}",
                     f"{r['best']['mean']:+.3f} ± {fmt(r['best']['half_width'])}",
                     f"{r['wins']} / {r['ties']} / {r['losses']}"])
    paired = ""
    if prow:
        paired = ("\n\nPaired by seed (same start, same prompts), difference in held-out accuracy, mean ± 95% "
                  "t-interval half-width; an interval that contains 0 means no detectable difference:\n\n"
                  + markdown_table(["comparison", "last", "best", "seeds better / equal / worse"], prow))
    return (f"SFT start: held-out accuracy {summ['sft_accuracy']:.3f} (mean over seeds); "
            f"{s['max_steps']} optimizer steps = {s['generation_batches']} generation batches x {s['reuse']} "
            f"steps each.\n\n" + markdown_table(header, rows) + paired)


def _steps(x, max_steps) -> str:
    if x is None or x == math.inf:
        return f"> {max_steps}"
    return f"{x:g}"


def plot(result: dict, path: str) -> str | None:
    """Three panels: held-out accuracy (mean, band = ± standard error over seeds), the paired difference to a
    baseline method (same seed, same start), and the training reward of each generation batch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    runs = result["runs"]
    methods = list(result["summary"]["methods"])
    base = "DAPO" if "DAPO" in methods else methods[-1]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))

    def band(ax, xs, cols, color=None, label=None):
        mean = [statistics.fmean(c) for c in cols]
        (line,) = ax.plot(xs, mean, label=label, linewidth=1.8, color=color)
        if len(cols[0]) > 1:
            sem = [statistics.stdev(c) / math.sqrt(len(c)) for c in cols]
            ax.fill_between(xs, [m - e for m, e in zip(mean, sem)], [m + e for m, e in zip(mean, sem)],
                            color=line.get_color(), alpha=0.15)
        return line

    base_runs = {r["seed"]: r for r in runs if r["method"] == base}
    for m in methods:
        rs = sorted((r for r in runs if r["method"] == m), key=lambda r: r["seed"])
        n = min(len(r["accuracy"]) for r in rs)
        steps = [st for st, _ in rs[0]["accuracy"][:n]]
        line = band(axes[0], steps, [[r["accuracy"][i][1] for r in rs] for i in range(n)], label=m)
        if m != base and base_runs:
            paired = [r for r in rs if r["seed"] in base_runs]
            band(axes[1], steps, [[r["accuracy"][i][1] - base_runs[r["seed"]]["accuracy"][i][1] for r in paired]
                                  for i in range(n)], color=line.get_color(), label=m)
        nb = min(len(r["rewards"]) for r in rs)
        rsteps = [i * result["settings"]["reuse"] for i in range(nb)]
        band(axes[2], rsteps, [[r["rewards"][i] for r in rs] for i in range(nb)], color=line.get_color(), label=m)
    n_seeds = len(result["settings"]["seeds"])
    axes[0].axhline(result["summary"]["target_accuracy"], color="grey", linestyle=":", linewidth=1)
    axes[0].set(xlabel="optimizer step", ylabel="held-out accuracy (greedy)",
                title=f"Held-out accuracy (mean, band ± s.e.m., {n_seeds} seeds)")
    axes[1].axhline(0.0, color=axes[0].get_lines()[methods.index(base)].get_color(), linewidth=1.5)
    axes[1].set(xlabel="optimizer step", ylabel=f"accuracy − {base} (same seed)",
                title=f"Paired difference to {base} (mean, band ± s.e.m.)")
    axes[2].set(xlabel="optimizer step at generation", ylabel="mean reward of the generation batch",
                title="Training reward (sampled, T=1; mean, band ± s.e.m.)")
    axes[0].legend(fontsize=8, loc="lower right")
    for ax in axes:
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    if "--tuned" in argv:  # the tuned comparison (issue 43) is its own command: this module does not import it
        p.error(moved_flag("--tuned", "benchmarks.learning_tuned"))
    p.add_argument("--quick", action="store_true", help="2 seeds, 4 generation batches (< 5 min)")
    p.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help="override the methods")
    p.add_argument("--generation-batches", type=int, help="override the budget (generation batches)")
    p.add_argument("--workers", type=int, help="parallel worker processes (default 2)")
    p.add_argument("--output", help="JSON path (default benchmarks/results/learning.json; --quick: "
                                     "outputs/benchmarks/learning_quick.json)")
    p.add_argument("--resume", metavar="JSON", help="continue a partial results file with its settings (the file is "
                   "rewritten after every run)")
    p.add_argument("--summarize", metavar="JSON", help="recompute the summary, tables and plot of a results file")
    a = p.parse_args(argv)
    if a.summarize:
        import json

        with open(a.summarize) as f:
            result = json.load(f)
        s = settings_from_dict(result["settings"])
        for r in result["runs"]:  # older files kept every logged step
            if "logs" in r:
                r["log_means"] = _thin_logs(r.pop("logs"))
        result["summary"] = summarize(s, result["sft"], result["runs"])
        png = plot(result, os.path.splitext(a.summarize)[0] + ".png")
        write_json(a.summarize, result)
        print(markdown(result))
        print(f"\nJSON: {a.summarize}\nplot: {png}")
        return result
    previous = None
    if a.resume:
        import json

        with open(a.resume) as f:
            previous = json.load(f)
        s = settings_from_dict(previous["settings"])
        made_with, here = previous["settings"].get("toy_fingerprint"), toy_fingerprint(s.toy_path)
        if made_with != here:
            p.error(f"--resume: {a.resume} was made with toy task version {made_with}, this checkout's is {here}: "
                    "its runs and new ones would not compare")
    else:
        s = dataclasses.replace(QUICK if a.quick else FULL)
    if a.seeds:
        s.seeds = tuple(a.seeds)
    if a.methods:
        s.methods = tuple(a.methods)
    if a.generation_batches:
        s.generation_batches = a.generation_batches
    if a.workers:
        s.workers = a.workers
    json_path = a.resume or a.output or default_results_path("learning", a.quick)
    result = run(s, json_path=json_path, previous=previous)
    png = plot(result, os.path.splitext(json_path)[0] + ".png")
    result["plot"] = os.path.relpath(png, os.path.dirname(json_path)) if png else None
    result["loadavg_end"] = loadavg()
    write_json(json_path, result)
    m = result["machine"]
    print()
    print(f"## Learning benchmark ({m['date_utc']}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})")
    print(f"command: `{m['command']}`; {m.get('nproc')} cores ({m.get('cpu', '?')}), wall {result['wall_s']:.0f}s, "
          f"load average at start {m.get('loadavg_start')}, at end {result['loadavg_end']}")
    print()
    print(markdown(result))
    print(f"\nJSON: {json_path}\nplot: {png}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
