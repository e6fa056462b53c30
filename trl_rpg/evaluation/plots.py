"""A picture of what matters in an RPG run, drawn from its `trainer_state.json` (`log_history`).

Four panels over optimizer steps, each drawn when its metrics were logged (`trl_rpg.objectives.loss.metrics` names
them):

- reward: TRL's `reward` (the mean reward of the generation batch each step trained on) and a moving mean; each
  reward function's `rewards/<name>/mean` when there are several; any extra series (the demo's held-out accuracy);
- divergence: `rpg/divergence`, the divergence estimate per token (0 on a step that trains on a freshly generated
  batch with the sampler as reference), `rpg/divergence_ema` (`rpg_reference="adaptive"`), and a mark at each step
  where `rpg/reference_updates` grew;
- how far off-policy the batch is: the range of `w = pi_theta / mu` per step, `rpg/w_p01` to `rpg/w_p99` as a band,
  `rpg/w_max` and `rpg/w_mean` (log scale; `w = 1` on-policy);
- RPG-Style Clip: the fractions of tokens in its zero-gradient regions, `rpg/clip_frac_high` (`A' >= 0`,
  `w >= 1 + eps_high`), `rpg/clip_frac_low` (`A' < 0`, `w <= 1 - eps_low`), `rpg/clip_frac_dual` (`A' < 0`, `w >= c`).

`trl-rpg plot PATH` draws it from a finished or running run (`PATH`: an `output_dir`, a checkpoint folder or a
`trainer_state.json`); `trl_rpg.evaluation.plot_callback.RPGPlotCallback` (`trl-rpg train` and
`examples/rpg_math.py` register it) writes `output_dir/rpg_curves.png` at every checkpoint and at the end of
training, on the main process. matplotlib is the optional extra `plot` (`pip install 'trl-rpg[plot]'`); it is
imported only when a picture is drawn, and this module does not import transformers.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Sequence

__all__ = ["PLOT_FILE", "MissingMatplotlib", "batch_reuse", "checked_state", "draw_run", "empty_note",
           "find_trainer_state", "moving_mean", "plot_run", "read_run", "series", "w_ticks"]

#: The picture a training run leaves in its `output_dir`.
PLOT_FILE = "rpg_curves.png"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
INSTALL_HINT = "pip install 'trl-rpg[plot]'"


class MissingMatplotlib(ImportError):
    """matplotlib is not installed."""


#: How often `read_run` reads a run that is being written before it gives up, and the pause between reads (seconds).
READ_ATTEMPTS, READ_PAUSE = 5, 0.2


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def checked_state(state, path: str) -> dict:
    """`state` if it is what transformers writes to a `trainer_state.json` (an object whose `global_step` is a step
    number and whose `log_history` is a list of objects), else `ValueError` naming the file and what is wrong."""
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a JSON {type(state).__name__}, not a transformers trainer_state.json (an "
                         "object with global_step and log_history).")
    step = state.get("global_step", 0)
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        raise ValueError(f"{path}: global_step is {step!r:.60}, not a step number: it is not a transformers "
                         "trainer_state.json, or it was edited.")
    history = state.get("log_history")
    if not (isinstance(history, list) and all(isinstance(entry, dict) for entry in history)):
        raise ValueError(f"{path} has no log_history list of logged entries: it is not a transformers "
                         "trainer_state.json.")
    return state


class _Unreadable(Exception):
    """One read of a run failed in a way a run being written explains: a file gone (a rotated checkpoint) or not
    (yet) whole JSON (transformers writes trainer_state.json in place)."""

    def __init__(self, path: str, error: BaseException, text: str | None):
        super().__init__(path)
        self.path, self.error, self.text = path, error, text


def _load(path: str, read) -> dict:
    text = None
    try:
        text = read(path)
        return checked_state(json.loads(text), path)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise _Unreadable(path, error, text) from None


def _read_once(path: str, read) -> tuple[str, dict]:
    """The `trainer_state.json` that `path` names and its content, read once: the file itself, or in a folder the
    newer (by `global_step`) of its own and its newest checkpoint's (a checkpoint folder has its own; an
    `output_dir` of a run still going has only its checkpoints')."""
    if os.path.isfile(path):
        return path, _load(path, read)
    own = os.path.join(path, "trainer_state.json")
    steps = sorted((int(m.group(1)), name) for name in os.listdir(path) if (m := _CHECKPOINT.match(name))
                   and os.path.isfile(os.path.join(path, name, "trainer_state.json")))
    candidates = [own] if os.path.isfile(own) else []
    if steps:
        candidates.append(os.path.join(path, steps[-1][1], "trainer_state.json"))
    if not candidates:
        raise FileNotFoundError(f"{path} holds no trainer_state.json, neither itself nor in a checkpoint-N folder "
                                "(transformers writes it with each checkpoint: save_strategy, save_steps).")
    read_states = [(candidate, _load(candidate, read)) for candidate in candidates]
    return max(read_states, key=lambda pair: pair[1].get("global_step", 0))


def read_run(path: str, read=_read_text, attempts: int = READ_ATTEMPTS, pause=None) -> tuple[str, dict]:
    """The `trainer_state.json` that `path` (an `output_dir`, a checkpoint folder or the file) names, and its
    content. A run being written is read again, `attempts` times at most (`pause(READ_PAUSE)` between reads): a
    rotated checkpoint may vanish and `trainer_state.json` be half written while it is read. When every read fails
    the error says which file and why: "being written" when the file changed (or vanished) between reads, the JSON
    error (a truncated or damaged file) when it read the same each time. `read` (the file's text) and `pause` are
    for tests. `FileNotFoundError` when `path` does not exist; `ValueError` for a file that is no trainer state."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder (give an output_dir, a checkpoint folder or a "
                                "trainer_state.json).")
    failures: list[_Unreadable] = []
    for attempt in range(max(1, attempts)):
        if attempt:
            (pause or time.sleep)(READ_PAUSE)
        try:
            return _read_once(path, read)
        except _Unreadable as failure:
            failures.append(failure)
    last = failures[-1]
    same = all(f.path == last.path and f.text == last.text and f.text is not None for f in failures)
    if same:
        raise ValueError(f"{last.path} cannot be read ({type(last.error).__name__}: {last.error}); it read the same "
                         f"{len(failures)} times: the file is truncated or damaged.")
    raise ValueError(f"{last.path} is being written: it changed or vanished while it was read ({len(failures)} "
                     f"reads, {READ_PAUSE:g} s apart; last: {type(last.error).__name__}: {last.error}). Run the "
                     "command again in a moment.")


def find_trainer_state(path: str) -> str:
    """The `trainer_state.json` that `path` names (`read_run`: the file itself, or in a folder the newer of its own
    and its newest checkpoint's). `FileNotFoundError` says what was looked for."""
    return read_run(path)[0]


def default_output(state_path: str, path: str | None = None) -> str:
    """Where `trl-rpg plot PATH` writes by default: `rpg_curves.png` in the `output_dir` named (`PATH` itself, even
    when its newest `trainer_state.json` is a checkpoint's, as after a finished run), or in the folder of the
    `trainer_state.json`; for a checkpoint's state, the folder above it, as `rpg_curves_checkpoint-N.png` (a checkpoint
    folder itself is left as written)."""
    if path is not None and os.path.isdir(path) and not _CHECKPOINT.match(os.path.basename(os.path.abspath(path))):
        return os.path.join(path, PLOT_FILE)
    folder = os.path.dirname(os.path.abspath(state_path))
    if _CHECKPOINT.match(os.path.basename(folder)):
        return os.path.join(os.path.dirname(folder), f"rpg_curves_{os.path.basename(folder)}.png")
    return os.path.join(folder, PLOT_FILE)


def series(log_history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """`(steps, values)` of one logged metric (entries without it, or without a step, are left out)."""
    steps, values = [], []
    for entry in log_history:
        if key in entry and isinstance(entry.get("step"), int) and isinstance(entry[key], (int, float)):
            steps.append(int(entry["step"]))
            values.append(float(entry[key]))
    return steps, values


def moving_mean(values: Sequence[float]) -> tuple[list[float], int]:
    """The trailing moving mean of `values` and its window: ~1/15 of the points, at least 3 once there are 12."""
    window = max(1, len(values) // 15, min(3, len(values) // 4))
    means = [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
             for i in range(len(values))]
    return means, window


def _figure(panels: int):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise MissingMatplotlib(f"drawing RPG's curves needs matplotlib, which is not installed: {INSTALL_HINT}") \
            from error
    columns = 1 if panels == 1 else 2
    rows = (panels + columns - 1) // columns
    figure = Figure(figsize=(7 * columns, 3.6 * rows), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return figure, list(axes[:panels])


def _reward_panel(ax, log_history, extra):
    steps, values = series(log_history, "reward")
    shown = list(values)
    if steps:
        smooth, window = moving_mean(values)
        ax.plot(steps, values, color="tab:blue", alpha=0.3 if window > 1 else 1.0, lw=1.0,
                label="training reward (the batch of each step)")
        if window > 1:
            ax.plot(steps, smooth, color="tab:blue", lw=1.8, label=f"training reward (moving mean of {window} steps)")
    names = sorted({k for entry in log_history for k in entry if re.fullmatch(r"rewards/.+/mean", k)})
    if len(names) > 1:
        for name in names:
            points = series(log_history, name)
            ax.plot(*points, lw=1.0, label=name)
            shown += points[1]
    for label, points in (extra or {}).items():
        ax.plot([s for s, _ in points], [v for _, v in points], color="tab:red", marker="o", lw=2, label=label)
        shown += [v for _, v in points]
    if shown and all(0.0 <= v <= 1.0 for v in shown):
        ax.set_ylim(-0.02, 1.02)  # rewards and accuracies in [0, 1]: on their whole scale
    ax.set_ylabel("reward")


def _divergence_panel(ax, log_history):
    ax.plot(*series(log_history, "rpg/divergence"), color="tab:purple", lw=1.2, label="rpg/divergence (per token)")
    ema = series(log_history, "rpg/divergence_ema")
    if ema[0]:
        ax.plot(*ema, color="tab:purple", ls="--", lw=1.2, label="rpg/divergence_ema")
    steps, updates = series(log_history, "rpg/reference_updates")
    marked = [s for s, before, now in zip(steps[1:], updates, updates[1:]) if now > before]
    for i, step in enumerate(marked):
        ax.axvline(step, color="gray", lw=0.8, ls=":", label="reference update" if i == 0 else None)
    ax.set_ylabel("divergence to the reference")


def _w_panel(ax, log_history):
    steps, low = series(log_history, "rpg/w_p01")
    high_steps, high = series(log_history, "rpg/w_p99")
    if steps and steps == high_steps:
        ax.fill_between(steps, low, high, color="tab:green", alpha=0.25, lw=0, label="rpg/w_p01 .. rpg/w_p99")
    for key, style in (("rpg/w_max", dict(color="tab:green", lw=1.2)),
                       ("rpg/w_mean", dict(color="black", lw=1.0, alpha=0.6))):
        points = series(log_history, key)
        if points[0]:
            ax.plot(*points, label=key, **style)
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set_yscale("log")
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator

    shown = [v for key in ("rpg/w_p01", "rpg/w_p99", "rpg/w_max", "rpg/w_mean") for v in series(log_history, key)[1]
             if v > 0 and math.isfinite(v)]
    ticks, limits = w_ticks(min(shown, default=1.0), max(shown, default=1.0))
    ax.set_ylim(*limits)  # from a labelled tick at or below the lowest w to one at or above w_max
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))  # plain numbers: w stays near 1
    ax.set_ylabel("w = pi_theta / mu")


#: Where the w panel may put a labelled tick: 1, 2, 5 times a power of ten, and the steps near 1 where w mostly is.
W_TICKS = sorted({m * 10.0**k for k in range(-6, 7) for m in (1, 2, 5)} | {0.8, 0.9, 1.1, 1.2, 1.5})


def w_ticks(lowest: float, highest: float, per_side: int = 4) -> tuple[list[float], tuple[float, float]]:
    """The w panel's labelled ticks and limits for `w` between `lowest` and `highest`: the limits are the nearest
    `W_TICKS` outside the data and outside 1 (so a labelled tick always sits above 1, at or above `rpg/w_max`, and
    one below 1), with at most `per_side` ticks on each side of 1 (the extremes kept)."""
    top = next((t for t in W_TICKS if t > 1 and t >= highest), W_TICKS[-1])
    bottom = next((t for t in reversed(W_TICKS) if t < 1 and t <= lowest), W_TICKS[0])
    above = [t for t in W_TICKS if 1 < t <= top]
    below = [t for t in W_TICKS if bottom <= t < 1]
    return _thin(below[::-1], per_side)[::-1] + [1.0] + _thin(above, per_side), (bottom, top)


def _thin(ticks: list[float], most: int) -> list[float]:
    """At most `most` of `ticks` (ordered away from 1), evenly spread, the last one (the limit) always kept."""
    if len(ticks) <= most:
        return ticks
    step = (len(ticks) - 1) / (most - 1)
    return [ticks[round(i * step)] for i in range(most)]


def _clip_panel(ax, log_history):
    for key, color in (("rpg/clip_frac_high", "tab:orange"), ("rpg/clip_frac_low", "tab:cyan"),
                       ("rpg/clip_frac_dual", "tab:red")):
        points = series(log_history, key)
        if points[0]:
            ax.plot(*points, color=color, lw=1.2, label=key)
    ax.set_ylabel("fraction of tokens clipped")


_PANELS = (  # (title, metrics any of which makes the panel drawn, drawer)
    ("divergence", ("rpg/divergence",), _divergence_panel),
    ("off-policy ratio w", ("rpg/w_p01", "rpg/w_p99", "rpg/w_max"), _w_panel),
    ("RPG-Style Clip", ("rpg/clip_frac_high", "rpg/clip_frac_low", "rpg/clip_frac_dual"), _clip_panel),
)


def batch_reuse(log_history: Sequence[dict]) -> int:
    """The most optimizer steps one generation batch was trained on, as the logs show it (1 when they do not): the
    steps over which consecutive training logs carry the same `num_tokens` (the count of the batch trained on, which
    a reused batch carries to every step it trains), up to the next log."""
    logs = [(int(e["step"]), e["num_tokens"]) for e in log_history
            if "loss" in e and "num_tokens" in e and "step" in e]
    longest, start = 1, 0
    for i in range(1, len(logs) + 1):
        if i == len(logs) or logs[i][1] != logs[start][1]:
            if i - start > 1:
                gap = logs[start + 1][0] - logs[start][0]
                longest = max(longest, logs[i - 1][0] - logs[start][0] + gap)
            start = i
    return longest


def _sawtooth_note(reuse: int) -> str:
    return (f"Each generation batch is trained on for up to {reuse} optimizer steps (batch reuse): on its first step "
            "the policy is the sampler (w = 1, divergence and clip fractions 0), then they grow while it is reused "
            "and drop back when the next batch is generated. That sawtooth is the reuse, not instability; the reward "
            "is the batch's, flat across its steps.")


def empty_note(log_history: Sequence[dict], global_step: int | None, logging_steps: int | None) -> str:
    """What an empty reward panel says: nothing logged yet (the first log's step), or, for a run that ended, that it
    ended before its first log and what to change."""
    ended = any("train_runtime" in entry for entry in log_history)
    if ended and global_step is not None and logging_steps:
        return (f"nothing logged: the run ended at step {global_step},\nbefore its first log "
                f"(logging_steps={logging_steps});\nset logging_steps <= {max(global_step, 1)} to see its curves")
    if logging_steps and global_step is not None:
        return f"nothing logged yet: the first log comes at step {logging_steps}\n(now at step {global_step})"
    return "nothing logged yet"


def draw_run(log_history: Sequence[dict], path: str, title: str = "RPG training",
             extra: dict[str, Sequence[tuple[int, float]]] | None = None, global_step: int | None = None,
             logging_steps: int | None = None) -> str:
    """Write the picture of `log_history` (a `TrainerState.log_history`) to `path` (PNG) and return `path`. The
    reward panel is always drawn; the others when their metrics were logged; with batch reuse a note under the panels
    explains the sawtooth it draws. `extra`: more reward-panel series, `{label: [(step, value), ...]}`.
    `global_step`, `logging_steps` (the trainer state's): what an empty panel says (`empty_note`). Raises
    `MissingMatplotlib` without matplotlib."""
    logged = {key for entry in log_history for key in entry}
    panels = [(name, drawer) for name, keys, drawer in _PANELS if logged.intersection(keys)]
    figure, axes = _figure(1 + len(panels))
    _reward_panel(axes[0], log_history, extra)
    axes[0].set_title("reward")
    for ax, (name, drawer) in zip(axes[1:], panels):
        drawer(ax, log_history)
        ax.set_title(name)
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        else:
            ax.text(0.5, 0.5, empty_note(log_history, global_step, logging_steps), ha="center", va="center",
                    transform=ax.transAxes)
    figure.suptitle(title)
    reuse = batch_reuse(log_history) if panels else 1
    if reuse > 1:
        figure.text(0.5, 0.01, _sawtooth_note(reuse), ha="center", va="bottom", fontsize=8, wrap=True)
    figure.tight_layout(rect=(0, 0.06 if reuse > 1 else 0, 1, 1))
    _save_replacing(figure, path)
    return path


def _save_replacing(figure, path: str) -> None:
    """Write the PNG to a new file beside `path` (created exclusively: never an existing file or link), then rename
    it over `path`: a symbolic link planted at `path` is replaced, never followed (the picture cannot land in a file
    outside the folder), and a reader never sees a half-written picture."""
    import secrets

    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            figure.savefig(f, format="png")
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.remove(temporary)
        raise


def plot_run(path: str, output: str | None = None, read=_read_text) -> tuple[str, str, int]:
    """Draw the run at `path` (an `output_dir`, a checkpoint folder or a `trainer_state.json`; `read_run`); returns
    `(picture, trainer_state.json read, its global step)`. `output` defaults to `default_output`."""
    state_path, state = read_run(path, read)
    output = output or default_output(state_path, path)
    folder = os.path.dirname(os.path.abspath(state_path))
    step = state.get("global_step", 0)
    return (draw_run(state["log_history"], output, title=f"{os.path.basename(folder)} (step {step})",
                     global_step=state.get("global_step"), logging_steps=state.get("logging_steps")), state_path,
            step)
