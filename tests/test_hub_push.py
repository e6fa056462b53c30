"""Checkpoints pushed to the Hub resume (issue 28, section 1).

transformers queues the upload of a checkpoint inside its own save, before RPG's files and the manifest exist;
RPGTrainer queues it once the checkpoint is complete. The Hub is stubbed (`HfApi.create_repo`, `HfApi.upload_folder`,
no network): the stub copies what it is asked to upload at the moment it is asked (the earliest a real upload can
read the files), into a local "repository" folder; the uploaded checkpoint is then copied to a fresh folder and
resumed.
"""

import fnmatch
import os
import shutil
from concurrent.futures import Future

import pytest
from _resume_script import make_trainer
from _tiny import save_tiny_model
from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoUrl


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A stubbed Hub: returns the local folder that receives the uploads and the list of uploads (path_in_repo)."""
    repo, uploads = tmp_path / "hub_repo", []

    def create_repo(self, repo_id, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, ignore_patterns=None, **kwargs):
        uploads.append(path_in_repo or "")
        target = repo / (path_in_repo or "")
        for root, _, names in os.walk(folder_path):
            for name in names:
                relative = os.path.relpath(os.path.join(root, name), folder_path)
                if not any(fnmatch.fnmatch(relative, pattern) for pattern in ignore_patterns or []):
                    os.makedirs(target / os.path.dirname(relative), exist_ok=True)
                    shutil.copy(os.path.join(root, name), target / relative)
        done = Future()
        done.set_result(None)
        return done

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return repo, uploads


def resumes(model_path, uploaded, tmp_path) -> int:
    fresh = tmp_path / "downloaded" / os.path.basename(uploaded)
    shutil.copytree(uploaded, fresh)
    trainer = make_trainer(model_path, tmp_path / "resumed", "periodic", max_steps=7)
    trainer.train(resume_from_checkpoint=str(fresh))
    return trainer.state.global_step


@pytest.mark.parametrize(("strategy", "pushed"), [("checkpoint", ["last-checkpoint"]),
                                                  ("all_checkpoints", ["checkpoint-3", "checkpoint-6"])])
def test_a_pushed_checkpoint_resumes(model_path, tmp_path, hub, strategy, pushed):
    repo, uploads = hub
    make_trainer(model_path, tmp_path / "run", "periodic", push_to_hub=True, hub_model_id="me/rpg",
                 hub_strategy=strategy).train()
    assert [u for u in uploads if u] == (pushed * 2 if strategy == "checkpoint" else pushed)
    assert resumes(model_path, repo / pushed[-1], tmp_path) == 7


def test_every_save_pushes_the_model_at_each_save_and_no_checkpoint(model_path, tmp_path, hub):
    repo, uploads = hub
    make_trainer(model_path, tmp_path / "run", "periodic", push_to_hub=True, hub_model_id="me/rpg",
                 hub_strategy="every_save").train()
    assert uploads == ["", ""]  # the model (the output_dir, checkpoint folders excluded) at steps 3 and 6
    assert (repo / "model.safetensors").exists() and not any(p.startswith("checkpoint") for p in os.listdir(repo))
