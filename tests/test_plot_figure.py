"""What the picture of a run says (issue 36 section 3): `trl-rpg plot OUTPUT_DIR` writes the `rpg_curves.png` its help
promises, the w panel has labelled ticks on both sides of 1 (up to `rpg/w_max`), batch reuse's sawtooth is explained
on the figure, and an empty panel of a run that ended says what it lacks and why."""

import json

import matplotlib.axes
import matplotlib.figure
import pytest

from trl_rpg import cli
from trl_rpg.evaluation.plots import PLOT_FILE, _figure, _w_panel, batch_reuse, draw_run, w_ticks

#: Four optimizer steps per generation batch, logged every 2 steps (the README's quick start): `num_tokens` is the
#: batch's and stays put while the batch is reused; w is 1 on a fresh batch and moves off it while it is reused.
REUSED = [{"step": s, "loss": 0.0, "reward": 0.4 + s / 100, "num_tokens": 1000 * ((s - 1) // 4 + 1),
           "rpg/divergence": 0.0 if s % 4 == 2 else 0.004, "rpg/w_p01": 0.97, "rpg/w_p99": 1.03,
           "rpg/w_max": 1.0 if s % 4 == 2 else 1.3, "rpg/w_mean": 1.0} for s in range(2, 17, 2)]


@pytest.fixture
def texts(monkeypatch):
    """Every text written on a panel or on the figure."""
    written = []
    for owner in (matplotlib.axes.Axes, matplotlib.figure.Figure):
        original = owner.text
        monkeypatch.setattr(owner, "text", lambda self, x, y, s, *a, _f=original, **k: written.append(s) or _f(
            self, x, y, s, *a, **k))
    return written


def test_plot_of_a_finished_output_dir_writes_rpg_curves_png_there(tmp_path, capsys):
    """A finished run's output_dir holds no trainer_state.json of its own (`save_model` writes none): its newest
    checkpoint's is read, and the picture is the output_dir's `rpg_curves.png`, as `--help` says."""
    checkpoint = tmp_path / "run" / "checkpoint-16"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 16, "logging_steps": 2,
                                                               "log_history": REUSED}))
    assert cli.main(["plot", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / PLOT_FILE).is_file()
    assert not (tmp_path / "run" / "rpg_curves_checkpoint-16.png").exists()
    assert capsys.readouterr().out.startswith(str(tmp_path / "run" / PLOT_FILE))
    assert cli.main(["plot", str(checkpoint)]) == 0  # a checkpoint folder: next to it, named after it
    assert (tmp_path / "run" / "rpg_curves_checkpoint-16.png").is_file() and not (checkpoint / PLOT_FILE).exists()


def test_the_w_panel_labels_a_tick_above_1_up_to_w_max():
    """w between 0.97 and 1.3 (a log scale's decade ticks would label 1 alone): labelled ticks below and above 1,
    the top one at or above w_max."""
    figure, (ax,) = _figure(1)
    _w_panel(ax, REUSED)
    figure.canvas.draw()
    bottom, top = ax.get_ylim()
    labelled = [float(t.get_text()) for t in ax.get_yticklabels()
                if t.get_text() and bottom <= t.get_position()[1] <= top]
    assert any(v > 1 for v in labelled) and any(v < 1 for v in labelled) and 1.0 in labelled, labelled
    assert top >= 1.3 and max(labelled) >= 1.3


@pytest.mark.parametrize("lowest, highest", [(1.0, 1.0), (0.97, 1.3), (0.2, 40.0), (1e-4, 900.0)])
def test_w_ticks_bracket_the_data_with_few_labels(lowest, highest):
    ticks, (bottom, top) = w_ticks(lowest, highest)
    assert bottom <= lowest and top >= highest and bottom < 1 < top
    assert ticks == sorted(ticks) and ticks[0] == bottom and ticks[-1] == top and 1.0 in ticks
    assert len(ticks) <= 9


def test_batch_reuse_sawtooth_is_explained_on_the_figure(tmp_path, texts):
    assert batch_reuse(REUSED) == 4
    draw_run(REUSED, str(tmp_path / "reused.png"))
    (note,) = [t for t in texts if "sawtooth" in t]
    assert "up to 4 optimizer steps" in note and "not instability" in note
    texts.clear()
    on_policy = [{**entry, "num_tokens": 1000 * entry["step"]} for entry in REUSED]  # a new batch at every log
    assert batch_reuse(on_policy) == 1
    draw_run(on_policy, str(tmp_path / "on_policy.png"))
    assert not any("sawtooth" in t for t in texts)


def test_an_ended_run_with_nothing_logged_says_so_and_why(tmp_path, texts):
    """2 steps at GRPOConfig's logging_steps=10: the run's end is logged, no step is; the panel says the run ended
    before its first log and what to set, not 'nothing logged yet'."""
    out = tmp_path / "run"
    out.mkdir()
    history = [{"step": 2, "train_runtime": 3.0, "train_loss": 0.0}]
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 2, "logging_steps": 10,
                                                        "log_history": history}))
    assert cli.main(["plot", str(out)]) == 0
    (said,) = [t for t in texts if "nothing logged" in t]
    assert said == ("nothing logged: the run ended at step 2,\nbefore its first log (logging_steps=10);\n"
                    "set logging_steps <= 2 to see its curves")
    texts.clear()
    draw_run([], str(tmp_path / "going.png"), global_step=3, logging_steps=10)  # a run still going
    assert [t for t in texts if "nothing logged" in t] == ["nothing logged yet: the first log comes at step 10\n"
                                                           "(now at step 3)"]
