"""`RPGPlotCallback`: the training-side hook of `trl_rpg.evaluation.plots` (`trl-rpg train` and `examples/rpg_math.py`
register it; from Python, `RPGTrainer(..., callbacks=[RPGPlotCallback()])`)."""

from __future__ import annotations

import logging
import os

from transformers import TrainerCallback

from .plots import PLOT_FILE, MissingMatplotlib, draw_run

logger = logging.getLogger(__name__)

__all__ = ["RPGPlotCallback"]


class RPGPlotCallback(TrainerCallback):
    """Writes `output_dir/rpg_curves.png` (`draw_run` of the trainer's `log_history`) on the main process after every
    checkpoint and at the end of training. Without matplotlib it says so once and draws nothing; a drawing error is
    logged, never raised (a picture is not worth a training run)."""

    def __init__(self, filename: str = PLOT_FILE):
        self.filename = filename
        self.drawn_at: int | None = None  #: the global step of the last picture written
        self._disabled = False

    def _draw(self, args, state) -> None:
        if self._disabled or not state.is_world_process_zero or self.drawn_at == state.global_step:
            return
        path = os.path.join(args.output_dir, self.filename)
        try:
            os.makedirs(args.output_dir, exist_ok=True)
            draw_run(state.log_history, path, title=f"{os.path.basename(os.path.abspath(args.output_dir))} "
                                                    f"(step {state.global_step})", global_step=state.global_step,
                     logging_steps=getattr(state, "logging_steps", None))
        except MissingMatplotlib as error:
            self._disabled = True
            logger.warning("RPGTrainer: no %s: %s (`trl-rpg plot %s` draws it later).", self.filename, error,
                           args.output_dir)
        except Exception as error:  # a failed picture must not end the run
            logger.warning("RPGTrainer: could not draw %s: %s: %s", path, type(error).__name__, error)
        else:
            self.drawn_at = state.global_step

    def on_save(self, args, state, control, **kwargs):
        self._draw(args, state)

    def on_train_end(self, args, state, control, **kwargs):
        self._draw(args, state)
