"""The driver of a tuned comparison (issue 43), shared by `asynchronous_tuned.py`, `learning_tuned.py` and
`smollm2_tuned.py`.

A comparison is described by a `Design`: its arms, its baseline, and the off-policy "level" its runs vary (the
staleness of the asynchronous benchmark, the batch reuse of the synchronous one) with its fresh-sample value. The
settings object carries the protocol's fields (`tuning_seeds`, `reported_seeds`, `learning_rates`, `tune_betas`,
`budget`, `lr_factor`, `beta_factor`, `min_reported_seeds`, `find_regime`, `regime_drop`, `smoke`, `workers`) and,
under the names the design gives, the reported levels, the tuning level and the regime levels.

`run` tunes every arm at the tuning level (`tuning.py`'s protocol, round after round until no run is pending), runs
each arm's tuned setting at every reported level on the reported seeds and, with `find_regime`, the baseline at the
regime levels; it saves after every run and, given the previous results, runs only what is missing. `summarize`
computes the table, the paired verdicts and the regime curve from the runs alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from . import tuning
from ._common import (
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
    write_json,
)
from .offpolicy import collapse_index


@dataclass(frozen=True)
class Design:
    name: str  # the results file's name
    level: str  # a run record's key for its level: "staleness" or "reuse"
    levels: str  # the settings' field of the reported levels
    tune_level: str  # the settings' field of the level tuning runs at
    regime_levels: str  # the settings' field of the regime search's levels
    fresh: int  # the level whose samples are fresh (staleness 0, reuse 1)
    baseline: str
    contrasts: tuple  # (arm, against) pairs besides every arm against the baseline
    regularised: dict  # {arm: whether it has a beta to tune}
    # prepare(s, pool, log, previous) -> what the results file keeps of it, before any run (previous: the results
    # resumed, or None): None is the toy's (its modules frozen, every seed's SFT checkpoint built); the real model's
    # benchmark measures each seed's start instead
    prepare: object = None
    tasks_per_worker: int | None = None  # runs a worker process does before a fresh one (None: _common's default)


def prepare_toy(s, pool, log, previous=None) -> dict:
    """The toy's preparation: its task modules frozen, the SFT checkpoint of every tuning and reported seed built."""
    t0 = time.perf_counter()
    freeze_toy(s)
    seeds = sorted(set(s.tuning_seeds) | set(s.reported_seeds))
    sft = pool.map(build_checkpoint, [(s, seed) for seed in seeds])
    log(f"SFT checkpoints ready ({time.perf_counter() - t0:.0f}s)")
    return {"sft": sft}


def settings_of(cls, d: dict):
    """The settings dataclass `cls` from a results file's settings (lists back to tuples; keys it lacks dropped)."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known})


def protocol(s) -> tuning.Protocol:
    return tuning.Protocol(tuning_seeds=tuple(s.tuning_seeds), reported_seeds=tuple(s.reported_seeds),
                           learning_rates=tuple(s.learning_rates), betas=tuple(s.tune_betas), budget=s.budget,
                           lr_factor=s.lr_factor, beta_factor=s.beta_factor, min_reported_seeds=s.min_reported_seeds)


def check(d: Design, s) -> None:
    """The protocol's promises, and arms the design knows (a ValueError naming the field)."""
    if any(m not in d.regularised for m in s.methods) or d.baseline not in s.methods:
        raise ValueError(f"methods must be arms of this benchmark ({', '.join(d.regularised)}) and include "
                         f"{d.baseline}; got {list(s.methods)}")
    tuning.check_protocol(protocol(s), regularised=any(d.regularised[m] for m in s.methods))


def key(phase, method, level, seed, setting) -> tuple:
    return phase, method, level, seed, tuning.setting_key(setting)


def report_jobs(d: Design, s, chosen: dict) -> list[tuple]:
    tuning.check_reported(protocol(s), s.reported_seeds)
    # Level by level, in the order given: an interrupted run leaves whole levels (every arm on every seed) behind.
    return [(m, level, seed, chosen[m], "report") for level in getattr(s, d.levels) for seed in s.reported_seeds
            for m in s.methods]


def regime_levels(d: Design, s) -> list[int]:
    """The regime curve's levels that the report does not already run (its fresh run included)."""
    wanted = [d.fresh, *getattr(s, d.regime_levels)] if s.find_regime else []
    return [x for x in sorted(set(wanted)) if x not in getattr(s, d.levels)]


def regime_jobs(d: Design, s, chosen: dict) -> list[tuple]:
    return [(d.baseline, level, seed, chosen[d.baseline], "regime") for seed in s.reported_seeds
            for level in regime_levels(d, s)]


def run(d: Design, s, train, settings_dict, log=print, json_path: str | None = None,
        previous: dict | None = None) -> dict:
    """`train(s, method, level, seed, setting, phase)` is one run (a module-level function: it is sent to worker
    processes); `settings_dict(s)` what the JSON keeps of the settings."""
    check(d, s)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    info = (previous or {}).get("machine") or machine_info()
    t0 = time.perf_counter()
    runs = list((previous or {}).get("runs", []))
    done = {key(r["phase"], r["method"], r[d.level], r["seed"], r["setting"]) for r in runs}
    result = {"settings": settings_dict(s), "machine": info, "resumed_on": machine_info() if previous else None,
              "complete": False, "runs": runs}
    p = protocol(s)
    methods = {m: d.regularised[m] for m in s.methods}

    def save(i=None, r=None):
        if r is not None:
            runs.append(r)
            acc = r["accuracy"]
            log(f"  [{r['phase']} {len(runs)}] {r['method']} {r['setting']} | {d.level} {r[d.level]} | seed "
                f"{r['seed']}: " + (f"acc {acc[0][1]:.3f} -> {acc[-1][1]:.3f}, {r['train_s']}s" if acc else
                                    f"DIVERGED ({r['diverged']})")
                + f", {time.perf_counter() - t0:.0f}s elapsed, load {loadavg()}")
        result["wall_s"] = round(time.perf_counter() - t0 + (previous or {}).get("wall_s", 0.0), 1)
        if json_path:
            write_json(json_path, result)

    def todo(jobs):
        return [(s, m, level, seed, setting, phase) for m, level, seed, setting, phase in jobs
                if key(phase, m, level, seed, setting) not in done]

    with WorkerPool(s.workers, d.tasks_per_worker) as pool:
        result.update((d.prepare or prepare_toy)(s, pool, log, previous))
        while True:  # tuning rounds: the protocol says what to run next from what has finished
            jobs = [(m, getattr(s, d.tune_level), seed, setting, "tune")
                    for m, setting, seed in tuning.pending_jobs(p, methods, runs)]
            if not jobs:
                break
            if not todo(jobs):  # cannot happen when `runs` and `done` agree; never loop on it
                raise RuntimeError(f"tuning asks again for runs already done: {jobs[:3]}")
            pool.map(train, todo(jobs), on_result=save)
        result["chosen"] = tuning.chosen_settings(p, methods, runs)
        log(f"tuned: {result['chosen']}")
        pool.map(train, todo(report_jobs(d, s, result["chosen"]) + regime_jobs(d, s, result["chosen"])),
                 on_result=save)
    result.update(complete=True, summary=summarize(d, s, result), loadavg_end=loadavg())
    save()
    return result


def diverged_record(phase, method, level_key, level, seed, error) -> dict:
    """What a run that stopped on a non-finite loss leaves: no accuracy curve, and why."""
    return {"phase": phase, "method": method, level_key: level, "seed": seed, "diverged": str(error),
            "accuracy": None}


# ---------------------------------------------------------------------------------------------------------------------
# Summary, tables, plot
# ---------------------------------------------------------------------------------------------------------------------


def final(r: dict) -> float:
    """A run's final held-out accuracy; 0 for a run that diverged."""
    return r["accuracy"][-1][1] if r.get("accuracy") else 0.0


def runs_at(d: Design, result: dict, method: str, level: int, phases=("report",)) -> dict:
    return {r["seed"]: r for r in result["runs"]
            if r["phase"] in phases and r["method"] == method and r[d.level] == level}


def summarize(d: Design, s, result: dict) -> dict:
    p = protocol(s)
    states = {}
    for m in s.methods:
        state = tuning.tuning_state(p, d.regularised[m], tuning.scores_of(result["runs"], m))
        states[m] = {k: v for k, v in state.items() if k != "pending"}
    table, pairs = {}, {}
    for level in getattr(s, d.levels):
        for m in s.methods:
            rs = list(runs_at(d, result, m, level).values())
            if rs:
                table[f"{level}|{m}"] = {
                    d.level: level, "method": m, "n": len(rs), "setting": rs[0]["setting"],
                    "last": ci95([final(r) for r in rs]), "diverged": sum(not r.get("accuracy") for r in rs),
                    "collapses": sum(bool(r.get("accuracy")) and collapse_index(
                        [a for _, a in r["accuracy"]], s.collapse_drop) is not None for r in rs)}
        for a, b in [(m, d.baseline) for m in s.methods if m != d.baseline] + list(d.contrasts):
            ra, rb = runs_at(d, result, a, level), runs_at(d, result, b, level)
            both = sorted(set(ra) & set(rb))
            if both and a in s.methods and b in s.methods:
                pairs[f"{level}|{a} - {b}"] = {d.level: level, "arm": a, "against": b,
                                               **tuning.paired([final(ra[x]) - final(rb[x]) for x in both])}
    return {"tuning": states, "table": table, "paired": pairs, "regime": regime_curve(d, s, result)}


def regime_curve(d: Design, s, result: dict) -> dict:
    """The tuned baseline's final accuracy against the level, paired by seed with its fresh run; the first level
    where it loses at least `regime_drop`, or None."""
    fresh = runs_at(d, result, d.baseline, d.fresh, ("report", "regime"))
    points, found = [], None
    regime = getattr(s, d.regime_levels) if s.find_regime else ()
    for level in sorted({*getattr(s, d.levels), *regime_levels(d, s), *regime}):
        rs = runs_at(d, result, d.baseline, level, ("report", "regime"))
        both = sorted(set(rs) & set(fresh))
        if not rs or not both:
            continue
        diff = tuning.paired([final(rs[x]) - final(fresh[x]) for x in both])
        points.append({d.level: level, "last": ci95([final(r) for r in rs.values()]), "vs_fresh": diff})
        if found is None and level != d.fresh and -diff["mean"] >= s.regime_drop:
            found = level
    return {"points": points, "drop": s.regime_drop, "found": found}


def markdown(d: Design, s, summary: dict, head: str) -> str:
    parts = [("**SMOKE RUN (`--quick`): tiny sizes, not a result.** " if s.smoke else "") + head,
             "Tuning grids (final held-out accuracy, mean over the tuning seeds):\n\n"
             + tuning.grid_markdown(summary["tuning"])]
    rows = [[r[d.level], r["method"], ", ".join(f"{k} {v:g}" for k, v in sorted(r["setting"].items())),
             f"{fmt(r['last']['mean'])} ± {fmt(r['last']['half_width'])}", f"{r['collapses']}/{r['n']}",
             r["diverged"]] for r in summary["table"].values()]
    parts.append("Reported runs, final held-out accuracy (mean ± 95% half-width):\n\n" + markdown_table(
        [d.level, "arm", "tuned setting", "final", "collapses", "diverged"], rows))
    prow = [[p[d.level], f"{p['arm']} − {p['against']}", tuning.paired_text(p), p["n"]]
            for p in summary["paired"].values()]
    if prow:
        parts.append("Paired by seed, 95% interval:\n\n" + markdown_table([d.level, "difference", "final", "n"], prow))
    reg = summary["regime"]
    if reg["points"]:
        found = reg["found"] if reg["found"] is not None else "none tried"
        parts.append(f"Tuned {d.baseline} against its fresh run ({d.level} {d.fresh}; regime: a loss of at least "
                     f"{reg['drop']:.2f}; found at {d.level} {found}):\n\n" + markdown_table(
                         [d.level, "final", "− fresh (paired)"],
                         [[pt[d.level], fmt(pt["last"]["mean"]), tuning.paired_text(pt["vs_fresh"])]
                          for pt in reg["points"]]))
    return "\n\n".join(parts)


def _half(c: dict) -> float:
    return 0.0 if c["half_width"] != c["half_width"] else c["half_width"]


def plot(d: Design, s, summary: dict, path: str) -> str | None:
    """Final accuracy against the level per arm (95% CI), and the tuned baseline's regime curve."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    levels = getattr(s, d.levels)
    for i, m in enumerate(s.methods):
        pts = [summary["table"][f"{x}|{m}"] for x in levels if f"{x}|{m}" in summary["table"]]
        axes[0].errorbar([levels.index(p[d.level]) + (i - 2.5) * 0.05 for p in pts], [p["last"]["mean"] for p in pts],
                         yerr=[_half(p["last"]) for p in pts], capsize=3, marker="o", color=f"C{i}", label=m)
    axes[0].set_xticks(range(len(levels)), [str(x) for x in levels])
    reg = summary["regime"]["points"]
    axes[1].errorbar([p[d.level] for p in reg], [p["vs_fresh"]["mean"] for p in reg], capsize=3, marker="o",
                     yerr=[_half(p["vs_fresh"]) for p in reg], label=d.baseline)
    axes[1].axhline(-summary["regime"]["drop"], color="red", linestyle="--", linewidth=1, label="regime threshold")
    axes[1].axhline(0.0, color="grey", linewidth=1)
    axes[0].set(xlabel=d.level, ylabel="final held-out accuracy (tuned)", title="Tuned arms (mean ± 95% CI)")
    axes[1].set(xlabel=d.level, ylabel=f"tuned {d.baseline} − its fresh run (paired)", title="Regime search")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def _arms_and_levels(parser, module, s, a) -> None:
    """The arms and levels the command line asks for, into the settings `s`; an arm or level the protocol refuses ends
    the command with the parser's error."""
    d = module.DESIGN
    if a.methods:
        s.methods = tuple(a.methods)
    if a.levels:
        setattr(s, d.levels, tuple(a.levels))
    if a.regime_levels:
        setattr(s, d.regime_levels, tuple(a.regime_levels))
    try:
        module.check_settings(s)
    except ValueError as error:
        parser.error(str(error))


def cli(module, argv, prog: str, regime_help: str):
    """The command line of a tuned comparison: `module` (asynchronous_tuned, learning_tuned) gives `DESIGN`, `FULL`,
    `QUICK`, `HEADING`, `check_settings`, `run`, `summarize`, `settings_from_dict`, `markdown`, `plot` and
    `sensitivity_title(s)`."""
    import argparse
    import dataclasses
    import json

    d = module.DESIGN
    p = argparse.ArgumentParser(description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False, prog=prog)
    p.add_argument("--quick", action="store_true", help="smoke: 2 steps, 1 tuning and 1 reported seed, tiny grids")
    p.add_argument("--find-regime", action="store_true", help=regime_help)
    p.add_argument("--workers", type=int)
    p.add_argument("--methods", nargs="+", help=f"the arms to run (default: all; {d.baseline} is always one)")
    p.add_argument("--levels", nargs="+", type=int, help=f"the reported {d.level} levels (default {d.levels} of FULL)")
    p.add_argument("--regime-levels", nargs="+", type=int,
                   help=f"the {d.level} levels of the regime curve (with --find-regime)")
    p.add_argument("--output", help=f"JSON path (default benchmarks/results/{d.name}.json)")
    p.add_argument("--resume", metavar="JSON", help="continue a results file with its settings (--methods, --levels "
                   "and --regime-levels replace the file's: a file grows by arms and levels, its runs all kept)")
    p.add_argument("--summarize", metavar="JSON", help="recompute the summary, tables and plots of a results file")
    a = p.parse_args(argv)
    if a.summarize or a.resume:
        json_path = a.summarize or a.resume
        with open(json_path) as f:
            previous = json.load(f)
        s = module.settings_from_dict(previous["settings"])
        if a.workers:
            s.workers = a.workers
        if a.resume:
            _arms_and_levels(p, module, s, a)
        if a.summarize:
            result = {**previous, "summary": module.summarize(s, previous)}
        else:
            result = module.run(s, json_path=json_path, previous=previous)
    else:
        s = dataclasses.replace(module.QUICK if a.quick else module.FULL)
        if a.find_regime:
            s.find_regime = True
        if a.workers:
            s.workers = a.workers
        _arms_and_levels(p, module, s, a)
        json_path = a.output or default_results_path(d.name, a.quick)
        result = module.run(s, json_path=json_path)
    base = os.path.splitext(json_path)[0]
    png = module.plot(result, base + ".png")
    sens = tuning.plot_sensitivity(result["summary"]["tuning"], base + "_sensitivity.png",
                                   module.sensitivity_title(s))
    write_json(json_path, result)
    m = result["machine"]
    print(f"\n## {module.HEADING} ({m.get('date_utc')}, commit {m.get('git_commit')}"
          f"{' + local changes' if m.get('git_dirty') else ''})\ncommand: `{m.get('command')}`; {m.get('nproc')} "
          f"cores, wall {result.get('wall_s', 0):.0f}s, load at start {m.get('loadavg_start')}, at end "
          f"{result.get('loadavg_end')}\n\n{module.markdown(result)}\n\nJSON: {json_path}\nplots: {png}, {sens}")
    return result
