"""Asynchronous rollouts: AsyncRPG against AsyncGRPO as every sample gets older.

    python -m benchmarks.asynchronous --workers 2   # beta sweep, then 4 methods x staleness {0,2,4,8} x 8 seeds
    python -m benchmarks.asynchronous --quick       # 2 seeds, 24 steps, staleness {0, 4}, beta 0.3, no sweep
    python -m benchmarks.asynchronous_tuned [--find-regime] [--quick]   # every arm tuned alike (issue 43): its
                                                    # own command (benchmarks/asynchronous_tuned.py)

TRL's asynchronous trainer (`trl.experimental.async_grpo.AsyncGRPOTrainer`) trains on samples that a vLLM server drew
one to several policy versions earlier, with a PPO clip on pi_theta/mu and no KL term. `AsyncRPGTrainer` replaces the
loss by RPG's, regularised towards the version that sampled each sample (w = pi_theta/mu exact at any staleness).
This benchmark trains the toy task (``trl_rpg.toy.task``) with both, on CPU, with the stale rollout worker of
``trl_rpg.toy.async_rollouts``: **every sample is exactly s versions old** as TRL measures it (`sample/staleness_*`;
the worker samples with the version s before the current one when the trainer asks for it; before s versions exist,
with the initial weights), for s in {0, 2, 4, 8}, and the trainer's ``max_staleness`` is s (nothing is dropped).
TRL's dataloader fetches one micro-batch ahead, so the policy that trains on a sample is at most one more version
newer: w is still exact (mu is the version that sampled). Each method and staleness starts, per seed, from the same
cached SFT checkpoint (``benchmarks/_common.py``) and sees the same prompts in the same order.

Methods: ``AsyncGRPO`` (TRL's loss as it is: PPO clip with epsilon 0.2, no KL); ``AsyncRPG-URKL`` and
``AsyncRPG-UFKL`` (RPG-REINFORCE with RPG-Style Clip (0.2, 0.28, c = 10), the paper's settings, and a beta each, the
best of a short sweep at the largest staleness on seeds outside the main runs); ``AsyncRPG beta=0`` (RPG's clip
without its KL term, to tell the two apart). The advantages are TRL's worker's,
(reward - group mean) / group std, for all. Reported: held-out accuracy at the last step and the best over the run
(mean and 95% t-interval over seeds), how often a run collapses (held-out accuracy more than 0.10 below its best and
staying there), paired differences to AsyncGRPO, and the drift TRL logs (its `kl`: the k3 estimate of
KL(mu || pi_theta) per token, and its clip fractions). Results are written after every run; ``--resume FILE``
continues a partial file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
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
    ci95,
    default_results_path,
    fmt,
    freeze_toy,
    init_worker,
    loadavg,
    machine_info,
    markdown_table,
    moved_flag,
    save_figure,
    toy_fingerprint,
    toy_module,
    toy_rl_run,
    write_json,
)
from .offpolicy import collapse_index

#: RPG's settings (beta aside): the paper's RPG-REINFORCE with RPG-Style Clip.
RPG_PAPER = {"rpg_estimator": "reinforce", "epsilon": 0.2, "epsilon_high": 0.28, "rpg_dual_clip_c": 10.0}
METHODS: dict[str, dict] = {
    "AsyncGRPO": {"trainer": "grpo"},  # TRL's async trainer as it is: PPO clip (epsilon 0.2), no KL
    "AsyncRPG-URKL": {"trainer": "rpg", **RPG_PAPER, "rpg_divergence": "urkl"},
    "AsyncRPG-UFKL": {"trainer": "rpg", **RPG_PAPER, "rpg_divergence": "ufkl"},
    # RPG's clip without its KL term: tells the KL term's effect from the clip's
    "AsyncRPG beta=0": {"trainer": "rpg", **RPG_PAPER, "rpg_divergence": "urkl", "beta": 0.0},
    # AsyncGRPO plus GRPO's k3 towards the sampler, unweighted / IS-weighted (benchmarks/k3_arms.py; the tuned
    # comparison's arms: `python -m benchmarks.asynchronous_tuned`)
    "AsyncGRPO+k3": {"trainer": "k3", "use_bias_correction_kl": False},
    "AsyncGRPO+k3 IS": {"trainer": "k3", "use_bias_correction_kl": True},
}
DEFAULT_METHODS = ("AsyncGRPO", "AsyncRPG-URKL", "AsyncRPG-UFKL", "AsyncRPG beta=0")
_LOGGED = ("kl", "ratio", "entropy", "grad_norm", "clip_ratio/", "rpg/", "k3/", "sample/staleness_mean",
           "sample/dropped_stale_total")


@dataclass
class Settings:
    seeds: tuple = tuple(range(8))
    methods: tuple = DEFAULT_METHODS
    staleness: tuple = (0, 2, 4, 8)
    max_steps: int = 96
    per_device_train_batch_size: int = 64  # completions per optimizer step (8 prompts x 8)
    num_generations: int = 8
    learning_rate: float = 3e-4  # constant (the async trainer's default schedule)
    temperature: float = 1.0
    max_completion_length: int | None = None  # None: trl_rpg.toy.task.MAX_COMPLETION_LENGTH
    num_train_problems: int = 2000
    eval_problems: int = 256
    eval_every: int = 8
    collapse_drop: float = 0.10
    sweep_betas: tuple = (0.1, 0.3, 1.0)
    sweep_seeds: tuple = (8, 9)  # outside the main runs' seeds: the betas are not chosen on the seeds they report
    sweep_staleness: int = 8
    betas: dict | None = None  # {"urkl": b, "ufkl": b}: skips the sweep
    sft_steps: int | None = None
    workers: int = 2
    toy_path: str | None = None
    cache_dir: str = os.path.join(CACHE_DIR, "toy")
    output_dir: str = os.path.join(CACHE_DIR, "runs-async")


FULL = Settings()
QUICK = Settings(seeds=(0, 1), staleness=(0, 4), max_steps=24, eval_problems=128, betas={"urkl": 0.3, "ufkl": 0.3})


# ---------------------------------------------------------------------------------------------------------------------
# One run (in a worker process)
# ---------------------------------------------------------------------------------------------------------------------


def run_config(s: Settings, method: str, staleness: int, seed: int, beta: float | None,
               learning_rate: float | None = None):
    """(trainer kind, config) of one run (`learning_rate`: the settings' when None)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from trl_rpg import AsyncRPGConfig

    from .k3_arms import AsyncGRPOWithK3Config

    spec = dict(METHODS[method])
    kind = spec.pop("trainer")
    if kind in ("rpg", "k3") and "beta" not in spec:
        spec["beta"] = beta
    lr = s.learning_rate if learning_rate is None else learning_rate
    out = os.path.join(s.output_dir, f"{method}-s{staleness}-seed{seed}-lr{lr:g}-b{beta}".replace(" ", "_")
                       .replace("=", "").replace("+", "plus"))
    args = dict(output_dir=out, seed=seed, data_seed=seed, max_steps=s.max_steps, learning_rate=lr,
                per_device_train_batch_size=s.per_device_train_batch_size, num_generations=s.num_generations,
                max_completion_length=s.max_completion_length or toy_module(s).MAX_COMPLETION_LENGTH,
                temperature=s.temperature, gradient_accumulation_steps=1, max_staleness=staleness, token_budget=0,
                use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
                dataloader_num_workers=0, log_level="error", gradient_checkpointing=False, **spec)
    return kind, {"rpg": AsyncRPGConfig, "k3": AsyncGRPOWithK3Config, "grpo": AsyncGRPOConfig}[kind](**args)


def _factory(kind: str, staleness: int, seed: int, groups_per_call: int):
    """A trainer factory for `toy_rl_run`: the trainer with a `StaleRolloutWorker` as worker and weight transfer."""
    def make(model, reward_funcs, args, train_dataset, processing_class, callbacks):
        from trl.experimental.async_grpo import AsyncGRPOTrainer

        from trl_rpg import AsyncRPGTrainer
        from trl_rpg.toy.async_rollouts import StaleRolloutWorker

        from .k3_arms import AsyncGRPOWithK3Trainer

        worker = StaleRolloutWorker(model, train_dataset, reward_funcs, processing_class,
                                    num_generations=args.num_generations,
                                    max_completion_length=args.max_completion_length, temperature=args.temperature,
                                    staleness=staleness, seed=seed, groups_per_call=groups_per_call)
        cls = {"rpg": AsyncRPGTrainer, "k3": AsyncGRPOWithK3Trainer, "grpo": AsyncGRPOTrainer}[kind]
        return cls(model, reward_funcs, args, train_dataset, processing_class, callbacks=callbacks,
                   rollout_worker=worker, weight_transfer=worker)
    return make


@contextlib.contextmanager
def standard_attention(model):
    """The trained model generates (held-out evaluation) with SDPA, then packs again with TRL's tree attention."""
    from trl.experimental.async_grpo.packing import TREE_ATTENTION

    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(TREE_ATTENTION)


def train_one(s: Settings, method: str, staleness: int, seed: int, beta: float | None, phase: str,
              learning_rate: float | None = None) -> dict:
    """Train `method` at `staleness` from the seed's SFT checkpoint; return the accuracy curve and the logged drift."""
    init_worker()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl_rpg._compat import async_trainer_on_cpu
    from trl_rpg.toy.async_rollouts import VarlenAttention

    kind, config = run_config(s, method, staleness, seed, beta, learning_rate)
    factory = _factory(kind, staleness, seed, s.per_device_train_batch_size // s.num_generations)
    with async_trainer_on_cpu(VarlenAttention):
        r = toy_rl_run(s, seed, factory, config, s.eval_every, log_keys=_LOGGED,
                       evaluation_context=standard_attention)
    means = {}
    for key in ("kl", "ratio", "clip_ratio/region_mean", "rpg/divergence", "rpg/w_max", "rpg/clip_frac_dual",
                "sample/staleness_mean", "entropy", "k3/term"):
        values = [row[key] for row in r["logs"] if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
        if values:
            means[key] = round(max(values) if key == "rpg/w_max" else statistics.fmean(values), 6)
    dropped = sum(row.get("sample/dropped_stale_total", 0) for row in r["logs"])
    return {"phase": phase, "method": method, "staleness": staleness, "seed": seed, "job_beta": beta,
            "beta": getattr(config, "beta", None), "learning_rate": config.learning_rate, "accuracy": r["accuracy"],
            "steps": r["steps"],
            "samples": r["samples"], "prompt_digest": r["prompt_digest"], "start": r["start"], "dropped": dropped,
            "train_s": r["train_s"], "eval_s": r["eval_s"], "log_means": means}


# ---------------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------------


def sweep_jobs(s: Settings) -> list[tuple]:
    if s.betas is not None:
        return []
    return [(m, s.sweep_staleness, seed, beta, "sweep") for seed in s.sweep_seeds for beta in s.sweep_betas
            for m in s.methods if METHODS[m]["trainer"] == "rpg" and "beta" not in METHODS[m]]


def choose_betas(s: Settings, runs: list[dict]) -> dict:
    """Per divergence, the sweep's beta with the highest mean final accuracy (ties: the smaller beta)."""
    if s.betas is not None:
        return dict(s.betas)
    chosen = {}
    for m in s.methods:
        spec = METHODS[m]
        if spec["trainer"] != "rpg" or "beta" in spec:
            continue
        scores = {}
        for beta in s.sweep_betas:
            finals = [r["accuracy"][-1][1] for r in runs if r["phase"] == "sweep" and r["method"] == m and
                      r["beta"] == beta]
            if finals:
                scores[beta] = statistics.fmean(finals)
        chosen[spec["rpg_divergence"]] = max(sorted(scores), key=lambda b: scores[b]) if scores else None
    return chosen


def main_jobs(s: Settings, betas: dict) -> list[tuple]:
    def beta(m):  # the sweep's beta, for the RPG methods that have none of their own
        spec = METHODS[m]
        return betas.get(spec["rpg_divergence"]) if spec["trainer"] == "rpg" and "beta" not in spec else None

    return [(m, st, seed, beta(m), "main") for seed in s.seeds for st in s.staleness for m in s.methods]


def run(s: Settings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    info = machine_info()
    freeze_toy(s)
    t0 = time.perf_counter()
    runs = list((previous or {}).get("runs", []))
    done = {(r["phase"], r["method"], r["staleness"], r["seed"], r["job_beta"]) for r in runs}
    result = {"settings": settings_dict(s), "machine": info, "complete": False, "runs": runs}

    def save(i=None, r=None):
        if r is not None:
            runs.append(r)
            log(f"  [{r['phase']} {len(runs)}] {r['method']} (beta {r['beta']}) | staleness {r['staleness']} | seed "
                f"{r['seed']}: acc {r['accuracy'][0][1]:.3f} -> {r['accuracy'][-1][1]:.3f} (best "
                f"{max(a for _, a in r['accuracy']):.3f}), kl {r['log_means'].get('kl', float('nan')):.4f}, "
                f"{r['train_s']}s, {time.perf_counter() - t0:.0f}s elapsed, load {loadavg()}")
        result["wall_s"] = round(time.perf_counter() - t0 + (previous or {}).get("wall_s", 0.0), 1)
        if json_path:
            write_json(json_path, result)

    def todo(jobs):
        return [(s, *j) for j in jobs if (j[4], j[0], j[1], j[2], j[3]) not in done]

    with WorkerPool(s.workers) as pool:
        seeds = sorted(set(s.seeds) | (set(s.sweep_seeds) if s.betas is None else set()))
        result["sft"] = pool.map(build_checkpoint, [(s, seed) for seed in seeds])
        log(f"SFT checkpoints ready ({time.perf_counter() - t0:.0f}s): "
            + ", ".join(f"seed {r['seed']} acc {r['sft_accuracy']:.3f}" for r in result["sft"]))
        pool.map(train_one, todo(sweep_jobs(s)), on_result=save)
        result["betas"] = choose_betas(s, runs)
        log(f"betas: {result['betas']}")
        pool.map(train_one, todo(main_jobs(s, result["betas"])), on_result=save)
    result.update(complete=True, summary=summarize(s, result), loadavg_end=loadavg())
    save()
    return result


def settings_dict(s: Settings) -> dict:
    d = asdict(s)
    for key in ("cache_dir", "output_dir", "toy_path"):
        d.pop(key)
    d["toy_fingerprint"] = toy_fingerprint(s.toy_path)
    d["methods_config"] = {m: METHODS[m] for m in s.methods}
    return d


def settings_from_dict(d: dict) -> Settings:
    known = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known})


# ---------------------------------------------------------------------------------------------------------------------
# Summary, tables, plot
# ---------------------------------------------------------------------------------------------------------------------


def _main_runs(result: dict, method: str, staleness: int) -> list[dict]:
    return [r for r in result["runs"]
            if r["phase"] == "main" and r["method"] == method and r["staleness"] == staleness]


def summarize(s: Settings, result: dict) -> dict:
    """Per (staleness, method): last and best accuracy (mean, 95% half-width), collapses, drift; paired differences
    to AsyncGRPO; the sweep's table; invariants (same start, prompts, steps and samples per seed and staleness)."""
    out = {"betas": result.get("betas"), "table": {}, "paired": {}, "sweep": {}}
    for st in s.staleness:
        for m in s.methods:
            rs = _main_runs(result, m, st)
            if not rs:
                continue
            last = [r["accuracy"][-1][1] for r in rs]
            best = [max(a for _, a in r["accuracy"]) for r in rs]
            drift = {k: statistics.fmean(r["log_means"][k] for r in rs if k in r["log_means"])
                     for k in ("kl", "clip_ratio/region_mean", "rpg/divergence", "sample/staleness_mean")
                     if any(k in r["log_means"] for r in rs)}
            out["table"][f"{st}|{m}"] = {
                "staleness": st, "method": m, "n": len(rs), "last": ci95(last), "best": ci95(best),
                "collapses": sum(collapse_index([a for _, a in r["accuracy"]], s.collapse_drop) is not None
                                 for r in rs), "dropped": sum(r["dropped"] for r in rs), "drift": drift,
                "train_s": statistics.fmean(r["train_s"] - r["eval_s"] for r in rs)}
            base = {r["seed"]: r for r in _main_runs(result, "AsyncGRPO", st)}
            if m != "AsyncGRPO" and base:
                pairs = [(r, base[r["seed"]]) for r in rs if r["seed"] in base]
                out["paired"][f"{st}|{m}"] = {
                    "staleness": st, "method": m,
                    "last": ci95([a["accuracy"][-1][1] - b["accuracy"][-1][1] for a, b in pairs]),
                    "best": ci95([max(x for _, x in a["accuracy"]) - max(x for _, x in b["accuracy"])
                                  for a, b in pairs])}
    for r in result["runs"]:
        if r["phase"] == "sweep":
            out["sweep"].setdefault(f"{r['method']}|{r['beta']}", []).append(r["accuracy"][-1][1])
    main = [r for r in result["runs"] if r["phase"] == "main"]
    by = {}
    for r in main:
        by.setdefault(("start", r["seed"]), set()).add((r["start"], r["accuracy"][0][1]))
        by.setdefault(("steps", r["staleness"]), set()).add((r["steps"], r["samples"]))
    out["invariants"] = {"same_start_per_seed": all(len(v) == 1 for k, v in by.items() if k[0] == "start"),
                         "same_steps_and_samples": all(len(v) == 1 for k, v in by.items() if k[0] == "steps"),
                         "nothing_dropped": all(r["dropped"] == 0 for r in main)}
    return out


def _ci(c: dict, signed: bool = False) -> str:
    mean = f"{c['mean']:+.3f}" if signed else fmt(c["mean"])
    return f"{mean} ± {fmt(c['half_width'])}"


def markdown(result: dict) -> str:
    s = settings_from_dict(result["settings"])
    summ = result["summary"]
    inv = summ["invariants"]
    parts = [f"{len(s.seeds)} seeds; {s.max_steps} optimizer steps of {s.per_device_train_batch_size} completions, "
             f"lr {s.learning_rate:g} (constant); betas chosen by the sweep: {summ['betas']}. Invariants: same SFT "
             f"start per seed {'yes' if inv['same_start_per_seed'] else 'NO'}, same steps and samples per staleness "
             f"{'yes' if inv['same_steps_and_samples'] else 'NO'}, no sample dropped "
             f"{'yes' if inv['nothing_dropped'] else 'NO'}."]
    rows = []
    for key, row in summ["table"].items():
        d = row["drift"]
        rows.append([row["staleness"], row["method"], _ci(row["last"]), _ci(row["best"]),
                     f"{row['collapses']}/{row['n']}", fmt(d.get("kl"), 4), fmt(d.get("clip_ratio/region_mean"), 4),
                     fmt(row["train_s"], 0)])
    parts.append("Held-out accuracy at the last step and best over the run (mean ± 95% t-interval half-width over "
                 f"seeds), collapses (accuracy more than {s.collapse_drop:.2f} below its best and staying there), "
                 "TRL's `kl` (k3 estimate of KL(μ ‖ π_θ) per token, mean over the run) and `clip_ratio/region_mean`, "
                 "seconds of training per run (evaluations excluded):\n\n" + markdown_table(
                     ["staleness", "method", "last", "best", "collapses", "kl", "clipped", "s/run"], rows))
    prow = [[p["staleness"], p["method"], _ci(p["last"], True), _ci(p["best"], True)]
            for p in summ["paired"].values()]
    if prow:
        parts.append("Paired by seed (same start, same prompts): difference to AsyncGRPO, mean ± 95% half-width "
                     "(an interval containing 0: no detectable difference):\n\n"
                     + markdown_table(["staleness", "method", "last − AsyncGRPO", "best − AsyncGRPO"], prow))
    srow = [[key.split("|")[0], key.split("|")[1], fmt(statistics.fmean(v)), len(v)]
            for key, v in summ["sweep"].items()]
    if srow:
        parts.append(f"Beta sweep (staleness {s.sweep_staleness}, seeds {list(s.sweep_seeds)}): final accuracy, "
                     "mean:\n\n" + markdown_table(["method", "beta", "final", "runs"], srow))
    return "\n\n".join(parts)


def plot(result: dict, path: str) -> str | None:
    """Against staleness, one line per method: final accuracy (95% CI), its paired difference to AsyncGRPO, and
    TRL's `kl` (the drift from the sampler)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    s = settings_from_dict(result["settings"])
    summ = result["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    for i, m in enumerate(s.methods):
        dx = (i - (len(s.methods) - 1) / 2) * 0.08
        for ax, table, key, signed in ((axes[0], summ["table"], "last", False), (axes[1], summ["paired"], "last",
                                                                                 True)):
            pts = [(st + dx, table[f"{st}|{m}"][key]) for st in s.staleness if f"{st}|{m}" in table]
            if pts:  # one colour per method in every panel
                ax.errorbar([p[0] for p in pts], [p[1]["mean"] for p in pts], capsize=3, marker="o", label=m,
                            color=f"C{i}",
                            yerr=[0 if math.isnan(p[1]["half_width"]) else p[1]["half_width"] for p in pts])
        pts = [(st, summ["table"][f"{st}|{m}"]["drift"].get("kl")) for st in s.staleness if f"{st}|{m}" in
               summ["table"]]
        axes[2].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m, color=f"C{i}")
    axes[1].axhline(0.0, color="grey", linewidth=1)
    axes[0].set(ylabel="final held-out accuracy (greedy)", title="Final accuracy (mean ± 95% CI)")
    axes[1].set(ylabel="final accuracy − AsyncGRPO's (same seed)", title="Paired difference to AsyncGRPO")
    axes[2].set(ylabel="TRL's kl: KL(μ ‖ π_θ) per token (k3)", title="Drift from the sampler (mean over run, seeds)")
    for ax in axes:
        ax.set_xlabel("staleness s (versions between sampler and trainer)")
        ax.set_xticks(list(s.staleness))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    if "--tuned" in argv:  # the tuned comparison (issue 43) is its own command: this module does not import it
        p.error(moved_flag("--tuned", "benchmarks.asynchronous_tuned"))
    p.add_argument("--quick", action="store_true", help="2 seeds, 24 steps, staleness 0 and 4, beta 0.3")
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--methods", nargs="+", choices=[m for m in METHODS if METHODS[m]["trainer"] != "k3"])
    p.add_argument("--staleness", type=int, nargs="+")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--learning-rate", type=float, help="constant learning rate (default 3e-4)")
    p.add_argument("--beta", type=float, help="one beta for every RPG method (skips the sweep)")
    p.add_argument("--workers", type=int)
    p.add_argument("--output", help="JSON path (default benchmarks/results/asynchronous.json)")
    p.add_argument("--resume", metavar="JSON", help="continue a results file with its settings")
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
            previous["summary"] = summarize(s, previous)
            result = previous
        else:
            result = run(s, json_path=json_path, previous=previous)
    else:
        s = dataclasses.replace(QUICK if a.quick else FULL)
        for name, value in (("seeds", a.seeds), ("methods", a.methods), ("staleness", a.staleness),
                            ("max_steps", a.max_steps), ("learning_rate", a.learning_rate), ("workers", a.workers)):
            if value is not None:
                setattr(s, name, tuple(value) if isinstance(value, list) else value)
        if a.beta is not None:
            s.betas = {"urkl": a.beta, "ufkl": a.beta}
        json_path = a.output or default_results_path("asynchronous", a.quick)
        result = run(s, json_path=json_path)
    png = plot(result, os.path.splitext(json_path)[0] + ".png")
    write_json(json_path, result)
    m = result["machine"]
    print(f"\n## Asynchronous rollouts ({m['date_utc']}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})\ncommand: `{m['command']}`; {m.get('nproc')} cores, "
          f"wall {result.get('wall_s', 0):.0f}s, load at start {m.get('loadavg_start')}, at end "
          f"{result.get('loadavg_end')}\n\n{markdown(result)}\n\nJSON: {json_path}\nplot: {png}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
