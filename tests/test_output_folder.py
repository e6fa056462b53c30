"""One output folder, one run: a run touches only its own checkpoints, and a checkpoint folder holds only what its
save wrote (issue 26, section 1).

Each run has an id (in `trainer_state.json`; a resumed run keeps the id of the checkpoint it resumes), recorded in
the writing marker and the manifest of every checkpoint it writes. A fresh run into an `output_dir` that holds
checkpoints warns naming them; rotation deletes only this run's checkpoints; `resume_from_checkpoint=True` resumes
the run that wrote last, never another run's higher-numbered checkpoint; a save into an existing `checkpoint-N`
folder empties it first (with a warning when another run's checkpoint is replaced), and resume refuses a file at the
top of a checkpoint folder that its manifest does not list.
"""

import logging
import os
import shutil

import pytest
from _resume_script import make_trainer, verified_checkpoint
from _tiny import save_tiny_model
from transformers import TrainerCallback

from trl_rpg.run import checkpoint as ckpt


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def other_run(tmp_path_factory, model_path):
    """Another run's finished output_dir: checkpoints 3 and 6 (the default of `make_trainer`)."""
    out = tmp_path_factory.mktemp("other") / "run"
    make_trainer(model_path, out, "periodic").train()
    return out


@pytest.fixture
def shared(tmp_path, other_run):
    out = tmp_path / "run"
    shutil.copytree(other_run, out)
    return out


def run_id(folder) -> str:
    return ckpt.read_manifest(str(folder))["run_id"]


def warnings_of(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


class CrashAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"crash at step {self.step}")


def test_a_fresh_run_warns_and_its_rotation_leaves_another_runs_checkpoints(model_path, shared, caplog):
    """save_total_limit=1, a fresh run into a folder holding another run's checkpoints 3 and 6: the Python API warns
    naming them, and rotation deletes none of them (only this run's own)."""
    other = run_id(shared / "checkpoint-6")
    with caplog.at_level(logging.WARNING):
        make_trainer(model_path, shared, "periodic", save_total_limit=1, max_steps=2, save_steps=1).train()
    text = warnings_of(caplog)
    assert "already holds 2 checkpoint(s) of another run (checkpoint-3, checkpoint-6)" in text
    assert sorted(os.listdir(shared)) == ["README.md", "checkpoint-2", "checkpoint-3", "checkpoint-6"]
    assert run_id(shared / "checkpoint-3") == run_id(shared / "checkpoint-6") == other
    assert run_id(shared / "checkpoint-2") != other  # two runs with the same settings are told apart


def test_resume_true_takes_this_runs_checkpoint_not_another_runs_higher_one(model_path, shared, caplog):
    """The other run left checkpoint-6; this run (same settings) saved 2 and 4 and crashed at step 5:
    resume_from_checkpoint=True resumes checkpoint-4, and the resumed run keeps its run id."""
    other = run_id(shared / "checkpoint-6")
    crashed = make_trainer(model_path, shared, "periodic", save_total_limit=2, save_steps=2)
    crashed.add_callback(CrashAt(5))
    with pytest.raises(RuntimeError, match="crash at step 5"):
        crashed.train()
    mine = run_id(shared / "checkpoint-4")
    assert mine != other and run_id(shared / "checkpoint-6") == other
    resumed = make_trainer(model_path, shared, "periodic", save_total_limit=2, save_steps=2)
    with caplog.at_level(logging.WARNING):
        assert verified_checkpoint(resumed, True).endswith("checkpoint-4")
    assert "checkpoint-3, checkpoint-6 (another run) are passed over" in warnings_of(caplog)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6 and run_id(shared / "checkpoint-6") == mine
    assert f"{shared / 'checkpoint-6'} held a checkpoint of another run" in warnings_of(caplog)
    kept = sorted(p for p in os.listdir(shared) if p.startswith("checkpoint-"))
    assert kept == ["checkpoint-3", "checkpoint-4", "checkpoint-6"]  # limit 2: this run's 2 deleted, not the other's 3
    assert run_id(shared / "checkpoint-3") == other


def test_a_checkpoint_folder_holds_only_what_its_save_wrote(model_path, shared):
    """A full fine-tuning run left checkpoint-3; a LoRA run writes checkpoint-3 in the same folder: the folder then
    holds the adapter and no stale model.safetensors (which transformers would load in preference to the adapter,
    certified by the new manifest)."""
    assert (shared / "checkpoint-3" / "model.safetensors").exists()
    make_trainer(model_path, shared, "periodic", lora=True, max_steps=3).train()
    folder = shared / "checkpoint-3"
    manifest = ckpt.read_manifest(str(folder))
    on_disk = {os.path.relpath(os.path.join(root, n), folder) for root, _, names in os.walk(folder) for n in names}
    assert on_disk == set(manifest["files"]) | {ckpt.MANIFEST_FILE}
    assert "model.safetensors" not in on_disk and "adapter_model.safetensors" in on_disk
    resumed = make_trainer(model_path, shared, "periodic", lora=True, max_steps=6)
    assert verified_checkpoint(resumed, True).endswith("checkpoint-3")


def test_a_weights_file_the_manifest_does_not_list_is_refused(model_path, other_run, tmp_path):
    """A file copied into a checkpoint after it was written (a sync, a Hub folder that kept an earlier upload's
    files) is refused naming it: transformers would read it in place of the checkpoint's own."""
    out = tmp_path / "run"
    make_trainer(model_path, out, "periodic", lora=True, max_steps=3).train()
    shutil.copy(other_run / "checkpoint-3" / "model.safetensors", out / "checkpoint-3" / "model.safetensors")
    resumed = make_trainer(model_path, out, "periodic", lora=True)
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors is not listed in the checkpoint's manifest"):
        resumed.train(resume_from_checkpoint=str(out / "checkpoint-3"))


def test_an_old_manifest_in_a_folder_being_rewritten_never_certifies_it(model_path, shared, monkeypatch):
    """Resumed from checkpoint-3, the run rewrites checkpoint-6, which a previous attempt completed; the rewrite
    fails midway: checkpoint-6 is then incomplete (its old manifest is gone) and resume_from_checkpoint=True takes
    checkpoint-3."""
    original = ckpt.save_state

    def failing(directory, state):
        if directory.endswith("checkpoint-6"):
            raise RuntimeError("interrupted")
        original(directory, state)

    monkeypatch.setattr(ckpt, "save_state", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        make_trainer(model_path, shared, "periodic").train(resume_from_checkpoint=str(shared / "checkpoint-3"))
    assert not ckpt.is_complete(str(shared / "checkpoint-6"))
    monkeypatch.setattr(ckpt, "save_state", original)
    assert verified_checkpoint(make_trainer(model_path, shared, "periodic"), True).endswith("checkpoint-3")
