"""The real-model asynchronous comparison with every arm tuned alike (issue 43, item 4; `benchmarks/tuning.py`).

    python -m benchmarks.smollm2_async_tuned --workers 2       # the plan of docs/benchmarks.md section 7
    python -m benchmarks.smollm2_async_tuned --quick           # smoke: tiny sizes, every arm and phase
    python -m benchmarks.smollm2_async_tuned --resume FILE     # continue an interrupted run
    python -m benchmarks.smollm2_async_tuned --summarize FILE  # tables and plots of a results file

The asynchronous arms of `asynchronous_tuned.py` (AsyncGRPO; + GRPO's k3 towards the sampler, unweighted and
IS-weighted; AsyncRPG URKL and UFKL; AsyncRPG at beta 0) on SmolLM2-135M-Instruct with the demo's LoRA, trained by
TRL's asynchronous trainer on CPU with the stale rollout worker (`trl_rpg.toy.async_rollouts.StaleRolloutWorker`:
every sample exactly s versions old; it holds only the s + 1 newest versions, each the whole merged weights). The
task is `smollm2_tuned.py`'s: two-digit sums, replies of up to 32 tokens, sampling at temperature 0.7; the score is
the held-out accuracy sampled at 0.7 at the end of the run (4 replies per problem), the greedy one kept.

1. **Tune** at staleness `tune_staleness` (8) on the tuning seeds: every arm's constant learning rate, the KL arms'
   beta, the same budget each, edges extended.
2. **Report** each arm's tuned setting at staleness 0 and 8 on the reported seeds (6, disjoint from the tuning
   seeds), paired by seed against AsyncGRPO and in the contrasts that isolate RPG's parts.

Each seed's start is measured once. Saved after every run; `--resume` runs only what is missing.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from . import asynchronous, smollm2_tuned, tuned
from ._common import CACHE_DIR, init_worker
from .asynchronous_tuned import ARMS, BASELINE, CONTRASTS, regularised

DESIGN = tuned.Design(name="smollm2_async_tuned", level="staleness", levels="staleness", tune_level="tune_staleness",
                      regime_levels="regime_staleness", fresh=0, baseline=BASELINE, contrasts=CONTRASTS,
                      regularised={m: regularised(m) for m in asynchronous.METHODS}, prepare=smollm2_tuned.prepare,
                      tasks_per_worker=1)  # a fresh process per run: a real model's run does not give its memory back


@dataclass
class TunedSettings:
    methods: tuple = ARMS
    staleness: tuple = (0, 8)
    tune_staleness: int = 8
    regime_staleness: tuple = ()
    max_steps: int = 32
    per_device_train_batch_size: int = 16  # completions per optimizer step (2 prompts x 8), the demo's
    num_generations: int = 8
    operands: str = "two-digit"
    max_completion_length: int = 32
    temperature: float = 0.7
    eval_samples: int = 4
    train_prompts: int = 1000
    tuning_seeds: tuple = (100, 101)
    reported_seeds: tuple = tuple(range(6))
    learning_rates: tuple = (2.5e-4, 5e-4, 1e-3)  # constant; 5e-4 the demo's (LoRA)
    lr_factor: float = 2.0
    tune_betas: tuple = (0.03, 0.3)
    beta_factor: float = 3.0
    budget: int = 18  # the initial grid (12 runs) and one extension of either axis
    min_reported_seeds: int = 6
    find_regime: bool = False
    regime_drop: float = 0.10
    collapse_drop: float = 0.10
    smoke: bool = False
    workers: int = 2
    model_cache: str | None = None  # None: trl_rpg's cache folder
    output_dir: str = os.path.join(CACHE_DIR, "smollm2-runs-async-tuned")


FULL = TunedSettings()
QUICK = TunedSettings(max_steps=2, staleness=(0, 1), tune_staleness=1, eval_samples=1, tuning_seeds=(100,),
                      reported_seeds=(0,), min_reported_seeds=1, learning_rates=(2.5e-4, 5e-4), budget=4,
                      workers=1, smoke=True)
HEADING = "SmolLM2-135M-Instruct, asynchronous, tuned"
_LOG_KEYS = ("kl", "entropy", "rpg/w_mean", "rpg/w_max", "rpg/clip_frac_dual", "k3/term", "clip_ratio/region_mean",
             "sample/staleness_mean")


def check_settings(s: TunedSettings) -> None:
    from trl_rpg.smollm2.task import OPERANDS

    if s.operands not in OPERANDS:
        raise ValueError(f"operands must be one of {', '.join(OPERANDS)}; got {s.operands!r}")
    if s.per_device_train_batch_size % s.num_generations:
        raise ValueError(f"per_device_train_batch_size ({s.per_device_train_batch_size}) must be a multiple of "
                         f"num_generations ({s.num_generations})")
    tuned.check(DESIGN, s)


def run_config(s: TunedSettings, method: str, staleness: int, seed: int, setting: dict):
    """(trainer kind, config) of one run: the layout above, the arm's own fields, then `setting` (its learning rate,
    and beta for a KL arm)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from trl_rpg import AsyncRPGConfig

    from .k3_arms import AsyncGRPOWithK3Config

    spec = dict(asynchronous.METHODS[method])
    kind = spec.pop("trainer")
    tag = "".join(f"-{k}{v:g}" for k, v in sorted(setting.items()))
    out = os.path.join(s.output_dir, f"{method}-s{staleness}-seed{seed}{tag}".replace(" ", "_").replace("=", "")
                       .replace("+", "plus"))
    args = dict(output_dir=out, seed=seed, data_seed=seed, max_steps=s.max_steps,
                per_device_train_batch_size=s.per_device_train_batch_size, num_generations=s.num_generations,
                max_completion_length=s.max_completion_length, temperature=s.temperature,
                gradient_accumulation_steps=1, max_staleness=staleness, token_budget=0, use_cpu=True, bf16=False,
                report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
                log_level="error", gradient_checkpointing=False, **spec, **setting)
    return kind, {"rpg": AsyncRPGConfig, "k3": AsyncGRPOWithK3Config, "grpo": AsyncGRPOConfig}[kind](**args)


def train_one(s: TunedSettings, method: str, staleness: int, seed: int, setting: dict) -> dict:
    """One asynchronous run from the untrained model; its held-out accuracy at the end, the reward of each step and
    the means of the logged drift."""
    init_worker()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from trl_rpg import AsyncRPGTrainer
    from trl_rpg._compat import async_trainer_on_cpu
    from trl_rpg.cli.smollm2_demo import smollm2_lora
    from trl_rpg.smollm2 import prepare_smollm2, task
    from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention

    from .k3_arms import AsyncGRPOWithK3Trainer

    path = prepare_smollm2(s.model_cache)  # prepared by the driver: this only finds it
    kind, config = run_config(s, method, staleness, seed, setting)
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = task.make_dataset(s.train_prompts, seed=seed, operands=s.operands)
    worker = StaleRolloutWorker(path, data, task.arithmetic_reward, tokenizer, num_generations=s.num_generations,
                                max_completion_length=s.max_completion_length, temperature=s.temperature,
                                staleness=staleness, seed=seed,
                                groups_per_call=s.per_device_train_batch_size // s.num_generations,
                                keep_versions=staleness + 1)
    cls = {"rpg": AsyncRPGTrainer, "k3": AsyncGRPOWithK3Trainer, "grpo": AsyncGRPOTrainer}[kind]
    t0 = time.perf_counter()
    with async_trainer_on_cpu(VarlenAttention):
        trainer = cls(path, task.arithmetic_reward, config, data, tokenizer, rollout_worker=worker,
                      weight_transfer=worker, peft_config=smollm2_lora())
        trainer.remove_callback(PrinterCallback)  # the logs go to the results file
        trainer.train()
    train_s = time.perf_counter() - t0
    model = trainer.model.eval()
    with asynchronous.standard_attention(model):
        accuracy = task.evaluate(model, tokenizer, task.make_dataset(split="test", operands=s.operands),
                                 samples=s.eval_samples, temperature=s.temperature, seed=seed,
                                 max_completion_length=s.max_completion_length)
    logs = trainer.state.log_history
    means = {}
    for key in _LOG_KEYS:
        values = [row[key] for row in logs if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
        if values:
            means[key] = round(statistics.fmean(values), 6)
    return {"accuracy": (trainer.state.global_step, accuracy), "steps": trainer.state.global_step,
            "rewards": [round(row["reward"], 5) for row in logs if "reward" in row], "log_means": means,
            "train_s": round(train_s, 1), "total_s": round(time.perf_counter() - t0, 1)}


def tuned_run(s: TunedSettings, method: str, staleness: int, seed: int, setting: dict, phase: str) -> dict:
    """`train_one` with the phase, the level and the setting; `accuracy` is the sampled held-out accuracy (the score),
    `greedy` the greedy one, each as [(step, value)]."""
    try:
        r = train_one(s, method, staleness, seed, dict(setting))
    except FloatingPointError as error:
        return {**tuned.diverged_record(phase, method, "staleness", staleness, seed, error), "setting": dict(setting),
                "score": None}
    step, accuracy = r.pop("accuracy")
    return {"phase": phase, "method": method, "staleness": staleness, "seed": seed, "setting": dict(setting),
            "accuracy": [(step, accuracy["sampled"])], "greedy": [(step, accuracy["greedy"])],
            "score": accuracy["sampled"], **r}


def run(s: TunedSettings, log=print, json_path: str | None = None, previous: dict | None = None) -> dict:
    check_settings(s)
    return tuned.run(DESIGN, s, tuned_run, settings_dict, log=log, json_path=json_path, previous=previous)


def summarize(s: TunedSettings, result: dict) -> dict:
    return tuned.summarize(DESIGN, s, result)


def settings_dict(s: TunedSettings) -> dict:
    d = asdict(s)
    for key in ("output_dir", "model_cache"):
        d.pop(key)
    d["methods_config"] = {m: asynchronous.METHODS[m] for m in s.methods}
    return d


def settings_from_dict(d: dict) -> TunedSettings:
    return tuned.settings_of(TunedSettings, d)


def markdown(result: dict) -> str:
    s = settings_from_dict(result["settings"])
    return tuned.markdown(DESIGN, s, result["summary"], (
        f"SmolLM2-135M-Instruct, LoRA, asynchronous, {s.operands} sums; tuned at staleness {s.tune_staleness} on "
        f"seeds {list(s.tuning_seeds)} (budget {s.budget} runs per arm); reported on seeds {list(s.reported_seeds)}; "
        f"{s.max_steps} optimizer steps of {s.per_device_train_batch_size} completions, constant learning rate; "
        f"score: held-out accuracy sampled at T = {s.temperature:g} ({s.eval_samples} replies per problem)."))


def plot(result: dict, path: str) -> str | None:
    return tuned.plot(DESIGN, settings_from_dict(result["settings"]), result["summary"], path)


def sensitivity_title(s: TunedSettings) -> str:
    return (f"SmolLM2-135M-Instruct, asynchronous, {s.operands} sums, staleness {s.tune_staleness}:\n"
            "accuracy against the step size")


def main(argv=None):
    return tuned.cli(sys.modules[__name__], argv, "python -m benchmarks.smollm2_async_tuned",
                     "also the tuned AsyncGRPO at the regime staleness levels against its fresh run")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
