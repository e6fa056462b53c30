"""`trl-rpg plot PATH`: draw a run's curves (`trl_rpg.evaluation.plots`) from its trainer_state.json."""

from __future__ import annotations

import argparse
import sys


def make_plot_parser(prog: str = "trl-rpg plot") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        description="Draw the reward, the divergence, the range of w (rpg/w_p01 .. rpg/w_p99, rpg/w_max) and the clip "
                    "fractions over optimizer steps from a run's trainer_state.json (a finished run or one still "
                    "going). Needs matplotlib: pip install 'trl-rpg[plot]'.")
    parser.add_argument("path", help="An output_dir (the newer of its own trainer_state.json and its newest "
                                     "checkpoint's), a checkpoint folder, or a trainer_state.json.")
    parser.add_argument("-o", "--output", default=None,
                        help="The PNG to write (default: rpg_curves.png in the run's output_dir; for a checkpoint, "
                             "rpg_curves_checkpoint-N.png next to it).")
    return parser


def run_plot_command(argv: list[str], prog: str = "trl-rpg plot") -> int:
    from ..evaluation.plots import plot_run
    from .arguments import USAGE_ERROR

    args = make_plot_parser(prog).parse_args(argv)
    try:
        picture, state, step = plot_run(args.path, args.output)
    except (OSError, ValueError, ImportError) as error:  # no such path, not a trainer state, no matplotlib
        print(f"{prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    print(f"{picture} (from {state}, step {step})")
    return 0
