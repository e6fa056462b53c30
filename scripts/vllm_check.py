"""tests/test_vllm_generation.py's claims against real vLLM on one GPU (driven by `scripts/gpu_check.sh --vllm`).

The CPU tests read the fake engine's weights after each sync; real vLLM's weights live fused under its own names, so
here the evidence is what TRL itself logs at every generation: `sampling/sampling_logp_difference/mean`, the mean
|log pi_old - log mu| over the generated tokens between the trainer's policy and the engine's processed log-probs.
If the sync sends the policy, it stays at the kernel-mismatch floor (bf16 noise) however far training moves the
policy; an engine left on stale weights (the control run, `rpg-nosync`: every sync after the first skipped) drifts
away from it as the policy moves. So each synced run must keep its drift (last generation's difference minus the
first's) below a quarter of the control's, and the control must drift at all (else the run is inconclusive: the
policy did not move enough to tell).

Runs (one process each, colocate mode, `vllm_importance_sampling_correction` on):

    rpg-full     RPG, beta 0.05, a reference updated every 3 steps (TRL's reference model), full fine-tuning
    rpg-lora     the same with LoRA: the engine must get base + merged "default" adapter, never RPG's "ref"
    grpo-full    GRPOTrainer, beta 0.04
    rpg-nosync   rpg-full with every sync after the first skipped (the control)
    rpg-topk     rpg-full with top_k=20 (token_truncate): the logged importance ratio's mean is about the kept
                 mass, below 1 (docs/math.md section 4c; reported, not judged)

Subcommands: `train --run NAME --model DIR --out FILE [--tiny]` and `report FILE ...` (exit status 1 when a check
fails). `--tiny` (with `gpu_check.sh --dry-run`) is the same on CPU with the fake engine of tests/vllm_stub, which
gpu_check.sh puts on PYTHONPATH: it checks the plumbing, its figures mean nothing about vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

RUNS = ("rpg-full", "rpg-lora", "grpo-full", "rpg-nosync", "rpg-topk")
# (GPU run, --tiny run): the GPU model is gpu_check.py's random Qwen2.5-0.5B-shaped one, in bf16
SETTINGS = {
    False: dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=64, max_steps=12,
                steps_per_generation=2, learning_rate=1e-4, vllm_gpu_memory_utilization=0.3,
                vllm_max_model_length=256),
    True: dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=16, max_steps=8,
               steps_per_generation=2, learning_rate=2e-2),
}
KEY = "sampling/sampling_logp_difference/mean"


def parity_reward(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def train(run: str, model_dir: str, out: str, tiny: bool) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_rpg import RPGConfig, RPGTrainer

    cuda = torch.cuda.is_available()
    settings = dict(SETTINGS[tiny])
    common = dict(output_dir=os.path.join(os.path.dirname(os.path.abspath(out)), f"vllm-{run}"), bf16=cuda,
                  logging_steps=1, report_to="none", save_strategy="no", seed=0, shuffle_dataset=False,
                  dataloader_num_workers=0, use_vllm=True, vllm_mode="colocate", temperature=1.0,
                  vllm_importance_sampling_correction=True, gradient_checkpointing=False, **settings)
    if not cuda:
        common.update(use_cpu=True)
    if run == "rpg-topk":  # per-token ratios, truncated above only: their mean is the mean kept mass
        common.update(top_k=20, vllm_importance_sampling_mode="token_truncate")
    if run == "grpo-full":
        trainer_cls, args = GRPOTrainer, GRPOConfig(**common, beta=0.04)
    else:
        trainer_cls, args = RPGTrainer, RPGConfig(**common, beta=0.05, rpg_reference="periodic",
                                                  rpg_reference_update_steps=3)
    peft_config = (LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
                   if run == "rpg-lora" else None)
    n_prompts = settings["max_steps"] * settings["per_device_train_batch_size"]
    dataset = Dataset.from_dict({"prompt": [f"problem {i}: {i % 7}+{(3 * i) % 10}=" for i in range(n_prompts)]})
    trainer = trainer_cls(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(model_dir), peft_config=peft_config)
    syncs = []
    sync = trainer.vllm_generation.sync_weights

    def counted_sync():  # the control skips every sync after the first
        if run != "rpg-nosync" or not syncs:
            sync()
        syncs.append(trainer.state.global_step)

    trainer.vllm_generation.sync_weights = counted_sync
    start = time.perf_counter()
    trainer.train()
    history = trainer.state.log_history
    per_generation = {int(e["step"]): e[KEY] for e in history if KEY in e}
    result = {"run": run, "device": torch.cuda.get_device_name() if cuda else "cpu (fake vLLM)",
              "dtype": "bf16" if args.bf16 else "fp32", "settings": settings, "sync_steps": syncs,
              "logp_difference": [per_generation[s + 1] for s in syncs if s + 1 in per_generation],
              "ratio_mean": [e["sampling/importance_sampling_ratio/mean"] for e in history
                             if "sampling/importance_sampling_ratio/mean" in e],
              "seconds": time.perf_counter() - start}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"[vllm_check] {run}: {json.dumps(result)}")


def report(files: list[str]) -> int:
    results = {}
    for path in files:
        with open(path) as f:
            r = json.load(f)
        results[r["run"]] = r
    base = next(iter(results.values()))
    print(f"\ndevice: {base['device']}, {base['dtype']}; settings: {base['settings']}")
    drift = {name: r["logp_difference"][-1] - r["logp_difference"][0] for name, r in results.items()}
    stale = drift.get("rpg-nosync")
    failed = []
    for name, r in results.items():
        line = (f"{name:<11} syncs at steps {r['sync_steps']}; mean |log pi_old - log mu| per generation "
                f"[{', '.join(f'{x:.3g}' for x in r['logp_difference'])}] (drift {drift[name]:+.3g})")
        if name == "rpg-topk":
            line += (f"; importance ratio mean {sum(r['ratio_mean']) / len(r['ratio_mean']):.4f} (about the mean kept "
                     "mass of top_k=20, below 1)")
        elif name != "rpg-nosync" and stale is not None:
            ok = drift[name] < 0.25 * stale
            line += "  ok" if ok else "  FAILED: the engine drifts from the policy as if not synced"
            if not ok:
                failed.append(name)
        print(line)
    if stale is None or stale <= 0:
        print("INCONCLUSIVE: the control (rpg-nosync) did not drift; raise the learning rate or the steps")
        return 1
    verdict = "all synced runs hold the policy" if not failed else f"FAILED {failed}"
    print(f"control drift {stale:+.5f}: {verdict}")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train")
    p.add_argument("--run", required=True, choices=RUNS)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "train":
        train(args.run, args.model, args.out, args.tiny)
        return 0
    return report(args.files)


if __name__ == "__main__":
    sys.exit(main())
