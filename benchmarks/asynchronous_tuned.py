"""The asynchronous comparison with every arm tuned alike (issue 43; `benchmarks/tuning.py`'s protocol).

    python -m benchmarks.asynchronous_tuned --find-regime --workers 2  # the plan of docs/benchmarks.md section 6
    python -m benchmarks.asynchronous_tuned --quick                    # smoke: tiny sizes, every arm and phase
    python -m benchmarks.asynchronous_tuned --resume FILE              # continue an interrupted run
    python -m benchmarks.asynchronous_tuned --summarize FILE           # tables and plots of a results file

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

import os
import sys
from dataclasses import asdict, dataclass

from . import asynchronous as bench
from . import tuned, tuning
from ._common import CACHE_DIR, toy_fingerprint

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


DESIGN = tuned.Design(name="asynchronous_tuned", level="staleness", levels="staleness", tune_level="tune_staleness",
                      regime_levels="regime_staleness", fresh=0, baseline=BASELINE, contrasts=CONTRASTS,
                      regularised={m: regularised(m) for m in bench.METHODS})


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


def check_settings(s: TunedSettings) -> None:
    tuned.check(DESIGN, s)


def report_jobs(s: TunedSettings, chosen: dict) -> list[tuple]:
    return tuned.report_jobs(DESIGN, s, chosen)


def regime_staleness(s: TunedSettings) -> list[int]:
    return tuned.regime_levels(DESIGN, s)


def tuned_run(s: TunedSettings, method: str, staleness: int, seed: int, setting: dict, phase: str) -> dict:
    """`asynchronous.train_one` at `setting` (learning rate, and beta for a KL arm), with the setting and its score
    (final held-out accuracy; None when the run diverged) added."""
    try:
        r = bench.train_one(s, method, staleness, seed, setting.get(tuning.BETA), phase, setting[tuning.LR])
        score = r["accuracy"][-1][1]
    except FloatingPointError as error:
        r, score = tuned.diverged_record(phase, method, "staleness", staleness, seed, error), None
    return {**r, "setting": dict(setting), "score": score}


final = tuned.final


def run(s: TunedSettings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    return tuned.run(DESIGN, s, tuned_run, settings_dict, log=log, json_path=json_path, previous=previous)


def summarize(s: TunedSettings, result: dict) -> dict:
    return tuned.summarize(DESIGN, s, result)


def settings_dict(s: TunedSettings) -> dict:
    d = asdict(s)
    for key in ("cache_dir", "output_dir", "toy_path", *_UNUSED):
        d.pop(key)
    d["toy_fingerprint"] = toy_fingerprint(s.toy_path)
    d["methods_config"] = {m: bench.METHODS[m] for m in s.methods}
    return d


def settings_from_dict(d: dict) -> TunedSettings:
    return tuned.settings_of(TunedSettings, d)


def markdown(result: dict) -> str:
    s = settings_from_dict(result["settings"])
    return tuned.markdown(DESIGN, s, result["summary"], (
        f"Tuned at staleness {s.tune_staleness} on seeds {list(s.tuning_seeds)} (budget {s.budget} runs per arm); "
        f"reported on seeds {list(s.reported_seeds)}; {s.max_steps} optimizer steps of {s.per_device_train_batch_size}"
        " completions, constant learning rate."))


def plot(result: dict, path: str) -> str | None:
    return tuned.plot(DESIGN, settings_from_dict(result["settings"]), result["summary"], path)

HEADING = "Asynchronous rollouts, tuned"


def sensitivity_title(s: TunedSettings) -> str:
    return f"Asynchronous toy, staleness {s.tune_staleness}: accuracy against the step size"


def main(argv=None):
    return tuned.cli(sys.modules[__name__], argv, "python -m benchmarks.asynchronous_tuned",
                     "also the tuned AsyncGRPO at staleness 16, 32, 64 against its fresh run")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
