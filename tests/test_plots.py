"""Issue 29 section 2: a training run leaves a picture of what matters for RPG (reward, divergence, the range of `w`,
clip fractions) in its output_dir, and `trl-rpg plot PATH` draws it from any trainer_state.json: an output_dir, a
checkpoint folder (of a running or finished run) or the file itself (`trl_rpg.evaluation.plots`)."""

import json
import logging
import sys

import matplotlib.axes
import pytest
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.evaluation.plot_callback import RPGPlotCallback
from trl_rpg.evaluation.plots import PLOT_FILE, draw_run, find_trainer_state, plot_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: The lines and bands a picture of an RPG run with batch reuse shows (labels of its legends).
RPG_SERIES = {"training reward (the batch of each step)", "rpg/divergence (per token)", "rpg/w_p01 .. rpg/w_p99",
              "rpg/w_max", "rpg/w_mean", "rpg/clip_frac_high", "rpg/clip_frac_low", "rpg/clip_frac_dual"}


@pytest.fixture
def drawn_labels(monkeypatch):
    """The labels of every line and band drawn, in order."""
    labels = []
    for name in ("plot", "fill_between"):
        original = getattr(matplotlib.axes.Axes, name)
        monkeypatch.setattr(matplotlib.axes.Axes, name, lambda self, *a, _f=original, **k: labels.append(
            k.get("label")) or _f(self, *a, **k))
    return labels


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run with batch reuse (w moves off 1), 3 steps, checkpoints at steps 2 and 3 (the end), and the plot
    callback."""
    root = tmp_path_factory.mktemp("plots")
    out = root / "run"
    args = RPGConfig(**cpu_args(out, max_steps=3, rpg_generation_reuse=2, save_strategy="steps", save_steps=2))
    callback = RPGPlotCallback()
    RPGTrainer(model=save_tiny_model(str(root / "model")), reward_funcs=digit_reward, args=args,
               train_dataset=tiny_dataset(), callbacks=[callback]).train()
    return out, callback


@pytest.fixture(scope="module")
def finished_run(trained):
    return trained[0]


def test_a_training_run_leaves_its_curves_in_output_dir(trained):
    out, callback = trained
    assert (out / PLOT_FILE).read_bytes()[:8] == PNG_MAGIC
    assert callback.drawn_at == 3  # redrawn at the last checkpoint
    history = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert max(e.get("rpg/w_max", 1.0) for e in history) > 1.0  # the reused batch is off-policy: w is not 1


def test_plot_command_draws_a_checkpoint_and_an_output_dir(finished_run, drawn_labels, capsys):
    from trl_rpg import cli

    assert cli.main(["plot", str(finished_run / "checkpoint-2")]) == 0
    picture = finished_run / "rpg_curves_checkpoint-2.png"  # next to the checkpoint, not inside it
    assert picture.read_bytes()[:8] == PNG_MAGIC and not (finished_run / "checkpoint-2" / PLOT_FILE).exists()
    assert str(picture) in capsys.readouterr().out
    assert RPG_SERIES <= set(drawn_labels), RPG_SERIES - set(drawn_labels)
    # an output_dir without its own trainer_state.json: the newest checkpoint's
    output = finished_run / "again.png"
    drawn, state, step = plot_run(str(finished_run), str(output))
    assert (drawn, step) == (str(output), 3) and state == str(finished_run / "checkpoint-3" / "trainer_state.json")
    assert output.read_bytes()[:8] == PNG_MAGIC


def fake_state(step, history):
    return type("State", (), {"is_world_process_zero": True, "global_step": step, "log_history": history})()


def test_the_callback_draws_at_the_end_of_a_run_without_checkpoints_on_the_main_process_only(tmp_path):
    args = type("Args", (), {"output_dir": str(tmp_path)})()
    history = [{"step": 1, "reward": 0.5, "rpg/w_max": 1.2}]
    callback = RPGPlotCallback()
    callback.on_train_end(args, fake_state(1, history), None)
    assert callback.drawn_at == 1 and (tmp_path / PLOT_FILE).read_bytes()[:8] == PNG_MAGIC
    other = fake_state(1, history)
    other.is_world_process_zero = False
    (tmp_path / PLOT_FILE).unlink()
    RPGPlotCallback().on_train_end(args, other, None)
    assert not (tmp_path / PLOT_FILE).exists()


def test_a_log_without_rpg_metrics_draws_the_reward_alone(tmp_path, drawn_labels):
    draw_run([{"step": 1, "reward": 0.2}, {"step": 2, "reward": 0.4}], str(tmp_path / "grpo.png"))
    assert drawn_labels and all(label.startswith("training reward") for label in drawn_labels)


def test_an_output_dir_is_read_from_its_newest_trainer_state(tmp_path):
    """The newer (by global_step) of the output_dir's own trainer_state.json (a finished run's) and its newest
    checkpoint's (by number: checkpoint-10 after checkpoint-2), so a resumed run still going is drawn as it is now."""
    def state(folder, step):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
        return str(folder / "trainer_state.json")

    own = state(tmp_path, 1)
    state(tmp_path / "checkpoint-2", 2)
    newest = state(tmp_path / "checkpoint-10", 10)
    assert find_trainer_state(str(tmp_path)) == newest
    own = state(tmp_path, 12)
    assert find_trainer_state(str(tmp_path)) == own


def test_plot_command_errors_name_what_was_looked_for(tmp_path, capsys):
    from trl_rpg import cli

    with pytest.raises(FileNotFoundError, match="no trainer_state.json"):
        find_trainer_state(str(tmp_path))
    assert cli.main(["plot", str(tmp_path / "missing")]) != 0
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("trl-rpg plot: error:")


def test_without_matplotlib_the_run_says_how_to_get_the_picture_and_the_command_fails_clearly(
        finished_run, tmp_path, monkeypatch, caplog, capsys):
    from trl_rpg import cli

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    callback = RPGPlotCallback()
    state = fake_state(1, [])
    args = type("Args", (), {"output_dir": str(tmp_path)})()
    with caplog.at_level(logging.WARNING, logger="trl_rpg"):
        callback.on_save(args, state, None)
        callback.on_train_end(args, state, None)
    warned = [r.getMessage() for r in caplog.records if PLOT_FILE in r.getMessage()]
    assert len(warned) == 1 and "pip install 'trl-rpg[plot]'" in warned[0] and "trl-rpg plot" in warned[0]
    assert not (tmp_path / PLOT_FILE).exists()
    assert cli.main(["plot", str(finished_run)]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "matplotlib" in last and "pip install 'trl-rpg[plot]'" in last
