"""Two-process colocate vLLM training with the fake engine, launched by tests/test_vllm_generation.py.

Usage: `accelerate launch ... vllm_script.py SPEC.json`, with `tests/vllm_stub` on `PYTHONPATH` (so TRL imports the
fake vLLM as it would the real one). SPEC holds `model_dir`, `output_dir`, `result` (each rank writes
`<result>.rank<R>.json`) and `runs`, trained one after the other in this process; each run has

    name        key of the run in the result file
    trainer     "rpg" or "grpo"
    peft        train a LoRA adapter
    config      RPGConfig / GRPOConfig keyword arguments (on top of tests/_tiny.py `cpu_args`)
    mismatch    FAKE_VLLM_KERNEL_MISMATCH for the run's engine
    compare_to  name of an earlier run whose final parameters this run's are compared with
    server      generate through a fake `trl vllm-serve` (tests/_fake_vllm.py `served`) instead of colocated engines
                (then only the main process, which holds the client, reports what the engine received)

Per run and rank: the engine's syncs against the policy (tests/_fake_vllm.py `record_syncs`), a digest of what each
sync sent (equal on both ranks: the policy is replicated), the engine's seed and completions (its own per rank),
TRL's logged sampler/trainer log-prob difference, the largest parameter difference to `compare_to`, the rows of the
trainer's no-grad log-prob passes, RPG's sampler mode and its logged `rpg/sampler_mismatch_mean`.
"""

import contextlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for _tiny.py and _fake_vllm.py

import torch  # noqa: E402
from _equivalence import lora_config  # noqa: E402
from _fake_vllm import difference, engine_of, gathered, policy_weights, record_syncs, served  # noqa: E402
from _processes import end_processes  # noqa: E402
from _tiny import cpu_args, length_reward, tiny_dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trl_rpg import RPGConfig, RPGTrainer  # noqa: E402


def digest(weights) -> float:
    return float(sum(t.double().abs().sum().item() for _, t in weights))


def run_one(spec, run, finals):
    os.environ["FAKE_VLLM_KERNEL_MISMATCH"] = str(run.get("mismatch", 0.0))
    settings = dict(run["config"], output_dir=os.path.join(spec["output_dir"], run["name"]), ddp_backend="gloo")
    rpg = run["trainer"] == "rpg"
    if run.get("server"):
        settings["vllm_mode"] = "server"
    args = (RPGConfig if rpg else GRPOConfig)(**cpu_args(**settings))
    with served(spec["model_dir"]) if run.get("server") else contextlib.nullcontext():
        trainer = (RPGTrainer if rpg else GRPOTrainer)(
            model=spec["model_dir"], reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(32),
            processing_class=AutoTokenizer.from_pretrained(spec["model_dir"]),
            peft_config=lora_config() if run.get("peft") else None)
        no_grad_rows = count_no_grad_rows(trainer)
        expected = record_syncs(trainer)
        trainer.train()
    with gathered(trainer.model):
        finals[run["name"]] = policy_weights(trainer)
    result = {"no_grad_rows": no_grad_rows[0], "sampler_logps": trainer.sampler_logps.mode if rpg else None,
              "mismatch": [e["rpg/sampler_mismatch_mean"] for e in trainer.state.log_history
                           if "rpg/sampler_mismatch_mean" in e]}
    if run.get("compare_to"):
        result["difference_to"] = difference(finals[run["name"]], finals[run["compare_to"]])
    if run.get("server") and not trainer.accelerator.is_main_process:
        return result  # the client, and so the engine, is the main process's
    engine = engine_of(trainer)
    last = expected[-1]
    result.update({
        "syncs": len(engine.syncs), "observed_syncs": len(expected),
        "sync_counts": sorted({r.sync_count for r in engine.requests}),
        "sync_differences": [difference(dict(s.weights), e["policy"]) for s, e in zip(engine.syncs, expected)],
        "sent_twice": sum(len(s.weights) - len(dict(s.weights)) for s in engine.syncs),
        "digests": [digest(s.weights) for s in engine.syncs],
        "moved": difference(expected[0]["policy"], last["policy"]),
        "reference_gap": None if last["reference"] is None else difference(last["reference"], last["policy"]),
        "with_ref_gap": difference(last["with_ref"], last["policy"]) if "with_ref" in last else None,
        "seed": engine.seed,
        "completions": [r.completions for r in engine.requests],
        "logp_difference": [e["sampling/sampling_logp_difference/max"] for e in trainer.state.log_history
                            if "sampling/sampling_logp_difference/max" in e],
        "is_deepspeed": bool(trainer.is_deepspeed_enabled),
        "num_processes": trainer.accelerator.num_processes,
    })
    return result


def count_no_grad_rows(trainer) -> list[int]:
    """A one-item list counting the rows of the trainer's log-prob passes made without gradient, as they happen."""
    rows, original = [0], trainer._get_per_token_logps_and_entropies

    def counted(model, input_ids, *args, **kwargs):
        if not torch.is_grad_enabled():
            rows[0] += int(input_ids.size(0))
        return original(model, input_ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted
    return rows


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.manual_seed(0)
    finals, results = {}, {}
    for run in spec["runs"]:
        results[run["name"]] = run_one(spec, run, finals)
    rank = int(os.environ.get("RANK", "0"))
    with open(f"{spec['result']}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
    end_processes()  # only after a run that succeeded: a failed one exits at once
