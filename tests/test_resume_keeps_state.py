"""A resume that would lose state says so (issue 26, section 2): a DeepSpeed checkpoint resumed without DeepSpeed
(or with another ZeRO stage) is refused naming how to resume it; a checkpoint resumed in another parameter dtype
warns that the weights are rounded.

The refusals are checked here on a one-process checkpoint whose manifest says which DeepSpeed stage wrote it; the
real ZeRO-2 and ZeRO-3 checkpoints of tests/test_distributed.py are checked there (the manifest records the stage,
and resuming them on one process without DeepSpeed is refused).
"""

import json
import logging
import shutil

import pytest
import torch
from _resume_script import make_trainer, verified_checkpoint
from _tiny import save_tiny_model

from trl_rpg.run import checkpoint as ckpt


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("finished") / "run"
    make_trainer(model_path, out, "periodic", max_steps=3).train()
    return out


@pytest.fixture
def run_copy(tmp_path, finished):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def written_under_zero(directory, stage):
    path = directory / ckpt.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["run"]["deepspeed_zero_stage"] = stage
    path.write_text(json.dumps(manifest))


def test_the_manifest_records_the_deepspeed_stage_and_the_parameter_dtypes(finished):
    run = ckpt.read_manifest(str(finished / "checkpoint-3"))["run"]
    assert run["deepspeed_zero_stage"] is None
    assert run["model"]["dtypes"] == {"float32": run["model"]["tensors"]}


@pytest.mark.parametrize("stage", [2, 3])
def test_a_zero_checkpoint_resumed_without_deepspeed_is_refused_naming_how_to_resume(model_path, run_copy, stage):
    """Without DeepSpeed, transformers finds no optimizer.pt and goes on with a fresh optimizer and schedule (the
    damage save_only_model=True does, which is refused too)."""
    directory = run_copy / "checkpoint-3"
    written_under_zero(directory, stage)
    trainer = make_trainer(model_path, run_copy, "periodic")
    with pytest.raises(ckpt.RunMismatch) as error:
        trainer.train(resume_from_checkpoint=str(directory))
    message = str(error.value)
    assert f"written under DeepSpeed ZeRO-{stage}; this run does not use DeepSpeed" in message
    assert f"deepspeed_zero{stage}.yaml" in message
    assert f"python -m deepspeed.utils.zero_to_fp32 {directory} OUTPUT_DIR --safe_serialization" in message


def test_a_plain_checkpoint_resumed_under_deepspeed_or_another_stage_is_refused(finished):
    directory = str(finished / "checkpoint-3")
    saved = ckpt.read_manifest(directory)["run"]
    with pytest.raises(ckpt.RunMismatch, match="written without DeepSpeed; this run uses DeepSpeed ZeRO-3"):
        ckpt.compare_runs(directory, saved, {**saved, "deepspeed_zero_stage": 3})
    with pytest.raises(ckpt.RunMismatch, match="written under DeepSpeed ZeRO-2; this run uses DeepSpeed ZeRO-3"):
        ckpt.compare_runs(directory, {**saved, "deepspeed_zero_stage": 2}, {**saved, "deepspeed_zero_stage": 3})


def test_resuming_a_float32_checkpoint_in_bfloat16_warns_that_the_weights_are_rounded(model_path, finished, caplog):
    trainer = make_trainer(model_path, finished, "periodic")
    trainer.model.to(torch.bfloat16)  # as dtype=bfloat16 in model_init_kwargs loads it
    with caplog.at_level(logging.WARNING):
        verified_checkpoint(trainer, str(finished / "checkpoint-3"))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "parameter dtypes float32 -> bfloat16 (the restored weights are rounded to bfloat16" in text


def test_a_zero_checkpoint_in_another_dtype_is_not_warned_about(finished):
    """Under DeepSpeed the optimizer keeps float32 master weights of its own, which it restores: nothing is rounded
    (and the engine casts the model to bf16 only after the checkpoint is verified)."""
    directory = str(finished / "checkpoint-3")
    saved = {**ckpt.read_manifest(directory)["run"], "deepspeed_zero_stage": 3}
    current = json.loads(json.dumps(saved))
    current["model"]["dtypes"] = {"bfloat16": saved["model"]["tensors"]}
    assert not any("dtype" in change for change in ckpt.compare_runs(directory, saved, current))
