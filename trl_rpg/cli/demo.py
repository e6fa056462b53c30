"""`trl-rpg demo`: its arguments, and the demo run (`trl_rpg.toy.demo`)."""

from __future__ import annotations

import argparse


def make_demo_parser(prog: str = "trl-rpg demo") -> argparse.ArgumentParser:
    from ..objectives import DIVERGENCES, ESTIMATORS
    from ..toy.demo import DEMO_EVAL_EVERY, DEMO_MAX_STEPS
    from ..toy.task import DEFAULT_SFT_STEPS

    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        description="Train a tiny model built on the spot (no download) on a toy arithmetic-reasoning task with RPG, "
                    "on CPU, and print held-out accuracy before and after.")
    parser.add_argument("--output_dir", default="rpg-demo", help="Where the trained model, curves.png and "
                                                                 "metrics.json go (default: rpg-demo).")
    parser.add_argument("--seed", type=int, default=0, help="Random seed (default: 0).")
    parser.add_argument("--max_steps", type=int, default=DEMO_MAX_STEPS,
                        help=f"RL optimizer steps (default: {DEMO_MAX_STEPS}).")
    parser.add_argument("--eval_every", type=int, default=DEMO_EVAL_EVERY,
                        help=f"Held-out evaluation every N steps (default: {DEMO_EVAL_EVERY}; 0: before and after "
                             "only).")
    parser.add_argument("--num_threads", type=int, default=1,
                        help="torch CPU threads (default: 1, the fastest for a model this small).")
    parser.add_argument("--sft_steps", type=int, default=DEFAULT_SFT_STEPS,
                        help=f"Supervised warm-up steps before RPG (default: {DEFAULT_SFT_STEPS}); fewer make a quick "
                             "check that an install runs, whose accuracies mean little.")
    parser.add_argument("--rpg_divergence", default=None, choices=list(DIVERGENCES),
                        help="Divergence (default: RPGConfig's 'urkl').")
    parser.add_argument("--rpg_estimator", default=None, choices=list(ESTIMATORS),
                        help="Gradient estimator (default: RPGConfig's 'reinforce').")
    return parser


def run_demo_command(argv: list[str]) -> int:
    from ..toy.demo import run_demo

    args = make_demo_parser().parse_args(argv)
    overrides = {k: getattr(args, k) for k in ("rpg_divergence", "rpg_estimator") if getattr(args, k) is not None}
    result = run_demo(output_dir=args.output_dir, seed=args.seed, max_steps=args.max_steps,
                      eval_every=args.eval_every, num_threads=args.num_threads, sft_steps=args.sft_steps,
                      rl_overrides=overrides)
    return 0 if result["accuracy_after"] >= result["accuracy_before"] else 1
