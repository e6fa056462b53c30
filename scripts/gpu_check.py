"""Throughput and memory of RPG vs GRPO under DeepSpeed ZeRO-3 (driven by scripts/gpu_check.sh).

Subcommands:

    make-model DIR [--tiny]      save a randomly initialised Qwen2-shaped model (Qwen2.5-0.5B's shape, ~494M
                                 parameters, bf16; `--tiny`: a few thousand parameters, fp32) and a word-level
                                 tokenizer covering its vocabulary into DIR. Nothing is downloaded.
    train --trainer {rpg,grpo,rpg-initial} --model DIR --out FILE [--tiny]
                                 train under whatever `accelerate launch` set up and write the figures to FILE
    report FILE [FILE ...]       print the figures and the ratios to the first file's (RPG)

Both trainers use the same data, batch, generation schedule (each generation batch reused for
`steps_per_generation` optimizer steps), learning rate and clip; they differ in the objective and the reference:

    rpg          RPGConfig defaults: RPG-REINFORCE-URKL, beta=1e-4, rpg_reference="sampling" (no reference model)
    grpo         GRPOConfig with beta=0.04 (GRPO's k3 penalty against a reference model)
    rpg-initial  RPG with rpg_reference="initial", beta=0.04 (a reference model, like GRPO)

Tokens per second = prompt + completion tokens of the generation batches drawn after the first
`steps_per_generation` steps, divided by the wall time of those steps (generation, scoring and training; the first
generation batch, which includes DeepSpeed's and CUDA's warm-up, is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

QWEN2_0_5B = dict(  # the shape of Qwen2.5-0.5B
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)
CHARS = list("0123456789+-*=? abcdefghijklmnopqrstuvwxyz:")

# Training settings: (full run, --tiny run)
SETTINGS = {
    False: dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=256, max_steps=12,
                steps_per_generation=4),
    True: dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16, max_steps=6,
               steps_per_generation=2),
}


def make_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<pad>", "<eos>", *CHARS]
    names += [f"<t{i}>" for i in range(vocab_size - len(names))]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_model(directory: str, tiny: bool) -> None:
    import torch

    from trl_rpg.toy import build_model

    shape = dict(TINY if tiny else QWEN2_0_5B)
    tokenizer = make_tokenizer(shape.pop("vocab_size"))
    model = build_model(tokenizer, hidden_size=shape.pop("hidden_size"), num_layers=shape.pop("num_hidden_layers"),
                        num_heads=shape.pop("num_attention_heads"), seed=0, bos_token_id=tokenizer.eos_token_id,
                        **shape)
    dtype = torch.float32 if tiny else torch.bfloat16
    model = model.to(dtype)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    print(f"[gpu_check] random Qwen2-shaped model: {n / 1e6:.1f}M parameters ({dtype}) -> {directory}")


def parity_reward(completion_ids, **kwargs):
    """A reward with spread inside every group: the fraction of even token ids."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def train(trainer_name: str, model_dir: str, out: str, tiny: bool) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer

    cuda = torch.cuda.is_available()
    settings = dict(SETTINGS[tiny])
    common = dict(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(out)), f"run-{trainer_name}"), learning_rate=1e-6,
        bf16=cuda, logging_steps=1, report_to="none", save_strategy="no", seed=0, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", scale_rewards="none", shuffle_dataset=False, dataloader_num_workers=0, **settings,
    )
    if not cuda:
        common.update(use_cpu=True, ddp_backend="gloo")
    if trainer_name == "rpg":
        cls, args = RPGTrainer, RPGConfig(**common)
    elif trainer_name == "rpg-initial":
        cls, args = RPGTrainer, RPGConfig(rpg_reference="initial", **dict(common, beta=0.04))
    elif trainer_name == "grpo":
        cls, args = GRPOTrainer, GRPOConfig(**dict(common, beta=0.04))
    else:
        raise SystemExit(f"unknown trainer {trainer_name!r}")

    n_prompts = settings["max_steps"] * settings["per_device_train_batch_size"]  # more than enough
    dataset = Dataset.from_dict({"prompt": [f"problem {i}: {i % 7}+{(3 * i) % 10}=" for i in range(n_prompts)]})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = cls(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset,
                  processing_class=tokenizer)

    class Timer(TrainerCallback):
        """Wall time and tokens from the end of the first generation batch's steps to the end of training."""

        def __init__(self):
            self.start = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == args.steps_per_generation:
                if cuda:
                    torch.cuda.synchronize()
                self.start = (time.perf_counter(), state.num_input_tokens_seen, state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.end = (time.perf_counter(), state.num_input_tokens_seen, state.global_step)

    timer = Timer()
    trainer.add_callback(timer)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()

    (t0, tokens0, step0), (t1, tokens1, step1) = timer.start, timer.end
    # num_input_tokens_seen grows when a generation batch is drawn, at the first step of each batch
    result = {
        "trainer": trainer_name, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "num_processes": trainer.accelerator.num_processes,
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled
        else None,
        "dtype": "bf16" if args.bf16 else "fp32", "beta": args.beta,
        "reference_model": trainer.ref_model is not None,
        "steps_timed": step1 - step0, "tokens_timed": int(tokens1 - tokens0), "seconds_timed": t1 - t0,
        "tokens_per_second": (tokens1 - tokens0) / (t1 - t0),
        "seconds_per_step": (t1 - t0) / max(step1 - step0, 1),
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_gpu_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "settings": settings,
        "final_loss": next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
    }
    if trainer.accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"[gpu_check] {trainer_name}: {json.dumps(result)}")


def report(files: list[str]) -> None:
    results = []
    for path in files:
        with open(path) as f:
            results.append(json.load(f))
    base = results[0]
    memory_key = "peak_gpu_memory_gib" if base["peak_gpu_memory_gib"] is not None else "peak_host_rss_gib"
    memory_name = "peak GPU memory (GiB)" if memory_key == "peak_gpu_memory_gib" else "peak host RSS (GiB)"
    print()
    print(f"device: {base['device']}, {base['num_processes']} process(es), ZeRO stage {base['zero_stage']}, "
          f"{base['dtype']}; settings: {base['settings']}")
    print(f"{'trainer':<12} {'beta':>7} {'ref model':>9} {'tokens/s':>10} {'s/step':>8} {memory_name:>24}")
    for r in results:
        print(f"{r['trainer']:<12} {r['beta']:>7g} {str(r['reference_model']):>9} {r['tokens_per_second']:>10.1f} "
              f"{r['seconds_per_step']:>8.3f} {r[memory_key]:>24.2f}")
    for r in results[1:]:
        speed = base["tokens_per_second"] / r["tokens_per_second"]
        memory = base[memory_key] / r[memory_key]
        print(f"ratio {base['trainer']}/{r['trainer']}: tokens/s x{speed:.3f}, {memory_name} x{memory:.3f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make-model")
    p.add_argument("directory")
    p.add_argument("--tiny", action="store_true")
    p = sub.add_parser("train")
    p.add_argument("--trainer", required=True, choices=["rpg", "grpo", "rpg-initial"])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "make-model":
        make_model(args.directory, args.tiny)
    elif args.command == "train":
        train(args.trainer, args.model, args.out, args.tiny)
    else:
        report(args.files)


if __name__ == "__main__":
    sys.exit(main())
