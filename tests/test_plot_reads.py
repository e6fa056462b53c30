"""`trl-rpg plot` reads a run that is being written, and says which file is wrong otherwise (issue 35 sections 3
and 4): transformers writes `trainer_state.json` in place and rotation deletes checkpoints while a run goes on, so a
read that fails is tried again; a file that still fails is "being written" (it changed between reads) or truncated
or damaged (it read the same each time), named; a JSON list or `global_step: 1e999` is a clear error; the picture
replaces a symbolic link planted in its place instead of writing through it. The reads are made deterministic by
handing `read_run` the file's successive texts (no timing)."""

import json

import pytest

from trl_rpg import cli
from trl_rpg.evaluation import plots

STATE = {"global_step": 4, "log_history": [{"step": 4, "reward": 0.5}]}
WHOLE = json.dumps(STATE)


def _texts(*texts):
    """A `read` that returns `texts` one after the other (the last one again after that), and the paths read."""
    seen = []

    def read(path):
        seen.append(path)
        return texts[min(len(seen), len(texts)) - 1]

    return read, seen


def test_a_trainer_state_being_written_is_read_again(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(WHOLE)
    read, seen = _texts(WHOLE[:20], WHOLE[:40], WHOLE)  # transformers rewriting it in place
    pauses = []
    assert plots.read_run(str(path), read=read, pause=pauses.append) == (str(path), STATE)
    assert len(seen) == 3 and pauses == [plots.READ_PAUSE] * 2


def test_a_file_that_keeps_changing_is_said_to_be_being_written(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(WHOLE)
    read, _ = _texts(*(WHOLE[:n] for n in (10, 20, 30, 40, 50)))
    with pytest.raises(ValueError, match=rf"{path} is being written: it changed or vanished while it was read "
                                         r"\(5 reads"):
        plots.read_run(str(path), read=read, pause=lambda s: None)


def test_a_checkpoint_rotated_away_while_it_is_read_is_passed_for_the_newer_one(tmp_path):
    """The newest checkpoint is listed, then deleted by rotation before it is read: the next read lists again."""
    old = tmp_path / "checkpoint-2"
    old.mkdir()
    (old / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))

    def rotating(path):
        if "checkpoint-2" in path:  # the run saved checkpoint-4 and rotated checkpoint-2 away
            (tmp_path / "checkpoint-4").mkdir()
            (tmp_path / "checkpoint-4" / "trainer_state.json").write_text(WHOLE)
            (old / "trainer_state.json").unlink()
            old.rmdir()
            raise FileNotFoundError(path)
        return plots._read_text(path)

    state_path, state = plots.read_run(str(tmp_path), read=rotating, pause=lambda s: None)
    assert state_path == str(tmp_path / "checkpoint-4" / "trainer_state.json") and state == STATE


@pytest.mark.parametrize(("content", "said"), [
    (WHOLE[:-9], "cannot be read (JSONDecodeError: "),
    ("[1, 2]", "holds a JSON list, not a transformers trainer_state.json"),
    ('{"global_step": 1e999, "log_history": []}', "global_step is inf, not a step number"),
    ('{"global_step": 3, "log_history": [1, 2]}', "has no log_history list of logged entries"),
], ids=["truncated", "a_list", "global_step_1e999", "log_history_of_numbers"])
def test_a_file_that_is_no_trainer_state_is_one_error_line_naming_it(tmp_path, capsys, monkeypatch, content, said):
    monkeypatch.setattr(plots, "READ_PAUSE", 0.0)
    path = tmp_path / "trainer_state.json"
    path.write_text(content)
    assert cli.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"trl-rpg plot: error: {path}") and said in last, last
    assert "Traceback" not in err
    if content == WHOLE[:-9]:
        assert "it read the same 5 times: the file is truncated or damaged" in last


def test_the_picture_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    """A symbolic link planted at `rpg_curves.png` (to a file outside output_dir) is replaced by the picture; the
    file it pointed to is untouched (the training callback writes through the same `draw_run`)."""
    pytest.importorskip("matplotlib")
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours to overwrite")
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(WHOLE)
    (run / plots.PLOT_FILE).symlink_to(outside)
    assert cli.main(["plot", str(run)]) == 0
    assert outside.read_text() == "not yours to overwrite"
    picture = run / plots.PLOT_FILE
    assert not picture.is_symlink() and picture.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(p.name for p in run.iterdir()) == [plots.PLOT_FILE, "trainer_state.json"]  # no temporary left
