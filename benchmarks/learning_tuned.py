"""The synchronous comparison under batch reuse with every arm tuned alike (issue 43; `benchmarks/tuning.py`).

    python -m benchmarks.learning_tuned --find-regime --workers 2  # the plan of docs/benchmarks.md section 1
    python -m benchmarks.learning_tuned --quick                    # smoke: tiny sizes, every arm and phase
    python -m benchmarks.learning_tuned --resume FILE              # continue an interrupted run
    python -m benchmarks.learning_tuned --summarize FILE           # tables and plots of a results file

Arms (`benchmarks/learning.py`'s methods and training function, SFT start per seed): GRPO as TRL ships it (k3 towards
the initial model, IS-weighted: `use_bias_correction_kl=True`); GRPO with `use_bias_correction_kl=False` (GRPO's k3
as the paper's contribution iii criticises it); DAPO (no KL; its learning rate alone is tuned); RPG-REINFORCE URKL
and UFKL (RPG-Style Clip, reference = sampler, the settings of `learning.RPG_COMMON`).

Every run takes `steps` optimizer steps of the same completions per step, so every run sees the same number of
samples; the batch reuse r (TRL's `steps_per_generation`) sets how old they are: a generation batch of r steps'
completions, the last step's drawn r - 1 optimizer steps before it trains. Reuse 1 is fresh.

1. **Tune** at reuse `tune_reuse` (16) on the tuning seeds: every arm's learning rate, the KL arms' beta, the same
   budget each, edges extended.
2. **Report** each arm's tuned setting at reuse 4 and 16 on the reported seeds (12, disjoint from the tuning seeds),
   paired by seed against GRPO, and the contrasts that isolate RPG's parts.
3. **Find the regime** (`--find-regime`): the tuned GRPO at reuse 32 and 48 (and 4, 16) against its fresh run
   (reuse 1): where it loses at least `regime_drop` (0.10), off-policy data hurts a tuned baseline.

Saved after every run; `--resume` runs only what is missing.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import asdict, dataclass

from . import learning as bench
from . import tuned
from ._common import CACHE_DIR, toy_fingerprint

ARMS = ("GRPO", "GRPO k3 unweighted", "DAPO", "RPG-REINFORCE-URKL", "RPG-REINFORCE-UFKL")
BASELINE = "GRPO"
CONTRASTS = (("RPG-REINFORCE-URKL", "GRPO k3 unweighted"),  # RPG's exact off-policy KL gradient against GRPO's k3
             ("RPG-REINFORCE-UFKL", "GRPO k3 unweighted"),
             ("GRPO", "GRPO k3 unweighted"),  # TRL's importance weight on the k3 term
             ("RPG-REINFORCE-URKL", "DAPO"))  # DAPO: the same clip-higher, no KL


def regularised(method: str) -> bool:
    """Whether an arm has a beta to tune: its KL coefficient is not fixed at 0 (RPG's comes from RPG_COMMON)."""
    spec = bench.METHODS[method]
    return spec.get("beta", bench.RPG_COMMON["beta"] if spec["trainer"] == "rpg" else 0.0) != 0.0


DESIGN = tuned.Design(name="learning_tuned", level="reuse", levels="reuse_levels", tune_level="tune_reuse",
                      regime_levels="regime_reuse", fresh=1, baseline=BASELINE, contrasts=CONTRASTS,
                      regularised={m: regularised(m) for m in bench.METHODS})


@dataclass
class TunedSettings(bench.Settings):
    methods: tuple = ARMS
    steps: int = 96  # optimizer steps of every run, whatever its reuse (a multiple of every reuse level)
    reuse_levels: tuple = (4, 16)
    tune_reuse: int = 16
    regime_reuse: tuple = (32, 48)
    tuning_seeds: tuple = (100, 101)
    reported_seeds: tuple = tuple(range(12))
    learning_rates: tuple = (1.5e-4, 3e-4, 6e-4)  # 3e-4 the section's; 1e-3 collapsed every method in trial runs
    lr_factor: float = 2.0
    tune_betas: tuple = (0.01, 0.04, 0.16)  # 0.04 the section's (the DeepSeekMath / former TRL GRPO default)
    beta_factor: float = 4.0
    budget: int = 32
    min_reported_seeds: int = 12
    find_regime: bool = False
    regime_drop: float = 0.10
    collapse_drop: float = 0.10
    smoke: bool = False
    output_dir: str = os.path.join(CACHE_DIR, "runs-tuned")


FULL = TunedSettings()
QUICK = TunedSettings(steps=4, reuse_levels=(2,), tune_reuse=2, regime_reuse=(4,), per_device_train_batch_size=8,
                      num_generations=4, eval_problems=16, eval_every=2, sft_steps=20, num_train_problems=64,
                      tuning_seeds=(100,), reported_seeds=(0,), min_reported_seeds=1, learning_rates=(1.5e-4, 3e-4),
                      tune_betas=(0.04, 0.16), budget=4, find_regime=True, workers=1, smoke=True)
_UNUSED = ("seeds", "generation_batches", "reuse", "learning_rate", "target_accuracy")
HEADING = "Learning under batch reuse, tuned"


def check_settings(s: TunedSettings) -> None:
    levels = {*s.reuse_levels, s.tune_reuse, *s.regime_reuse, DESIGN.fresh}
    bad = sorted(r for r in levels if not (isinstance(r, int) and r >= 1 and s.steps % r == 0))
    if bad:
        raise ValueError(f"reuse levels must be positive integers dividing steps ({s.steps}); got {bad}")
    tuned.check(DESIGN, s)


def at_reuse(s: TunedSettings, reuse: int) -> TunedSettings:
    """The settings of a run at `reuse`: `steps` optimizer steps in `steps / reuse` generation batches."""
    return dataclasses.replace(s, reuse=reuse, generation_batches=s.steps // reuse)


def tuned_run(s: TunedSettings, method: str, reuse: int, seed: int, setting: dict, phase: str) -> dict:
    """`learning.train_one` at `reuse` and `setting` (learning rate, and beta for a KL arm), with the phase, the reuse,
    the setting and its score (final held-out accuracy; None when the run diverged) added."""
    try:
        r = bench.train_one(at_reuse(s, reuse), method, seed, dict(setting))
        score = r["accuracy"][-1][1]
    except FloatingPointError as error:
        r, score = tuned.diverged_record(phase, method, "reuse", reuse, seed, error), None
    return {**r, "phase": phase, "reuse": reuse, "setting": dict(setting), "score": score}


def run(s: TunedSettings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    check_settings(s)
    return tuned.run(DESIGN, s, tuned_run, settings_dict, log=log, json_path=json_path, previous=previous)


def summarize(s: TunedSettings, result: dict) -> dict:
    return tuned.summarize(DESIGN, s, result)


def settings_dict(s: TunedSettings) -> dict:
    d = asdict(s)
    for key in ("cache_dir", "output_dir", "toy_path", *_UNUSED):
        d.pop(key)
    d["toy_fingerprint"] = toy_fingerprint(s.toy_path)
    d["methods_config"] = {m: bench.METHODS[m] for m in s.methods}
    d["rpg_common"] = dict(bench.RPG_COMMON)
    return d


def settings_from_dict(d: dict) -> TunedSettings:
    return tuned.settings_of(TunedSettings, d)


def markdown(result: dict) -> str:
    s = settings_from_dict(result["settings"])
    return tuned.markdown(DESIGN, s, result["summary"], (
        f"Tuned at reuse {s.tune_reuse} on seeds {list(s.tuning_seeds)} (budget {s.budget} runs per arm); reported "
        f"on seeds {list(s.reported_seeds)}; {s.steps} optimizer steps of {s.per_device_train_batch_size} completions "
        "in every run."))


def plot(result: dict, path: str) -> str | None:
    return tuned.plot(DESIGN, settings_from_dict(result["settings"]), result["summary"], path)


def sensitivity_title(s: TunedSettings) -> str:
    return f"Synchronous toy, batch reuse {s.tune_reuse}: accuracy against the step size"


def main(argv=None):
    return tuned.cli(sys.modules[__name__], argv, "python -m benchmarks.learning_tuned",
                     "also the tuned GRPO at reuse 32 and 48 against its fresh run (reuse 1)")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
