"""The asynchronous comparison with every arm tuned alike (issue 43; `benchmarks/tuning.py`'s protocol).

    python -m benchmarks.asynchronous --tuned --find-regime --workers 2   # the plan of docs/benchmarks.md section 6
    python -m benchmarks.asynchronous --tuned --quick                    # smoke: tiny sizes, every arm and phase
    python -m benchmarks.asynchronous --tuned --resume FILE              # continue an interrupted run
    python -m benchmarks.asynchronous --tuned --summarize FILE           # tables and plots of a results file

Arms (`benchmarks/asynchronous.py`'s training function, stale rollout worker, SFT start per seed): AsyncGRPO (TRL's
loss, no KL); AsyncGRPO + GRPO's k3 towards the sampler, unweighted and IS-weighted (`benchmarks/k3_arms.py`);
AsyncRPG URKL and UFKL (the paper's RPG-REINFORCE with RPG-Style Clip); AsyncRPG at beta 0 (RPG's clip alone).

1. **Tune** at staleness `tune_staleness` (8) on the tuning seeds: the learning rate of every arm (constant) and the
   beta of the four KL arms, the same budget of runs each, edges extended (`tuning.tuning_state`).
2. **Report** each arm's tuned setting at staleness 0, 8 and 16 on the reported seeds (12, disjoint from the tuning
   seeds): final held-out accuracy (mean, 95% interval), collapses, paired differences by seed (to AsyncGRPO, and the
   contrasts that isolate RPG's parts: URKL against the IS-weighted k3, whose KL gradient is URKL's without
   RPG-Style Clip; against the unweighted k3, GRPO's form; against its beta = 0 twin).
3. **Find the regime** (`--find-regime`): the tuned AsyncGRPO at staleness 16, 32, 64 against its own fresh run
   (staleness 0), paired by seed: where it loses at least `regime_drop` (0.10), off-policy data hurts a tuned
   baseline; the JSON says where, or that no staleness tried did.

Every run is saved as it finishes (the commit, seeds and every setting in the JSON); `--resume` runs only what is
missing. A run whose k3 loss is not finite stops (FloatingPointError) and is recorded as diverged: it scores below
every setting in tuning and 0 in the report (its model is no longer trainable).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from . import asynchronous as bench
from . import tuning
from ._common import (
    CACHE_DIR,
    WorkerPool,
    build_checkpoint,
    ci95,
    default_results_path,
    fmt,
    freeze_toy,
    loadavg,
    machine_info,
    markdown_table,
    save_figure,
    toy_fingerprint,
    write_json,
)
from .offpolicy import collapse_index

ARMS = ("AsyncGRPO", "AsyncGRPO+k3", "AsyncGRPO+k3 IS", "AsyncRPG-URKL", "AsyncRPG-UFKL", "AsyncRPG beta=0")
BASELINE = "AsyncGRPO"
#: (arm, against): besides every arm against AsyncGRPO.
CONTRASTS = (("AsyncRPG-URKL", "AsyncGRPO+k3 IS"),  # same KL gradient (URKL's): RPG-Style Clip and the estimator
             ("AsyncRPG-URKL", "AsyncGRPO+k3"),  # RPG's exact off-policy KL gradient against GRPO's unweighted k3
             ("AsyncRPG-UFKL", "AsyncGRPO+k3"),
             ("AsyncGRPO+k3 IS", "AsyncGRPO+k3"),  # TRL's importance weight on the k3 term
             ("AsyncRPG-URKL", "AsyncRPG beta=0"))  # RPG's KL term itself


def regularised(method: str) -> bool:
    """Whether an arm has a beta to tune (a KL arm whose spec does not fix it)."""
    spec = bench.METHODS[method]
    return spec["trainer"] in ("rpg", "k3") and "beta" not in spec


@dataclass
class TunedSettings(bench.Settings):
    methods: tuple = ARMS
    staleness: tuple = (0, 8, 16)
    tuning_seeds: tuple = (100, 101)
    reported_seeds: tuple = tuple(range(12))
    learning_rates: tuple = (7.5e-5, 1.5e-4, 3e-4)  # constant; 3e-4 the section's published one
    lr_factor: float = 2.0
    tune_betas: tuple = (0.1, 0.3, 1.0)
    beta_factor: float = 3.0
    budget: int = 32  # runs per arm: the 3 x 3 x 2 initial grid, one lr and one beta extension
    min_reported_seeds: int = 12
    tune_staleness: int = 8
    find_regime: bool = False
    regime_staleness: tuple = (16, 32, 64)
    regime_drop: float = 0.10
    smoke: bool = False
    output_dir: str = os.path.join(CACHE_DIR, "runs-async-tuned")


FULL = TunedSettings()
QUICK = TunedSettings(max_steps=2, per_device_train_batch_size=16, eval_problems=16, eval_every=2, sft_steps=20,
                      num_train_problems=64, tuning_seeds=(100,), reported_seeds=(0,), min_reported_seeds=1,
                      learning_rates=(1.5e-4, 3e-4), tune_betas=(0.3, 1.0), budget=4, staleness=(0,),
                      tune_staleness=2, find_regime=True, regime_staleness=(2,), workers=1, smoke=True)
_UNUSED = ("seeds", "sweep_betas", "sweep_seeds", "sweep_staleness", "betas", "learning_rate")


def protocol(s: TunedSettings) -> tuning.Protocol:
    return tuning.Protocol(tuning_seeds=tuple(s.tuning_seeds), reported_seeds=tuple(s.reported_seeds),
                           learning_rates=tuple(s.learning_rates), betas=tuple(s.tune_betas), budget=s.budget,
                           lr_factor=s.lr_factor, beta_factor=s.beta_factor, min_reported_seeds=s.min_reported_seeds)


def check_settings(s: TunedSettings) -> None:
    """The protocol's promises, and arms this benchmark knows (a ValueError naming the field)."""
    if any(m not in bench.METHODS for m in s.methods) or BASELINE not in s.methods:
        raise ValueError(f"methods must be arms of benchmarks/asynchronous.py ({', '.join(bench.METHODS)}) and "
                         f"include {BASELINE}; got {list(s.methods)}")
    tuning.check_protocol(protocol(s), regularised=any(regularised(m) for m in s.methods))


# ---------------------------------------------------------------------------------------------------------------------
# One run, the jobs, the driver
# ---------------------------------------------------------------------------------------------------------------------


def tuned_run(s: TunedSettings, method: str, staleness: int, seed: int, setting: dict, phase: str) -> dict:
    """`asynchronous.train_one` at `setting` (learning rate, and beta for a KL arm), with the setting and its score
    (final held-out accuracy; None when the run diverged) added."""
    try:
        r = bench.train_one(s, method, staleness, seed, setting.get(tuning.BETA), phase, setting[tuning.LR])
        score = r["accuracy"][-1][1]
    except FloatingPointError as error:
        r = {"phase": phase, "method": method, "staleness": staleness, "seed": seed, "diverged": str(error),
             "accuracy": None}
        score = None
    return {**r, "setting": dict(setting), "score": score}


def _key(phase, method, staleness, seed, setting) -> tuple:
    return phase, method, staleness, seed, tuning.setting_key(setting)


def report_jobs(s: TunedSettings, chosen: dict) -> list[tuple]:
    tuning.check_reported(protocol(s), s.reported_seeds)
    return [(m, st, seed, chosen[m], "report") for seed in s.reported_seeds for st in s.staleness for m in s.methods]


def regime_staleness(s: TunedSettings) -> list[int]:
    """The staleness levels of the regime curve that the report does not already run (its fresh run included)."""
    wanted = [0, *s.regime_staleness] if s.find_regime else []
    return [st for st in sorted(set(wanted)) if st not in s.staleness]


def regime_jobs(s: TunedSettings, chosen: dict) -> list[tuple]:
    return [(BASELINE, st, seed, chosen[BASELINE], "regime") for seed in s.reported_seeds
            for st in regime_staleness(s)]


def run(s: TunedSettings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    check_settings(s)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    info = (previous or {}).get("machine") or machine_info()
    freeze_toy(s)
    t0 = time.perf_counter()
    runs = list((previous or {}).get("runs", []))
    done = {_key(r["phase"], r["method"], r["staleness"], r["seed"], r["setting"]) for r in runs}
    result = {"settings": settings_dict(s), "machine": info, "resumed_on": machine_info() if previous else None,
              "complete": False, "runs": runs}
    methods = {m: regularised(m) for m in s.methods}
    p = protocol(s)

    def save(i=None, r=None):
        if r is not None:
            runs.append(r)
            acc = r["accuracy"]
            log(f"  [{r['phase']} {len(runs)}] {r['method']} {r['setting']} | staleness {r['staleness']} | seed "
                f"{r['seed']}: " + (f"acc {acc[0][1]:.3f} -> {acc[-1][1]:.3f}, {r['train_s']}s" if acc else
                                    f"DIVERGED ({r['diverged']})")
                + f", {time.perf_counter() - t0:.0f}s elapsed, load {loadavg()}")
        result["wall_s"] = round(time.perf_counter() - t0 + (previous or {}).get("wall_s", 0.0), 1)
        if json_path:
            write_json(json_path, result)

    def todo(jobs):
        return [(s, m, st, seed, setting, phase) for m, st, seed, setting, phase in jobs
                if _key(phase, m, st, seed, setting) not in done]

    with WorkerPool(s.workers) as pool:
        seeds = sorted(set(s.tuning_seeds) | set(s.reported_seeds))
        result["sft"] = pool.map(build_checkpoint, [(s, seed) for seed in seeds])
        log(f"SFT checkpoints ready ({time.perf_counter() - t0:.0f}s)")
        while True:  # tuning rounds: the protocol says what to run next from what has finished
            jobs = [(m, s.tune_staleness, seed, setting, "tune")
                    for m, setting, seed in tuning.pending_jobs(p, methods, runs)]
            if not jobs:
                break
            if not todo(jobs):  # cannot happen when `runs` and `done` agree; never loop on it
                raise RuntimeError(f"tuning asks again for runs already done: {jobs[:3]}")
            pool.map(tuned_run, todo(jobs), on_result=save)
        result["chosen"] = tuning.chosen_settings(p, methods, runs)
        log(f"tuned: {result['chosen']}")
        pool.map(tuned_run, todo(report_jobs(s, result["chosen"]) + regime_jobs(s, result["chosen"])),
                 on_result=save)
    result.update(complete=True, summary=summarize(s, result), loadavg_end=loadavg())
    save()
    return result


def settings_dict(s: TunedSettings) -> dict:
    d = asdict(s)
    for key in ("cache_dir", "output_dir", "toy_path", *_UNUSED):
        d.pop(key)
    d["toy_fingerprint"] = toy_fingerprint(s.toy_path)
    d["methods_config"] = {m: bench.METHODS[m] for m in s.methods}
    return d


def settings_from_dict(d: dict) -> TunedSettings:
    known = {f.name for f in dataclasses.fields(TunedSettings)}
    return TunedSettings(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known})


# ---------------------------------------------------------------------------------------------------------------------
# Summary, tables, plots
# ---------------------------------------------------------------------------------------------------------------------


def final(r: dict) -> float:
    """A run's final held-out accuracy; 0 for a run that diverged."""
    return r["accuracy"][-1][1] if r.get("accuracy") else 0.0


def _runs(result: dict, method: str, staleness: int, phases=("report",)) -> dict:
    return {r["seed"]: r for r in result["runs"]
            if r["phase"] in phases and r["method"] == method and r["staleness"] == staleness}


def summarize(s: TunedSettings, result: dict) -> dict:
    p = protocol(s)
    states = {}
    for m in s.methods:
        state = tuning.tuning_state(p, regularised(m), tuning.scores_of(result["runs"], m))
        states[m] = {k: v for k, v in state.items() if k != "pending"}
    table, pairs = {}, {}
    for st in s.staleness:
        for m in s.methods:
            rs = list(_runs(result, m, st).values())
            if rs:
                table[f"{st}|{m}"] = {
                    "staleness": st, "method": m, "n": len(rs), "setting": rs[0]["setting"],
                    "last": ci95([final(r) for r in rs]),
                    "diverged": sum(not r.get("accuracy") for r in rs),
                    "collapses": sum(bool(r.get("accuracy")) and collapse_index(
                        [a for _, a in r["accuracy"]], s.collapse_drop) is not None for r in rs)}
        for a, b in [(m, BASELINE) for m in s.methods if m != BASELINE] + list(CONTRASTS):
            ra, rb = _runs(result, a, st), _runs(result, b, st)
            both = sorted(set(ra) & set(rb))
            if both and a in s.methods and b in s.methods:
                pairs[f"{st}|{a} - {b}"] = {"staleness": st, "arm": a, "against": b,
                                            **tuning.paired([final(ra[x]) - final(rb[x]) for x in both])}
    return {"tuning": states, "table": table, "paired": pairs, "regime": regime_curve(s, result)}


def regime_curve(s: TunedSettings, result: dict) -> dict:
    """The tuned AsyncGRPO's final accuracy against staleness, paired by seed with its fresh (staleness 0) run; the
    first staleness where it loses at least `regime_drop`, or None."""
    fresh = _runs(result, BASELINE, 0, ("report", "regime"))
    points, found = [], None
    for st in sorted({*s.staleness, *regime_staleness(s), *(s.regime_staleness if s.find_regime else ())}):
        rs = _runs(result, BASELINE, st, ("report", "regime"))
        both = sorted(set(rs) & set(fresh))
        if not rs or not both:
            continue
        diff = tuning.paired([final(rs[x]) - final(fresh[x]) for x in both])
        points.append({"staleness": st, "last": ci95([final(r) for r in rs.values()]), "vs_fresh": diff})
        if found is None and st > 0 and -diff["mean"] >= s.regime_drop:
            found = st
    return {"points": points, "drop": s.regime_drop, "found": found}


def markdown(result: dict) -> str:
    s = settings_from_dict(result["settings"])
    summ = result["summary"]
    head = ("**SMOKE RUN (`--quick`): tiny sizes, not a result.** " if s.smoke else "") + (
        f"Tuned at staleness {s.tune_staleness} on seeds {list(s.tuning_seeds)} (budget {s.budget} runs per arm); "
        f"reported on seeds {list(s.reported_seeds)}; {s.max_steps} optimizer steps of {s.per_device_train_batch_size}"
        " completions, constant learning rate.")
    parts = [head, "Tuning grids (final held-out accuracy, mean over the tuning seeds):\n\n"
             + tuning.grid_markdown(summ["tuning"])]
    rows = [[r["staleness"], r["method"], _setting(r["setting"]), f"{fmt(r['last']['mean'])} ± "
             f"{fmt(r['last']['half_width'])}", f"{r['collapses']}/{r['n']}", r["diverged"]]
            for r in summ["table"].values()]
    parts.append("Reported runs, final held-out accuracy (mean ± 95% half-width):\n\n" + markdown_table(
        ["staleness", "arm", "tuned setting", "final", "collapses", "diverged"], rows))
    prow = [[p["staleness"], f"{p['arm']} − {p['against']}", tuning.paired_text(p), p["n"]]
            for p in summ["paired"].values()]
    if prow:
        parts.append("Paired by seed, 95% interval:\n\n" + markdown_table(["staleness", "difference", "final", "n"],
                                                                         prow))
    reg = summ["regime"]
    if reg["points"]:
        parts.append(f"Tuned {BASELINE} against its fresh run (regime: a loss of at least {reg['drop']:.2f}; found at "
                     f"staleness {reg['found'] if reg['found'] is not None else 'none tried'}):\n\n" + markdown_table(
                         ["staleness", "final", "− fresh (paired)"],
                         [[p["staleness"], fmt(p["last"]["mean"]), tuning.paired_text(p["vs_fresh"])]
                          for p in reg["points"]]))
    return "\n\n".join(parts)


def _setting(setting: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(setting.items()))


def plot(result: dict, path: str) -> str | None:
    """Final accuracy against staleness per arm (95% CI), and the tuned AsyncGRPO's regime curve."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    s = settings_from_dict(result["settings"])
    summ = result["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for i, m in enumerate(s.methods):
        pts = [summ["table"][f"{st}|{m}"] for st in s.staleness if f"{st}|{m}" in summ["table"]]
        axes[0].errorbar([p["staleness"] + (i - 2.5) * 0.1 for p in pts], [p["last"]["mean"] for p in pts],
                         yerr=[0 if p["last"]["half_width"] != p["last"]["half_width"] else p["last"]["half_width"]
                               for p in pts], capsize=3, marker="o", color=f"C{i}", label=m)
    reg = summ["regime"]["points"]
    axes[1].errorbar([p["staleness"] for p in reg], [p["vs_fresh"]["mean"] for p in reg], capsize=3, marker="o",
                     yerr=[0 if p["vs_fresh"]["half_width"] != p["vs_fresh"]["half_width"]
                           else p["vs_fresh"]["half_width"] for p in reg])
    axes[1].axhline(-summ["regime"]["drop"], color="red", linestyle="--", linewidth=1, label="regime threshold")
    axes[1].axhline(0.0, color="grey", linewidth=1)
    axes[0].set(xlabel="staleness", ylabel="final held-out accuracy (tuned)", title="Tuned arms (mean ± 95% CI)")
    axes[1].set(xlabel="staleness", ylabel=f"tuned {BASELINE} − its fresh run (paired)", title="Regime search")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False, prog="python -m benchmarks.asynchronous --tuned")
    p.add_argument("--quick", action="store_true", help="smoke: 2 steps, 1 tuning and 1 reported seed, tiny grids")
    p.add_argument("--find-regime", action="store_true", help="also the tuned AsyncGRPO at staleness 16, 32, 64")
    p.add_argument("--workers", type=int)
    p.add_argument("--output", help="JSON path (default benchmarks/results/asynchronous_tuned.json)")
    p.add_argument("--resume", metavar="JSON", help="continue a results file with its settings")
    p.add_argument("--summarize", metavar="JSON", help="recompute the summary, tables and plots of a results file")
    a = p.parse_args(argv)
    if a.summarize or a.resume:
        json_path = a.summarize or a.resume
        with open(json_path) as f:
            previous = json.load(f)
        s = settings_from_dict(previous["settings"])
        if a.workers:
            s.workers = a.workers
        if a.summarize:
            result = {**previous, "summary": summarize(s, previous)}
        else:
            result = run(s, json_path=json_path, previous=previous)
    else:
        s = dataclasses.replace(QUICK if a.quick else FULL)
        if a.find_regime:
            s.find_regime = True
        if a.workers:
            s.workers = a.workers
        try:
            check_settings(s)
        except ValueError as error:
            p.error(str(error))
        json_path = a.output or default_results_path("asynchronous_tuned", a.quick)
        result = run(s, json_path=json_path)
    base = os.path.splitext(json_path)[0]
    png = plot(result, base + ".png")
    sens = tuning.plot_sensitivity(result["summary"]["tuning"], base + "_sensitivity.png",
                                   f"Asynchronous toy, staleness {s.tune_staleness}: accuracy against the step size")
    write_json(json_path, result)
    m = result["machine"]
    print(f"\n## Asynchronous rollouts, tuned ({m['date_utc']}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})\ncommand: `{m['command']}`; {m.get('nproc')} cores, "
          f"wall {result.get('wall_s', 0):.0f}s, load at start {m.get('loadavg_start')}, at end "
          f"{result.get('loadavg_end')}\n\n{markdown(result)}\n\nJSON: {json_path}\nplots: {png}, {sens}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
