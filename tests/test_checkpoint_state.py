"""RPG's own counters continue across a resume: `rpg/skipped_steps` carries on from the count the checkpoint saved."""

import pytest
from _resume_script import make_trainer
from _tiny import save_tiny_model

from trl_rpg.run import gradient_guard

#: Optimizer steps whose gradient the guard is made to refuse (one before the step-3 checkpoint, one after).
SKIPPED = {2, 5}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def skipped_steps_logged(trainer):
    return {h["step"]: h["rpg/skipped_steps"] for h in trainer.state.log_history if "rpg/skipped_steps" in h}


def test_skipped_steps_carry_on_from_the_saved_count(model_path, tmp_path, monkeypatch):
    current = {}
    monkeypatch.setattr(gradient_guard, "should_skip",
                        lambda *args: current["trainer"].state.global_step + 1 in SKIPPED)
    full = current["trainer"] = make_trainer(model_path, tmp_path / "run", "periodic")
    full.train()
    assert skipped_steps_logged(full) == {2: 1.0, 5: 2.0}

    resumed = current["trainer"] = make_trainer(model_path, tmp_path / "run", "periodic")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-3"))
    assert resumed.skipped_steps == 2
    assert skipped_steps_logged(resumed) == {2: 1.0, 5: 2.0}  # step 5 counts the skip saved at step 3
