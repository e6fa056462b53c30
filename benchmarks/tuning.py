"""One tuning protocol for the learning comparisons (issue 43): every method tuned alike, then reported on other seeds.

- **Same budget.** Every method gets the same number of tuning runs (`Protocol.budget`; one run = one setting on one
  tuning seed) and the same learning-rate grid; the KL-regularised methods also a grid over their `beta` (the other
  methods have no regulariser to tune). Clip widths are fixed at each method's published values (TRL's 0.2; RPG's
  0.2/0.28 with dual clip c = 10): a third axis would multiply every KL method's grid by its size within the same
  budget, and the clip is a trust region on w that the step size already controls (the learning rate is tuned for
  every method), so the arms compare regularisers at equal step-size tuning rather than clip settings.
- **Edges extended.** The score of a setting is its mean over the tuning seeds (held-out accuracy at the end of the
  run; a run that diverged scores below every other). When the best setting lies on an edge of an axis, the axis
  is extended one value past that edge (multiplied or divided by the axis's factor) and the new cells are run; until
  the best is inside the grid, or the next extension would pass the budget (then the state says so: `stopped_by`
  "budget", with the edge).
- **Seeds.** Tuning seeds and reported seeds are disjoint (`check_protocol` refuses otherwise); a report is on at
  least `min_reported_seeds` (12) seeds, paired by seed, with 95% t-intervals; an interval containing 0 is written
  "no detectable difference".
- **Resumable and pure.** The state of the search is recomputed from the finished runs alone (`tuning_state`): a
  benchmark saves its runs after each one and, resumed, runs only what is missing. Ties go to the smaller learning
  rate, then the smaller beta, so the same runs always give the same choice.

The benchmarks supply the runs; this module chooses what to run next, what was chosen, the intervals, the
sensitivity plot (held-out accuracy against the learning rate, per method) and its table.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ._common import ci95, fmt, markdown_table, save_figure

LR, BETA = "learning_rate", "beta"
NO_DIFFERENCE = "no detectable difference"


@dataclass(frozen=True)
class Protocol:
    tuning_seeds: tuple
    reported_seeds: tuple
    learning_rates: tuple  # the initial grid, increasing (>= 2 values)
    betas: tuple  # the KL methods' initial beta grid, increasing (>= 2 values)
    budget: int  # tuning runs per method (setting x tuning seed), the same for every method
    lr_factor: float = 2.0  # an edge of the grid is extended by this factor
    beta_factor: float = 3.0
    min_reported_seeds: int = 12


def check_protocol(p: Protocol, regularised: bool = True) -> None:
    """Refuse a protocol that would not be the one described above (a ValueError naming the field)."""
    def refuse(name, why):
        raise ValueError(f"tuning protocol: {name} {why}")

    for name in ("tuning_seeds", "reported_seeds"):
        seeds = getattr(p, name)
        if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(x, int) for x in seeds):
            refuse(name, f"must be distinct integers, at least one; got {list(seeds)}")
    shared = sorted(set(p.tuning_seeds) & set(p.reported_seeds))
    if shared:
        refuse("reported_seeds", f"must be disjoint from tuning_seeds (a setting is not reported on the seeds it was "
                                 f"chosen on); both hold {shared}")
    if len(p.reported_seeds) < p.min_reported_seeds:
        refuse("reported_seeds", f"must hold at least {p.min_reported_seeds} seeds; got {len(p.reported_seeds)}")
    for name in ("learning_rates", "betas"):
        grid = getattr(p, name)
        if len(grid) < 2 or any(not (isinstance(x, (int, float)) and 0 < x < math.inf) for x in grid) or any(
                a >= b for a, b in zip(grid, grid[1:])):
            refuse(name, f"must be at least 2 positive finite values, increasing; got {list(grid)}")
    for name in ("lr_factor", "beta_factor"):
        if not (getattr(p, name) > 1 and math.isfinite(getattr(p, name))):
            refuse(name, f"must be a finite number > 1; got {getattr(p, name)}")
    first = len(p.learning_rates) * (len(p.betas) if regularised else 1) * len(p.tuning_seeds)
    if not isinstance(p.budget, int) or p.budget < first:
        refuse("budget", f"must be an integer of at least the initial grid's runs ({first}); got {p.budget}")


def initial_grid(p: Protocol, regularised: bool) -> dict:
    return {LR: list(p.learning_rates), **({BETA: list(p.betas)} if regularised else {})}


def setting_key(setting: dict) -> str:
    """A setting's name in the results: its axes in order, the values as Python writes floats (exact round trip)."""
    return ",".join(f"{name}={float(setting[name])!r}" for name in sorted(setting))


def cells(grid: dict) -> list[dict]:
    """Every setting of the grid, ascending by learning rate then beta (the tie order)."""
    names = sorted(grid, key=lambda n: (n != LR, n))
    return [dict(zip(names, values)) for values in itertools.product(*(sorted(grid[n]) for n in names))]


def mean_score(scores: list) -> float | None:
    """A setting's score: the mean over its seeds; None (below everything) when a run of it diverged."""
    return None if any(s is None or not math.isfinite(s) for s in scores) else sum(scores) / len(scores)


def best_cell(table: list[tuple[dict, float | None]]) -> dict | None:
    """The highest-scoring setting; ties to the first in the table's order (smaller lr, then smaller beta)."""
    best, best_score = None, None
    for cell, score in table:
        if score is not None and (best_score is None or score > best_score):
            best, best_score = cell, score
    return best


def tuning_state(p: Protocol, regularised: bool, scores: dict) -> dict:
    """Where the search of one method stands, given `scores` {(setting_key, seed): final accuracy or None}.

    Returns the grid, the runs still `pending` [(setting, seed)], and once none is: `best`, the table of every
    setting's mean score, the `extensions` made, and `stopped_by` (None: the best is inside the grid; "budget": the
    extension past `edge` would not fit; "diverged": every setting diverged)."""
    grid = initial_grid(p, regularised)
    extensions = []
    while True:
        settings = cells(grid)
        pending = [(c, seed) for c in settings for seed in p.tuning_seeds if (setting_key(c), seed) not in scores]
        state = {"grid": {k: sorted(v) for k, v in grid.items()}, "pending": pending, "extensions": list(extensions),
                 "runs": len(settings) * len(p.tuning_seeds) - len(pending)}
        if pending:
            return {**state, "finished": False}
        table = [(c, mean_score([scores[(setting_key(c), seed)] for seed in p.tuning_seeds])) for c in settings]
        best = best_cell(table)
        state.update(finished=True, table=[{"setting": c, "score": s} for c, s in table], best=best, edge=None,
                     stopped_by=None)
        if best is None:
            return {**state, "stopped_by": "diverged"}
        edges = [(name, side) for name in grid for side, value in (("low", min(grid[name])), ("high", max(grid[name])))
                 if best[name] == value]
        if not edges:
            return state
        name, side = sorted(edges, key=lambda e: (e[0] != LR, e))[0]
        factor = p.lr_factor if name == LR else p.beta_factor
        value = max(grid[name]) * factor if side == "high" else min(grid[name]) / factor
        cost = len(settings) // len(grid[name]) * len(p.tuning_seeds)  # one new value x the other axes' values
        if state["runs"] + cost > p.budget:
            return {**state, "edge": {"axis": name, "side": side}, "stopped_by": "budget"}
        grid[name].append(value)
        extensions.append({"axis": name, "side": side, "value": value})


def scores_of(runs: list[dict], method: str, phase: str = "tune") -> dict:
    """{(setting_key, seed): score} of a method's finished tuning runs (each run: method, phase, setting, seed,
    score)."""
    return {(setting_key(r["setting"]), r["seed"]): r["score"] for r in runs
            if r["phase"] == phase and r["method"] == method}


def pending_jobs(p: Protocol, methods: dict, runs: list[dict]) -> list[tuple]:
    """(method, setting, seed) of every tuning run the protocol asks for next; `methods` {name: regularised}."""
    return [(m, setting, seed) for m, regularised in methods.items()
            for setting, seed in tuning_state(p, regularised, scores_of(runs, m))["pending"]]


def chosen_settings(p: Protocol, methods: dict, runs: list[dict]) -> dict:
    """{method: its tuned setting}; refuses while a search is unfinished or when every setting diverged."""
    out = {}
    for m, regularised in methods.items():
        state = tuning_state(p, regularised, scores_of(runs, m))
        if not state["finished"]:
            raise RuntimeError(f"tuning of {m} is unfinished: {len(state['pending'])} runs pending")
        if state["best"] is None:
            raise RuntimeError(f"tuning of {m}: every setting diverged, none can be reported")
        out[m] = state["best"]
    return out


def check_reported(p: Protocol, seeds) -> None:
    """A reported run's seed must not be a tuning seed (the protocol's promise, checked where the jobs are made)."""
    shared = sorted(set(seeds) & set(p.tuning_seeds))
    if shared:
        raise ValueError(f"tuning protocol: reported runs on tuning seeds {shared}")


def paired(diffs: list[float]) -> dict:
    """Mean and 95% t-interval of paired differences, with its verdict ("no detectable difference" when the interval
    contains 0, "higher"/"lower" otherwise, "too few seeds" below 2)."""
    c = ci95(diffs)
    if not math.isfinite(c["half_width"]):
        verdict = "too few seeds"
    elif c["mean"] - c["half_width"] <= 0 <= c["mean"] + c["half_width"]:
        verdict = NO_DIFFERENCE
    else:
        verdict = "higher" if c["mean"] > 0 else "lower"
    return {**c, "verdict": verdict}


def paired_text(c: dict) -> str:
    """"+0.012 ± 0.020 (no detectable difference)"."""
    return f"{c['mean']:+.3f} ± {fmt(c['half_width'])} ({c['verdict']})"


def sensitivity(state: dict) -> list[tuple[float, float | None]]:
    """(learning rate, score) of a finished search at its chosen beta (all learning rates when it has none)."""
    best = state["best"] or {}
    return [(row["setting"][LR], row["score"]) for row in state["table"]
            if all(row["setting"][k] == v for k, v in best.items() if k != LR)]


def grid_markdown(states: dict) -> str:
    """Every tuned setting of every method: score, and which was chosen; then how each search ended."""
    rows, ends = [], []
    for m, state in states.items():
        for row in state.get("table", []):
            s = row["setting"]
            rows.append([m, f"{s[LR]:g}", f"{s[BETA]:g}" if BETA in s else "–", fmt(row["score"]),
                         "chosen" if s == state["best"] else ""])
        why = {None: "best inside the grid", "budget": "budget reached with the best on an edge",
               "diverged": "every setting diverged"}[state.get("stopped_by")]
        why = why if state.get("finished") else f"unfinished ({len(state.get('pending', [])) or 'some'} pending)"
        edge = state.get("edge")
        ends.append([m, state["runs"], len(state["extensions"]), why + (f" ({edge['axis']} {edge['side']})"
                                                                        if edge else "")])
    return (markdown_table(["method", "lr", "beta", "tuning score", ""], rows) + "\n\n"
            + markdown_table(["method", "tuning runs", "extensions", "search ended"], ends))


def plot_sensitivity(states: dict, path: str, title: str) -> str | None:
    """Held-out accuracy (mean over tuning seeds) against the learning rate, one line per method at its chosen
    beta; the chosen setting marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (m, state) in enumerate(states.items()):
        if not state.get("finished"):
            continue
        pts = [(lr, s) for lr, s in sensitivity(state) if s is not None]
        if not pts:
            continue
        beta = (state["best"] or {}).get(BETA)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=f"C{i}",
                label=m + (f" (beta {beta:g})" if beta is not None else ""))
        chosen = [(x, y) for x, y in pts if x == state["best"][LR]]
        ax.plot([x for x, _ in chosen], [y for _, y in chosen], marker="*", markersize=14, color=f"C{i}")
    ax.set_xscale("log")
    ax.set(xlabel="learning rate", ylabel="held-out accuracy (mean over tuning seeds)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
