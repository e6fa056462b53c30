"""The real-model comparison with every arm tuned alike (issue 43, item 4; `benchmarks/tuning.py`).

    python -m benchmarks.smollm2_tuned --workers 2            # the plan of docs/benchmarks.md section 7
    python -m benchmarks.smollm2_tuned --quick                # smoke: tiny sizes, every arm and phase
    python -m benchmarks.smollm2_tuned --resume FILE          # continue an interrupted run
    python -m benchmarks.smollm2_tuned --summarize FILE       # tables and plots of a results file

SmolLM2-135M-Instruct with LoRA (`benchmarks/smollm2.py`'s training function: the demo's settings, one torch thread
per process) on **two-digit sums** (`trl_rpg.smollm2.task`, ``operands="two-digit"``: 10-99 + 10-99, carries, 8,036
training and 64 held-out problems), not the demo's single-digit ones: on those the untrained model already answers
80% greedily and every method ends at 0.96 greedy (section 7's first table), so no method can be told apart. On
two-digit sums the untrained model answers a fifth to a third of the problems greedily and few when sampling; a
short run leaves every arm well below 100%. Replies may take 32 tokens (16 cut off most correct two-digit replies
the model writes as "47 + 38 = 85.").

The arms are the synchronous benchmark's (`learning_tuned.ARMS`: GRPO as TRL ships it, GRPO with
`use_bias_correction_kl=False`, DAPO, RPG-REINFORCE URKL and UFKL). Every run takes `steps` optimizer steps of 16
completions; the batch reuse r (TRL's `steps_per_generation`) sets how old they are, as in `learning_tuned.py`.

1. **Tune** at reuse `tune_reuse` (16) on the tuning seeds: every arm's learning rate, the KL arms' beta, the same
   budget each (smaller than the toy's: a run is minutes, not seconds), edges extended.
2. **Report** each arm's tuned setting at reuse 1 (fresh samples) and 16 on the reported seeds (6, disjoint from the
   tuning seeds), paired by seed against GRPO. The score is the held-out accuracy sampled at the training
   temperature (the mean of `eval_samples` replies per problem: less noisy than one greedy reply); the greedy
   accuracy is kept in every run record (`greedy`).

Each seed's start (the untrained model's held-out accuracy) is measured once. Saved after every run; `--resume` runs
only what is missing.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import asdict, dataclass

from . import smollm2, tuned
from ._common import CACHE_DIR
from .learning import METHODS, RPG_COMMON
from .learning_tuned import ARMS, BASELINE, CONTRASTS, regularised


def prepare(s, pool, log, previous=None) -> dict:
    """The model prepared once (`trl-rpg prepare smollm2`), then every seed's start measured (kept on resume)."""
    from trl_rpg.smollm2 import prepare_smollm2

    path = prepare_smollm2(s.model_cache, log=log)
    starts = {x["seed"]: x for x in (previous or {}).get("starts", [])}
    seeds = sorted(set(s.tuning_seeds) | set(s.reported_seeds))
    missing = [seed for seed in seeds if seed not in starts]
    for r in pool.map(smollm2.evaluate_start, [(s, path, seed) for seed in missing]):
        starts[r["seed"]] = r
    log("start: " + ", ".join(f"seed {x} greedy {starts[x]['accuracy']['greedy']:.3f} sampled "
                              f"{starts[x]['accuracy']['sampled']:.3f}" for x in seeds))
    return {"model_path": path, "starts": [starts[x] for x in seeds]}


DESIGN = tuned.Design(name="smollm2_tuned", level="reuse", levels="reuse_levels", tune_level="tune_reuse",
                      regime_levels="regime_reuse", fresh=1, baseline=BASELINE, contrasts=CONTRASTS,
                      regularised={m: regularised(m) for m in METHODS}, prepare=prepare,
                      tasks_per_worker=1)  # a fresh process per run: a real model's run does not give its memory back


@dataclass
class TunedSettings(smollm2.Settings):
    methods: tuple = ARMS
    operands: str = "two-digit"
    max_completion_length: int = 32
    temperature: float = 0.7  # training and the sampled held-out accuracy (see the module docstring)
    eval_samples: int = 4
    steps: int = 32  # optimizer steps of every run, whatever its reuse (a multiple of every reuse level)
    eval_every: int = 32  # the end only: the score is the final accuracy (an evaluation costs as much as training)
    reuse_levels: tuple = (1, 16)
    tune_reuse: int = 16
    regime_reuse: tuple = (4,)
    tuning_seeds: tuple = (100, 101)
    reported_seeds: tuple = tuple(range(6))
    learning_rates: tuple = (2.5e-4, 5e-4, 1e-3)  # 5e-4 the demo's (LoRA)
    lr_factor: float = 2.0
    tune_betas: tuple = (0.01, 0.1)
    beta_factor: float = 4.0
    budget: int = 18  # the initial grid (12 runs) and one extension of either axis
    min_reported_seeds: int = 6
    find_regime: bool = False
    regime_drop: float = 0.10
    collapse_drop: float = 0.10
    smoke: bool = False
    output_dir: str = os.path.join(CACHE_DIR, "smollm2-runs-tuned")


FULL = TunedSettings()
QUICK = TunedSettings(steps=2, reuse_levels=(1, 2), tune_reuse=2, regime_reuse=(), eval_every=2, eval_samples=1,
                      tuning_seeds=(100,), reported_seeds=(0,), min_reported_seeds=1, learning_rates=(2.5e-4, 5e-4),
                      tune_betas=(0.01, 0.1), budget=4, workers=1, smoke=True)
_UNUSED = ("seeds", "generation_batches", "reuse")
HEADING = "SmolLM2-135M-Instruct, tuned"


def check_settings(s: TunedSettings) -> None:
    from trl_rpg.smollm2.task import OPERANDS

    if s.operands not in OPERANDS:
        raise ValueError(f"operands must be one of {', '.join(OPERANDS)}; got {s.operands!r}")
    levels = {*s.reuse_levels, s.tune_reuse, *s.regime_reuse, DESIGN.fresh}
    bad = sorted(r for r in levels if not (isinstance(r, int) and r >= 1 and s.steps % r == 0))
    if bad:
        raise ValueError(f"reuse levels must be positive integers dividing steps ({s.steps}); got {bad}")
    tuned.check(DESIGN, s)


def at_reuse(s: TunedSettings, reuse: int) -> TunedSettings:
    """The settings of a run at `reuse`: `steps` optimizer steps in `steps / reuse` generation batches."""
    return dataclasses.replace(s, reuse=reuse, generation_batches=s.steps // reuse)


def tuned_run(s: TunedSettings, method: str, reuse: int, seed: int, setting: dict, phase: str) -> dict:
    """`smollm2.train_one` at `reuse` and `setting`; the record's `accuracy` is the sampled held-out accuracy (the
    score), `greedy` the greedy one, each as (step, value) at every evaluation (the start: the results' `starts`)."""
    from trl_rpg.smollm2 import prepare_smollm2

    path = prepare_smollm2(s.model_cache)  # prepared by the driver: this only finds it
    try:
        r = smollm2.train_one(at_reuse(s, reuse), path, method, seed, dict(setting))
    except FloatingPointError as error:
        return {**tuned.diverged_record(phase, method, "reuse", reuse, seed, error), "setting": dict(setting),
                "score": None}
    curve = [tuple(x) for x in r["accuracy"]]
    return {"phase": phase, "method": method, "reuse": reuse, "seed": seed, "setting": dict(setting),
            "accuracy": [(step, a["sampled"]) for step, a in curve],
            "greedy": [(step, a["greedy"]) for step, a in curve],
            "score": curve[-1][1]["sampled"], "rewards": r["rewards"], "train_s": r["total_s"],
            "steps": s.steps, "log_means": r["log_means"]}


def run(s: TunedSettings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    check_settings(s)
    return tuned.run(DESIGN, s, tuned_run, settings_dict, log=log, json_path=json_path, previous=previous)


def summarize(s: TunedSettings, result: dict) -> dict:
    return tuned.summarize(DESIGN, s, result)


def settings_dict(s: TunedSettings) -> dict:
    d = asdict(s)
    for key in ("output_dir", "model_cache", *_UNUSED):
        d.pop(key)
    d["methods_config"] = {m: METHODS[m] for m in s.methods}
    d["rpg_common"] = dict(RPG_COMMON)
    return d


def settings_from_dict(d: dict) -> TunedSettings:
    return tuned.settings_of(TunedSettings, d)


def markdown(result: dict) -> str:
    s = settings_from_dict(result["settings"])
    return tuned.markdown(DESIGN, s, result["summary"], (
        f"SmolLM2-135M-Instruct, LoRA, {s.operands} sums; tuned at reuse {s.tune_reuse} on seeds "
        f"{list(s.tuning_seeds)} (budget {s.budget} runs per arm); reported on seeds {list(s.reported_seeds)}; "
        f"{s.steps} optimizer steps of 16 completions in every run; score: held-out accuracy sampled at T = "
        f"{s.temperature:g} ({s.eval_samples} replies per problem)."))


def plot(result: dict, path: str) -> str | None:
    return tuned.plot(DESIGN, settings_from_dict(result["settings"]), result["summary"], path)


def sensitivity_title(s: TunedSettings) -> str:
    return f"SmolLM2-135M-Instruct, {s.operands} sums, batch reuse {s.tune_reuse}:\naccuracy against the step size"


def main(argv=None):
    return tuned.cli(sys.modules[__name__], argv, "python -m benchmarks.smollm2_tuned",
                     "also the tuned GRPO at the regime reuse levels against its fresh run (reuse 1)")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
