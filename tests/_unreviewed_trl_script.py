"""Run by tests/test_upgrade_check.py in a fresh process whose `sys.path` starts with a changed copy of TRL: build and
train RPGTrainers on it, and print what happened as one JSON line.

1. an RPGTrainer is built (the guard asks the self-check, which runs in its own fresh process) and trains 1 step;
2. a second one is built (the verdict is read from the cache: the self-check does not run again);
3. a config setting TRL's new field to another value than its default is refused.
"""

import json
import logging
import sys
import warnings

import trl
from datasets import Dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.toy import build_model, build_tokenizer
from trl_rpg.upgrade import guard as upgrade_guard


class _Count(logging.Handler):
    """Counts the verdict module's "checking the installed trl ..." line: once per self-check run."""

    runs = 0

    def emit(self, record):
        _Count.runs += "with the upgrade self-check" in record.getMessage()


def build(output_dir, **overrides):
    tokenizer = build_tokenizer()
    args = RPGConfig(output_dir=output_dir, per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                     max_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
                     logging_steps=1, disable_tqdm=True, **overrides)
    return RPGTrainer(model=build_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2), args=args,
                      reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                      train_dataset=Dataset.from_dict({"prompt": ["1+2", "3+4", "5-2", "9-6"]}),
                      processing_class=tokenizer)


def main(output_dir: str) -> None:
    logging.getLogger("trl_rpg.upgrade.verdict").addHandler(_Count())
    report = {"trl_file": trl.__file__}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = build(output_dir)
        trainer.train()
        report["global_step"] = trainer.state.global_step
        build(output_dir)
    report["warnings"] = [str(w.message) for w in caught if "upgrade self-check" in str(w.message)]
    report["self_check_runs"] = _Count.runs
    try:
        build(output_dir, kl_log_ratio_clip=5.0)
        report["refused"] = None
    except upgrade_guard.UnreviewedUpgrade as error:
        report["refused"] = str(error)
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
