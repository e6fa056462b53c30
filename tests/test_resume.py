"""A run killed with SIGKILL resumes from its last checkpoint and ends where an uninterrupted run ends.

Checkpoints fall inside a reused generation batch (save every 3 steps, 4 optimizer steps per generation batch),
where TRL alone loses the buffered batch and diverges; RPG saves it with the reference snapshot and schedule state.
"""

import os
import signal
import subprocess
import sys

import pytest
import torch
from _resume_script import make_trainer
from _tiny import save_tiny_model

from trl_rpg.run.checkpoint import MANIFEST_FILE, IncompleteCheckpoint, last_complete_checkpoint

SCRIPT = os.path.join(os.path.dirname(__file__), "_resume_script.py")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def run_killed(model, output_dir, reference, *flags):
    proc = subprocess.run([sys.executable, SCRIPT, model, str(output_dir), reference, *flags],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def trainable_state(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def assert_same_parameters(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("reference", ["sampling", "initial", "periodic", "adaptive"])
def test_sigkilled_run_resumes_to_the_uninterrupted_result(tmp_path, model_path, reference):
    full = make_trainer(model_path, tmp_path / "full", reference)
    full.train()
    full_losses = [h["loss"] for h in full.state.log_history if "loss" in h]

    run_killed(model_path, tmp_path / "killed", reference, "--kill-at-step", "5")
    assert last_complete_checkpoint(str(tmp_path / "killed")).endswith("checkpoint-3")
    resumed = make_trainer(model_path, tmp_path / "killed", reference)
    resumed.train(resume_from_checkpoint=True)
    resumed_losses = [h["loss"] for h in resumed.state.log_history if "loss" in h]

    assert_same_parameters(trainable_state(full), trainable_state(resumed))
    # the resumed log holds the checkpoint's history (steps 1-3) and the resumed steps 4-6
    assert len(full_losses) == 6
    assert resumed_losses[-3:] == pytest.approx(full_losses[3:], rel=1e-5, abs=1e-7)
    assert resumed.reference.updates == full.reference.updates
    if reference == "periodic":
        assert full.reference.updates == 3  # steps 2, 4, 6


@pytest.mark.parametrize("reference", ["periodic"])
def test_lora_run_resumes_with_its_reference_adapter(tmp_path, model_path, reference):
    full = make_trainer(model_path, tmp_path / "full", reference, lora=True)
    full.train()
    run_killed(model_path, tmp_path / "killed", reference, "--kill-at-step", "5", "--lora")
    resumed = make_trainer(model_path, tmp_path / "killed", reference, lora=True)
    resumed.train(resume_from_checkpoint=True)
    assert_same_parameters(trainable_state(full), trainable_state(resumed))
    ref = {n: p for n, p in resumed.model.named_parameters() if ".ref." in n}
    ref_full = {n: p for n, p in full.model.named_parameters() if ".ref." in n}
    assert ref and all(torch.equal(ref[n], ref_full[n]) for n in ref)


def test_checkpoint_interrupted_while_written_is_never_resumed(tmp_path, model_path):
    out = tmp_path / "run"
    run_killed(model_path, out, "periodic", "--kill-in-save", "6")
    half = out / "checkpoint-6"
    assert half.is_dir() and not (half / MANIFEST_FILE).exists()  # model written, RPG state not
    assert (out / "checkpoint-3" / MANIFEST_FILE).exists()
    assert last_complete_checkpoint(str(out)).endswith("checkpoint-3")

    trainer = make_trainer(model_path, out, "periodic")
    with pytest.raises(IncompleteCheckpoint, match="not a complete RPG checkpoint: it was interrupted while being"):
        trainer.train(resume_from_checkpoint=str(half))
    trainer.train(resume_from_checkpoint=True)  # picks checkpoint-3 and finishes
    assert trainer.state.global_step == 6
