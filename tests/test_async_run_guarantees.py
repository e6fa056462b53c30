"""The run guarantees RPGTrainer gives, in AsyncRPGTrainer (issue 44), on CPU with the stand-in rollout worker
(`trl_rpg.toy.async_rollouts`): one writer per output_dir (the same lock, `checkpoint.output_dir_lock`); every Hub
upload's result read, a failure ending the run in `HubUploadError` with the final model saved (`hub_uploads`); RPG's
manifest in every checkpoint, verified before a resume reads anything (`checkpoint.resume_checkpoint`)."""

import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from _fake_hub import FakeHub, service_unavailable
from _tiny import length_reward, save_tiny_model
from datasets import Dataset
from transformers import AutoTokenizer

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg._compat import async_trainer_on_cpu  # noqa: E402
from trl_rpg.run.checkpoint import LOCK_FILE, MANIFEST_FILE, CheckpointError, OutputDirBusy, read_manifest  # noqa: E402
from trl_rpg.run.checkpoint.lock import lock_files  # noqa: E402
from trl_rpg.run.hub_uploads import HubUploadError  # noqa: E402
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


def build(model_path, args, staleness: int = 1) -> AsyncRPGTrainer:
    """An AsyncRPGTrainer with the CPU stand-in as rollout worker and weight transfer (build and train it inside
    `async_trainer_on_cpu(VarlenAttention)`)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    worker = StaleRolloutWorker(model_path, prompts(), length_reward, tokenizer, num_generations=GENERATIONS,
                                max_completion_length=LENGTH, staleness=staleness, seed=0,
                                groups_per_call=BATCH // GENERATIONS)
    return AsyncRPGTrainer(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts(),
                           processing_class=tokenizer, rollout_worker=worker, weight_transfer=worker)


# ---------------------------------------------------------------------------------------------------------------------
# One writer per output_dir
# ---------------------------------------------------------------------------------------------------------------------

HOLDER = """
import sys, time
from trl_rpg.run.checkpoint import output_dir_lock
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
        assert [name for name in os.listdir(out) if not name.startswith(LOCK_FILE + ".")] == []  # only the holder's
    finally:
        other.kill()
        other.wait()
    held = []
    trainer.add_callback(type("Holds", (__import__("transformers").TrainerCallback,), {
        "on_step_end": lambda self, args, state, control, **kw: held.append(bool(lock_files(str(out))))})())
    with async_trainer_on_cpu(VarlenAttention):
        trainer.train()  # the lock of a process that is gone is replaced
    assert held == [True, True]
    assert not lock_files(str(out)) and (out / "checkpoint-2").is_dir()


# ---------------------------------------------------------------------------------------------------------------------
# Hub uploads: each result read, a failure ends the run in HubUploadError with the final model saved
# ---------------------------------------------------------------------------------------------------------------------


def test_failed_hub_uploads_end_the_run_in_hub_upload_error_with_the_final_model_saved(model_path, tmp_path,
                                                                                      monkeypatch, caplog):
    """Every upload answers 503 (the fake Hub): each failure is a warning with its cause, the last checkpoint is
    pushed once more at the end, and `train()` raises `HubUploadError` naming it; the final model is saved to
    output_dir and the checkpoint kept locally, complete."""
    hub = FakeHub(tmp_path).install(monkeypatch)
    hub.fail = service_unavailable()
    out = tmp_path / "run"
    with async_trainer_on_cpu(VarlenAttention):
        trainer = build(model_path, async_args(out, save_strategy="steps", save_steps=1, push_to_hub=True,
                                               hub_model_id="me/rpg", hub_strategy="checkpoint"))
        with caplog.at_level(logging.WARNING, logger="trl_rpg.run.hub_uploads"), \
                pytest.raises(HubUploadError) as error:
            trainer.train()
    message = str(error.value)
    assert message.startswith("AsyncRPGTrainer: the last checkpoint of the run, step 2, did not reach the Hub "
                              "(me/rpg)")
    assert "failed: HfHubHTTPError: 503 Server Error" in message
    assert message.endswith(f"The final model is saved in {out}.")
    assert "AsyncRPGTrainer: pushing the last checkpoint" in caplog.text and not hub.commits
    assert "AsyncRPGTrainer: the Hub upload of" in caplog.text
    assert (out / "model.safetensors").is_file() and (out / "checkpoint-2" / MANIFEST_FILE).is_file()


# ---------------------------------------------------------------------------------------------------------------------
# Verified resume: RPG's manifest in every checkpoint, checked before anything is loaded
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(model_path, tmp_path_factory):
    """A two-step run saving after each step: checkpoint-1 and checkpoint-2 (kept pristine; tests copy them)."""
    out = tmp_path_factory.mktemp("saved") / "out"
    with async_trainer_on_cpu(VarlenAttention):
        build(model_path, async_args(out, save_strategy="steps", save_steps=1)).train()
    return out


def copy_run(saved_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(saved_run, out)
    return out


def test_every_checkpoint_carries_rpgs_manifest(saved_run):
    for step in (1, 2):
        manifest = read_manifest(str(saved_run / f"checkpoint-{step}"))
        assert manifest["global_step"] == step and "optimizer.pt" in manifest["files"]
        assert manifest["run"]["rpg_reference"] == "sampling"


@pytest.mark.parametrize("damage", ["missing", "truncated", "changed"])
def test_a_checkpoint_whose_optimizer_is_not_whole_is_refused_before_anything_loads(model_path, saved_run, tmp_path,
                                                                                    damage):
    out = copy_run(saved_run, tmp_path)
    optimizer = out / "checkpoint-2" / "optimizer.pt"
    if damage == "missing":
        optimizer.unlink()
    elif damage == "truncated":
        optimizer.write_bytes(optimizer.read_bytes()[:100])
    else:  # the same size, one byte changed
        data = bytearray(optimizer.read_bytes())
        data[len(data) // 2] ^= 0xFF
        optimizer.write_bytes(bytes(data))
    with async_trainer_on_cpu(VarlenAttention):
        trainer = build(model_path, async_args(out, save_strategy="steps", save_steps=1, max_steps=3))
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        loads = []
        trainer._load_from_checkpoint = lambda *a, **kw: loads.append(a)  # nothing may be read from the folder
        with pytest.raises(CheckpointError, match="optimizer.pt"):
            trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert not loads and trainer.state.global_step == 0
    assert all(torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())
    assert sorted(os.listdir(out)) == ["checkpoint-1", "checkpoint-2"]  # nothing written, the lock released


def test_a_whole_checkpoint_resumes_and_a_damaged_newest_is_passed_over(model_path, saved_run, tmp_path, caplog):
    """`resume_from_checkpoint=True` passes over the damaged newest checkpoint, with a warning naming why, and
    resumes the complete one before it: the run continues from its step."""
    out = copy_run(saved_run, tmp_path)
    (out / "checkpoint-2" / "optimizer.pt").unlink()
    with async_trainer_on_cpu(VarlenAttention):
        trainer = build(model_path, async_args(out, save_strategy="steps", save_steps=1, max_steps=3))
        with caplog.at_level(logging.WARNING):
            trainer.train(resume_from_checkpoint=True)
    assert "Not resuming from" in caplog.text and "checkpoint-2" in caplog.text
    assert "resuming from" in caplog.text and str(out / "checkpoint-1") in caplog.text
    assert trainer.state.global_step == 3
    assert read_manifest(str(out / "checkpoint-3"))["global_step"] == 3


# ---------------------------------------------------------------------------------------------------------------------
# docs/asynchronous.md: beta = 0 and no dual clip trains to AsyncGRPO's parameters only with equal clip widths
# ---------------------------------------------------------------------------------------------------------------------


def test_the_default_clip_widths_differ_from_async_grpos(model_path, tmp_path):
    """`AsyncRPGConfig(beta=0, rpg_dual_clip_c=None)` keeps the paper's epsilon_high 0.28, `AsyncGRPOConfig` a
    symmetric 0.2: on the same samples (the setting of test_async_trainer's equivalence test, where equal widths give
    the same parameters) the parameters differ, as docs/asynchronous.md says."""
    common = dict(max_steps=4, learning_rate=3e-2, gradient_accumulation_steps=2, beta=0.0, rpg_dual_clip_c=None)
    trained = {}
    for widths in ({}, dict(epsilon=0.2)):  # the defaults (0.2, 0.28); AsyncGRPOConfig's (0.2, 0.2)
        args = async_args(tmp_path / str(len(widths)), **common, **widths)
        assert (args.epsilon, args.epsilon_high) == ((0.2, 0.28) if not widths else (0.2, 0.2))
        with async_trainer_on_cpu(VarlenAttention):
            trainer = build(model_path, args, staleness=2)
            trainer.train()
        trained[len(widths)] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    difference = max((trained[0][n] - p).abs().max().item() for n, p in trained[1].items())
    print(f"max parameter difference, default widths vs AsyncGRPO's: {difference:.3f}")
    assert difference > 1e-2
