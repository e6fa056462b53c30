"""Hub uploads that fail loudly (issue 35, sections 1 and 2): every upload's result is read, a checkpoint is kept until
its upload is done, the last checkpoint is pushed at the end, a checkpoint's manifest is uploaded last in a commit of
its own, and the final wait is bounded. The Hub is `_fake_hub.FakeHub` (no network); transformers' own push
machinery (`Trainer._push_from_checkpoint`, `hub_strategy`, `hub_always_push`) runs unchanged around it."""

import json
import logging
import os
import signal

import pytest
import torch
from _fake_hub import FakeHub, service_unavailable
from _resume_script import make_trainer
from _tiny import save_tiny_model
from safetensors.torch import load_file
from transformers import TrainerCallback

from trl_rpg.run.checkpoint import MANIFEST_FILE
from trl_rpg.run.hub_uploads import HubUploadError, upload_checkpoint


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    fake = FakeHub(tmp_path).install(monkeypatch)
    yield fake
    fake.gate.set()  # an upload held "forever" returns when the test ends


def pushing_trainer(model_path, out, strategy, **overrides):
    settings = dict(push_to_hub=True, hub_model_id="me/rpg", hub_strategy=strategy, save_steps=1,
                    steps_per_generation=2)
    return make_trainer(model_path, out, "sampling", **{**settings, **overrides})


def test_every_upload_failing_warns_with_the_cause_and_fails_the_runs_end(model_path, tmp_path, hub, caplog):
    """A 503 on every upload: each failure is a warning with its cause, the last checkpoint is pushed once more at the
    end, and train() raises saying the final state never reached the Hub; the checkpoint is kept locally and the final
    model saved to output_dir, as the script's own save would have."""
    hub.fail = service_unavailable()
    out = tmp_path / "run"
    trainer = pushing_trainer(model_path, out, "checkpoint", max_steps=2)
    with caplog.at_level(logging.WARNING, logger="trl_rpg.run.hub_uploads"):
        with pytest.raises(HubUploadError) as error:
            trainer.train()
    message = str(error.value)
    assert "the last checkpoint of the run, step 2, did not reach the Hub (me/rpg)" in message
    assert "the upload of checkpoint-2 (to last-checkpoint/) failed: HfHubHTTPError: 503 Server Error" in message
    assert "no upload of this run succeeded" in message and str(out / "checkpoint-2") in message
    warned = [r.getMessage() for r in caplog.records if "failed: HfHubHTTPError: 503" in r.getMessage()]
    assert any("the model of step 1" in w for w in warned) and any("checkpoint-2 (to last-checkpoint/)" in w
                                                                     for w in warned)
    assert "pushing the last checkpoint" in caplog.text and not hub.commits
    assert (out / "checkpoint-2" / MANIFEST_FILE).is_file()
    assert f"The final model is saved in {out}." in message


def test_hub_strategy_end_uploads_nothing_while_training_and_push_to_hub_uploads_the_model(model_path, tmp_path, hub):
    """transformers' "end" strategy: no upload at the saves, no verdict at the end; `push_to_hub()` uploads
    `output_dir` (the lock file, released by then and named `_...`, never goes with it); a 503 there is raised."""
    trainer = pushing_trainer(model_path, tmp_path / "run", "end", max_steps=1)
    trainer.train()
    assert hub.commits == []
    trainer.push_to_hub()
    assert [(kind, path) for kind, path, _, _ in hub.commits] == [("folder", "")]
    assert "model.safetensors" in hub.commits[0][2] and not any(f.startswith("_") for f in hub.commits[0][2])
    hub.fail = service_unavailable()
    with pytest.raises(Exception, match="503 Server Error"):
        trainer.push_to_hub()


def test_slow_uploads_keep_their_checkpoint_and_the_hub_gets_the_last_one_manifest_last(model_path, tmp_path, hub,
                                                                                        caplog):
    """save_total_limit=1 and uploads held until training ends: checkpoint-1 is kept while its upload waits (rotation
    would have deleted it at step 2), steps 2 and 3 are not pushed at their saves (transformers' rule while an upload
    runs), and the last checkpoint is pushed at the end: `last-checkpoint/` holds exactly checkpoint-3's files, and
    only checkpoint-3 is left locally. Every checkpoint upload is a folder commit without the manifest, which deletes
    the previous manifest, then the manifest alone."""
    hub.gate.clear()
    out = tmp_path / "run"
    seen = {}

    def folders():
        return sorted(p for p in os.listdir(out) if p.startswith("checkpoint-"))

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen[state.global_step] = folders()

        def on_train_end(self, args, state, control, **kwargs):  # transformers' final wait comes next
            seen["end"], seen["commits"] = folders(), list(hub.commits)
            hub.gate.set()

    trainer = pushing_trainer(model_path, out, "checkpoint", max_steps=3, save_total_limit=1)
    trainer.add_callback(Watch())
    with caplog.at_level(logging.WARNING, logger="trl_rpg.run.hub_uploads"):
        trainer.train()
    assert seen[3] == ["checkpoint-1", "checkpoint-2"] and seen["end"] == ["checkpoint-1", "checkpoint-3"]
    assert seen["commits"] == [] and "transformers skipped its upload while an earlier one was running" in caplog.text
    assert folders() == ["checkpoint-3"]
    pushed = hub.repo / "last-checkpoint"
    assert json.loads((pushed / MANIFEST_FILE).read_text())["global_step"] == 3
    assert sorted(os.listdir(pushed)) == sorted(os.listdir(out / "checkpoint-3"))
    checkpoint_commits = [c for c in hub.commits if c[1].startswith("last-checkpoint")]
    assert len(checkpoint_commits) == 4  # checkpoint-1 and checkpoint-3, two commits each
    for folder, manifest in zip(checkpoint_commits[::2], checkpoint_commits[1::2]):
        assert folder[0] == "folder" and MANIFEST_FILE not in folder[2]
        assert manifest == ("file", f"last-checkpoint/{MANIFEST_FILE}", [MANIFEST_FILE], [])
    assert MANIFEST_FILE in checkpoint_commits[2][3]  # checkpoint-1's manifest deleted in checkpoint-3's first commit


def test_an_upload_that_never_returns_ends_the_final_wait_naming_it(model_path, tmp_path, hub):
    """Step 1's upload never returns, step 2's push is skipped behind it: the final wait ends after
    rpg_hub_upload_timeout naming the upload, and output_dir holds the final model (step 2), not the copy of step 1's
    that transformers' push left there."""
    hub.gate.clear()  # never released during the run
    out = tmp_path / "run"
    trainer = pushing_trainer(model_path, out, "every_save", max_steps=2, rpg_hub_upload_timeout=1.0)

    class Hung(Exception):  # not a TimeoutError, which the bounded wait itself handles
        pass

    def hung(signum, frame):
        raise Hung("train() still waits for the upload after 120 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)  # a hang guard only
    try:
        with pytest.raises(HubUploadError, match=r"after waiting 1 s \(rpg_hub_upload_timeout\) these uploads are "
                                                 r"still running: the model of step 1 \(step 1\)"):
            trainer.train()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    saved = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(saved[name], p.detach()) for name, p in trainer.model.named_parameters())


def test_a_checkpoint_whose_files_failed_to_upload_never_gets_its_manifest(tmp_path):
    class Api:
        calls = []

        def upload_folder(self, **kwargs):
            self.calls.append(("folder", kwargs["ignore_patterns"], kwargs["delete_patterns"]))
            raise service_unavailable()

        def upload_file(self, **kwargs):
            self.calls.append(("file",))

    with pytest.raises(Exception, match="503"):
        upload_checkpoint(Api(), folder_path=str(tmp_path), path_in_repo="checkpoint-3", repo_id="me/rpg",
                          ignore_patterns=["_*"])
    assert Api.calls == [("folder", ["_*", MANIFEST_FILE], ["*"])]
