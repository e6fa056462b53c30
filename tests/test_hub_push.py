"""Checkpoints pushed to the Hub resume (issue 28, section 1).

transformers queues the upload of a checkpoint inside its own save, before RPG's files and the manifest exist;
RPGTrainer queues it once the checkpoint is complete. The Hub is stubbed (`_fake_hub.FakeHub`: `HfApi.create_repo`,
`upload_folder`, `upload_file`, no network): the stub copies what it is asked to upload into a local "repository"
folder; the uploaded checkpoint is then copied to a fresh folder and resumed.
"""

import os
import shutil

import pytest
from _fake_hub import FakeHub
from _resume_script import make_trainer
from _tiny import save_tiny_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A stubbed Hub (`_fake_hub.FakeHub`): returns the local folder that receives the uploads and the list of
    folder uploads (path_in_repo)."""
    fake = FakeHub(tmp_path).install(monkeypatch)

    class FolderUploads:
        def __iter__(self):
            return iter([path for kind, path, _, _ in fake.commits if kind == "folder"])

        def __eq__(self, other):
            return list(self) == other

    return fake.repo, FolderUploads()


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
