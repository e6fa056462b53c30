"""The run guarantees RPGTrainer gives, in AsyncRPGTrainer (issue 44), on CPU with the stand-in rollout worker
(`trl_rpg.toy.async_rollouts`): one writer per output_dir (the same lock, `checkpoint.output_dir_lock`)."""

import os
import subprocess
import sys

import pytest
from _tiny import length_reward, save_tiny_model
from datasets import Dataset
from transformers import AutoTokenizer

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg._compat import async_trainer_on_cpu  # noqa: E402
from trl_rpg.checkpoint import LOCK_FILE, OutputDirBusy  # noqa: E402
from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention  # noqa: E402

GENERATIONS, BATCH, LENGTH = 4, 8, 6


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("async-guarantees") / "model"))


def prompts(n: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}] for i in range(n)]})


def async_args(output_dir, **overrides) -> AsyncRPGConfig:
    values = dict(output_dir=str(output_dir), per_device_train_batch_size=BATCH, num_generations=GENERATIONS,
                  max_completion_length=LENGTH, max_steps=2, learning_rate=1e-2, max_staleness=4, token_budget=0,
                  use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=0,
                  gradient_checkpointing=False, disable_tqdm=True, beta=0.1)
    values.update(overrides)
    return AsyncRPGConfig(**values)


def build(model_path, args) -> AsyncRPGTrainer:
    """An AsyncRPGTrainer with the CPU stand-in as rollout worker and weight transfer (build and train it inside
    `async_trainer_on_cpu(VarlenAttention)`)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    worker = StaleRolloutWorker(model_path, prompts(), length_reward, tokenizer, num_generations=GENERATIONS,
                                max_completion_length=LENGTH, staleness=1, seed=0,
                                groups_per_call=BATCH // GENERATIONS)
    return AsyncRPGTrainer(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts(),
                           processing_class=tokenizer, rollout_worker=worker, weight_transfer=worker)


# ---------------------------------------------------------------------------------------------------------------------
# One writer per output_dir
# ---------------------------------------------------------------------------------------------------------------------

HOLDER = """
import sys, time
from trl_rpg.checkpoint import output_dir_lock
with output_dir_lock(sys.argv[1], True, lambda values: values):
    print("held", flush=True)
    time.sleep(600)
"""


def test_another_live_run_holding_the_output_dir_refuses_the_run_before_anything_is_written(model_path, tmp_path):
    """Another live process holds the lock (taken with the public `output_dir_lock`): `train()` is refused with
    `OutputDirBusy` naming it, before any checkpoint is written; once it has ended, the run trains, holds the lock
    while training and releases it at the end."""
    out = tmp_path / "out"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert other.stdout.readline().strip() == "held"
        with async_trainer_on_cpu(VarlenAttention), pytest.raises(OutputDirBusy) as error:
            trainer = build(model_path, async_args(out, save_strategy="steps", save_steps=1))
            trainer.train()
        assert f"process {other.pid}" in str(error.value)
        assert sorted(os.listdir(out)) == [LOCK_FILE]  # no checkpoint, no file of this run
    finally:
        other.kill()
        other.wait()
    held = []
    trainer.add_callback(type("Holds", (__import__("transformers").TrainerCallback,), {
        "on_step_end": lambda self, args, state, control, **kw: held.append((out / LOCK_FILE).exists())})())
    with async_trainer_on_cpu(VarlenAttention):
        trainer.train()  # the lock of a process that is gone is replaced
    assert held == [True, True]
    assert not (out / LOCK_FILE).exists() and (out / "checkpoint-2").is_dir()
