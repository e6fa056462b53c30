"""GRPOTrainer then RPGTrainer, trained one after the other in one (multi-process) launch; launched by
tests/test_grpo_equivalence.py under `accelerate launch` (DDP, 2 CPU processes, gloo).

Usage: `accelerate launch ... equivalence_script.py SPEC.json`. SPEC holds:

    model_dir    local model directory (tests/_tiny.py `save_tiny_model`)
    output_dir   trainer output directories go below it
    result       prefix of the result files
    train_size   number of training prompts
    runs         list of {"name", "settings" (tests/_equivalence.py `base_settings` overrides), "rpg" (RPGConfig
                 overrides of the reduction's settings), "eval_size" (optional: prompts of an eval set),
                 "three_rewards" (optional: _equivalence.three_rewards instead of length_reward), "peft" (optional:
                 LoRA, _equivalence.lora_config)}

Each rank writes, per run and trainer (`grpo`, `rpg`), its trained parameters to
`<result>.<run>.<trainer>.rank<R>.safetensors`, and `<result>.rank<R>.json` with each trainer's logged losses.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for _equivalence.py and _tiny.py

from _equivalence import (  # noqa: E402
    FixedGRPOTrainer,
    FixedRPGTrainer,
    base_settings,
    config_pair,
    logged,
    lora_config,
    make_trainer,
    parameters,
    prompts,
    three_rewards,
)
from _processes import end_processes  # noqa: E402
from safetensors.torch import save_file  # noqa: E402


def run_pair(spec: dict, run: dict) -> tuple[dict, int]:
    from pathlib import Path

    settings = base_settings(ddp_backend="gloo", **run.get("settings", {}))
    grpo_args, rpg_args = config_pair(Path(spec["output_dir"]) / run["name"], settings, **run.get("rpg", {}))
    result = {}
    for kind, trainer_cls, args in (("grpo", FixedGRPOTrainer, grpo_args), ("rpg", FixedRPGTrainer, rpg_args)):
        eval_dataset = prompts(run["eval_size"], offset=50) if run.get("eval_size") else None
        extra = {"reward": three_rewards()} if run.get("three_rewards") else {}
        if run.get("peft"):
            extra["peft_config"] = lora_config()
        trainer = make_trainer(trainer_cls, spec["model_dir"], args, prompts(spec["train_size"]), eval_dataset,
                               **extra)
        trainer.train()
        rank = trainer.accelerator.process_index
        save_file(parameters(trainer), f"{spec['result']}.{run['name']}.{kind}.rank{rank}.safetensors")
        result[kind] = {"loss": logged(trainer, "loss"), "eval_loss": logged(trainer, "eval_loss"),
                        "entropy_coef": logged(trainer, "entropy_coef"),
                        "policy_loss": logged(trainer, "policy_loss"),
                        "mixed_precision": trainer.accelerator.mixed_precision,
                        "num_processes": trainer.accelerator.num_processes,
                        "clip_frac_high": logged(trainer, "rpg/clip_frac_high"),
                        "clip_frac_low": logged(trainer, "rpg/clip_frac_low")}
    return result, rank


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    results = {}
    for run in spec["runs"]:
        results[run["name"]], rank = run_pair(spec, run)
    with open(f"{spec['result']}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
    end_processes()  # only after a run that succeeded: a failed one exits at once
