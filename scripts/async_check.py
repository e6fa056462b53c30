"""AsyncRPGTrainer against TRL's real asynchronous pipeline on one GPU (driven by `scripts/gpu_check.sh --async`).

The CPU tests (tests/test_async_trainer.py) replace two GPU-only pieces: the rollout worker (a stale worker generating
with the trainer's own copies of past policies) and the FA3 varlen attention kernel (torch SDPA per segment,
`trl_rpg.toy.async_rollouts.VarlenAttention`). Here both are the real ones:

    kernel   the FA3 kernel TRL loads (`packing._flash_attn()`) and the CPU stand-in give the same output on the
             packed rows TRL builds (shared prefixes): the stand-in the tests rely on has the kernel's semantics
    train    AsyncRPGTrainer (and AsyncGRPOTrainer, `--trainer grpo`) with TRL's own `AsyncRolloutWorker` against a
             running `vllm serve` (`serve-command` prints it): LoRA, so that on one GPU the weights reach the server
             as an adapter (`--enable-lora`: a file path over HTTP; the NCCL transfer of full weights needs the server
             on another GPU than the trainer)
    report   the judgement: every step's loss and gradient finite, the rpg/* metrics logged beside TRL's, no trained
             sample older than `max_staleness`, the sampler's log-probs matching the trainer's on the first step
             (TRL's `kl`, KL(mu || pi_theta), at the precision floor: the server serves the policy it was sent), the
             kernel check passed; exit status 1 otherwise

`--tiny` (with `gpu_check.sh --dry-run --async`) runs `train` on CPU with the stand-ins instead (no server, no
kernel: `kernel` is reported as skipped), to check the plumbing; its figures mean nothing about vLLM or FA3.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}={% endif %}")
SETTINGS = {  # (GPU run, --tiny run)
    False: dict(per_device_train_batch_size=16, num_generations=8, max_completion_length=64, max_steps=16,
                learning_rate=1e-4, max_staleness=2, dtype="float32", bf16=False),
    True: dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=3,
               learning_rate=2e-2, max_staleness=2, token_budget=0, use_cpu=True, bf16=False),
}
#: The first step's TRL `kl` above which the server is not serving the policy it was sent (fp32 on both sides).
FIRST_STEP_KL = 1e-3


def serve_command(model: str, port: int) -> str:
    """The `vllm serve` line the async trainer needs on one GPU: TRL's settings (dev mode for /pause and the weight
    endpoints, processed log-probs, the NCCL transfer engine), fp32 as the trainer, and runtime LoRA loading."""
    return ("VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 vllm serve " + shlex.quote(model)
            + f" --port {port} --dtype float32 --gpu-memory-utilization 0.3 --max-model-len 256 --enable-lora "
            "--max-lora-rank 8 --max-loras 6 --logprobs-mode processed_logprobs --max-logprobs -1 "
            "--weight-transfer-config '{\"backend\": \"nccl\"}'")


def parity_reward(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def prepare(model_dir: str) -> None:
    """Give the model's tokenizer a chat template (the async worker renders conversational prompts)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)


def kernel(model_dir: str, out: str) -> None:
    import torch

    result = {"check": "kernel"}
    if not torch.cuda.is_available():
        result["skipped"] = "no CUDA device"
    else:
        try:
            from trl.experimental.async_grpo import packing

            fa3 = packing._flash_attn()
        except Exception as error:  # noqa: BLE001  (no kernel: reported, not raised)
            result["skipped"] = f"the FA3 kernel could not be loaded: {type(error).__name__}: {error}"
        else:
            from trl_rpg.toy.async_rollouts import VarlenAttention

            gen = torch.Generator(device="cuda").manual_seed(0)
            # three samples sharing a prefix, as TreeRow packs them: paths [0..5], [0..5]+[6..8], [0..5]+[9..12]
            kv = torch.tensor(list(range(6)) + list(range(6)) + [6, 7, 8] + list(range(6)) + [9, 10, 11, 12],
                              device="cuda")
            cu_q = torch.tensor([0, 6, 9, 13], dtype=torch.int32, device="cuda")
            cu_k = torch.tensor([0, 6, 15, 25], dtype=torch.int32, device="cuda")
            q = torch.randn(13, 8, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(13, 2, 64, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            args = (q, k.index_select(0, kv), v.index_select(0, kv), cu_q, cu_k, 6, 10)
            got = fa3.flash_attn_varlen_func(*args, softmax_scale=0.125, causal=True)
            got = got[0] if isinstance(got, tuple) else got
            want = VarlenAttention.flash_attn_varlen_func(*(a.float() if torch.is_tensor(a) and a.is_floating_point()
                                                            else a for a in args), softmax_scale=0.125, causal=True)
            result["max_abs_difference"] = float((got.float() - want).abs().max())
            result["passed"] = result["max_abs_difference"] < 2e-2  # bf16 inputs
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def train(trainer_name: str, model_dir: str, out: str, tiny: bool, server: str) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer
    from trl_rpg._compat import async_trainer_on_cpu
    from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention

    settings = dict(SETTINGS[tiny])
    common = dict(output_dir=os.path.join(os.path.dirname(os.path.abspath(out)), f"async-{trainer_name}"),
                  logging_steps=1, report_to="none", save_strategy="no", seed=0, gradient_checkpointing=False,
                  vllm_server_base_url=server, **settings)
    cls, args = ((AsyncRPGTrainer, AsyncRPGConfig(beta=0.1, **common)) if trainer_name == "rpg" else
                 (AsyncGRPOTrainer, AsyncGRPOConfig(**common)))
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"problem {i}: {i % 7}+{(3 * i) % 10}"}]
                                            for i in range(256)]})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    kwargs = dict(peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    if tiny:  # the CPU stand-ins of the tests; on a GPU, TRL's own worker and weight sync
        worker = StaleRolloutWorker(model_dir, dataset, parity_reward, tokenizer,
                                    num_generations=args.num_generations,
                                    max_completion_length=args.max_completion_length, staleness=1,
                                    groups_per_call=args.per_device_train_batch_size // args.num_generations)
        kwargs.update(rollout_worker=worker, weight_transfer=worker)
    context = async_trainer_on_cpu(VarlenAttention) if tiny else _nothing()
    with context:
        trainer = cls(model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset,
                      processing_class=tokenizer, **kwargs)
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    with open(out, "w") as f:
        json.dump({"check": "train", "trainer": trainer_name, "tiny": tiny, "max_staleness": args.max_staleness,
                   "cuda": torch.cuda.is_available(), "logs": logs}, f, indent=1)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def report(paths: list[str]) -> int:
    results = [json.load(open(p)) for p in paths]
    failures = []
    for r in results:
        if r["check"] == "kernel":
            if "skipped" in r:
                print(f"[async_check] kernel: skipped ({r['skipped']})")
            else:
                print(f"[async_check] kernel vs CPU stand-in: max |difference| {r['max_abs_difference']:.2e}")
                if not r["passed"]:
                    failures.append("the FA3 kernel and the CPU stand-in disagree")
            continue
        logs, name = r["logs"], r["trainer"]
        if not logs:
            failures.append(f"{name}: no training step logged")
            continue
        bad = [h["step"] for h in logs if not (math.isfinite(h["loss"]) and math.isfinite(h.get("grad_norm", 0)))]
        stale = max(h.get("sample/staleness_max", 0) for h in logs)
        first_kl = logs[0].get("kl", float("nan"))
        print(f"[async_check] {name}: {len(logs)} steps, loss {logs[0]['loss']:.4g} -> {logs[-1]['loss']:.4g}, "
              f"staleness max {stale}, first step's kl {first_kl:.2e}, dropped "
              f"{sum(h.get('sample/dropped_stale_total', 0) for h in logs):g}")
        if bad:
            failures.append(f"{name}: non-finite loss or gradient at steps {bad}")
        if stale > r["max_staleness"]:
            failures.append(f"{name}: a sample {stale} versions old trained (max_staleness {r['max_staleness']})")
        if name == "rpg" and not all("rpg/divergence" in h and "rpg/w_mean" in h for h in logs):
            failures.append("rpg: the rpg/* metrics are missing from a step")
        if r["cuda"] and not r["tiny"] and not first_kl < FIRST_STEP_KL:
            failures.append(f"{name}: the first step's kl {first_kl:.2e} >= {FIRST_STEP_KL}: the server's log-probs "
                            "are not the policy's")
    for failure in failures:
        print(f"[async_check] FAILED: {failure}")
    print(f"[async_check] {'all checks passed' if not failures else f'{len(failures)} check(s) failed'}")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve-command")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=8000)
    p = sub.add_parser("prepare")
    p.add_argument("--model", required=True)
    p = sub.add_parser("kernel")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train")
    p.add_argument("--trainer", choices=["rpg", "grpo"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--server", default="http://localhost:8000")
    p.add_argument("--tiny", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "serve-command":
        print(serve_command(args.model, args.port))
    elif args.command == "prepare":
        prepare(args.model)
    elif args.command == "kernel":
        kernel(args.model, args.out)
    elif args.command == "train":
        train(args.trainer, args.model, args.out, args.tiny, args.server)
    else:
        return report(args.paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
