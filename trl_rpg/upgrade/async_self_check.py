"""The upgrade self-check of `AsyncRPGTrainer`: what it relies on in TRL's asynchronous trainer, checked on the
installed TRL with a tiny model in seconds (the properties `upgrade_check` runs for `RPGTrainer`, registered for
`async_upgrade_guard.REVIEW` with `upgrade_check.register_properties`; `upgrade_verdict` runs them in a fresh
process and caches the verdict per installed version).

- `async_batch_fields`: TRL's collator packs rollout samples into the flat per-token tensors RPG's loss reads, with
  their meaning: `token_index` points at the packed position that predicts each trained token, `old_log_probs` and
  `advantages` are that token's sampler log-prob and its sample's advantage, `global_n_tokens` the micro-batch's
  trained tokens over every row (the token normaliser `loss.packed_token_mean` divides by).
- `async_staleness_filter`: TRL's rollout dataset drops a sample more than `max_staleness` versions old (counted in
  `sample/dropped_stale_total`) and passes the others on with the worker's fields.
- `async_reduction`: RPG reduced to TRL's loss (`beta=0`, the differentiable estimator, no dual clip, TRL's clip
  widths) trains to `AsyncGRPOTrainer`'s parameters (2 steps of 2 accumulated micro-batches, staleness 1, plain SGD
  without clipping, so a wrong constant factor shows).
- `async_weight_sync`: TRL sends the policy to the worker after every optimizer step and moves the version the worker
  stamps on what it samples (versions 1..steps+1, version 1 the initial weights).

The worker and the attention kernel are the CPU stand-ins (`trl_rpg.toy.async_rollouts`). A property returns None
when it holds, else what it saw. A test passes changed TRL classes through `ctx.memo["async_classes"]`.
"""

from __future__ import annotations

import queue
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from . import reviews
from .self_check import MIN_MOVEMENT, PARAM_ATOL, CheckContext, Property

GENERATIONS, LENGTH, STEPS = 4, 6, 2
PROMPTS = ("1+2", "3+4", "5-2", "9-6", "2+7", "8-1", "4+4", "6-3")


def _classes(ctx: CheckContext) -> dict:
    """TRL's classes the properties exercise (a test replaces some in `ctx.memo["async_classes"]`)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout, RolloutQueueDataset
    from trl.experimental.async_grpo.packing import TreeRow

    rpg_class = ctx.rpg_class or reviews.reviewed_class("AsyncRPGTrainer")  # handed in, never imported here
    return {"AsyncGRPOTrainer": AsyncGRPOTrainer, "AsyncGRPOConfig": AsyncGRPOConfig, "TreeRow": TreeRow,
            "DataCollatorForRollout": DataCollatorForRollout, "RolloutQueueDataset": RolloutQueueDataset,
            "AsyncRPGTrainer": rpg_class, **ctx.memo.get("async_classes", {})}


def _sample(prompt: list[int], completion: list[int], advantage: float, version: int = 0, group: int = 0) -> dict:
    logps = [-0.05 * (i + 1) - 0.01 * completion[i] for i in range(len(completion))]
    return {"input_ids": np.asarray(prompt + completion, dtype=np.int64),
            "completion_mask": np.asarray([0] * len(prompt) + [1] * len(completion), dtype=np.int64),
            "old_log_probs": np.asarray([0.0] * len(prompt) + logps, dtype=np.float32), "advantage": advantage,
            "group_id": group, "metrics": {}, "model_version": version}


def async_batch_fields(ctx: CheckContext) -> str | None:
    classes = _classes(ctx)
    prompt = [2, 5, 7, 3]
    rows = [[_sample(prompt, [10, 11, 12], 0.5), _sample(prompt, [10, 11, 14, 1], -1.5)],  # a shared prefix
            [_sample([4, 6], [15, 16], 1.0, group=1)]]
    packed_rows = []
    for samples in rows:
        row = classes["TreeRow"]()
        for s in samples:
            row.add(s)
        packed_rows.append(row)
    batch = classes["DataCollatorForRollout"](0, num_processes=len(rows))([packed_rows])
    needed = {"input_ids", "attention_mask", "position_ids", "shift_labels", "token_index", "old_log_probs",
              "advantages", "global_n_tokens"}
    if needed - set(batch):
        return f"the packed micro-batch lacks {sorted(needed - set(batch))}"
    trained = sum(int(s["completion_mask"].sum()) for samples in rows for s in samples)
    if batch["global_n_tokens"].tolist() != [float(trained)] * len(rows):
        return (f"global_n_tokens is {batch['global_n_tokens'].tolist()}, not the micro-batch's {trained} trained "
                f"tokens on every row")
    for r, samples in enumerate(rows):
        selected = batch["token_index"][r] >= 0
        index = batch["token_index"][r][selected]
        got = sorted(zip(batch["shift_labels"][r][index].tolist(), batch["old_log_probs"][r][selected].tolist(),
                         batch["advantages"][r][selected].tolist(), strict=True))
        want = sorted((t, float(lp), float(s["advantage"])) for s in samples for t, lp, m in zip(
            s["input_ids"][1:].tolist(), s["old_log_probs"][1:].tolist(), s["completion_mask"][1:].tolist(),
            strict=True) if m)
        if len(got) != len(want) or any(g[0] != w[0] or abs(g[1] - w[1]) > 1e-6 or abs(g[2] - w[2]) > 1e-6
                                        for g, w in zip(got, want)):
            return (f"row {r}: the trained tokens (predicted token, sampler log-prob, advantage) are {got[:4]}..., "
                    f"not the samples' {want[:4]}...")
    return None


class _Samples:
    def __init__(self, samples):
        self.samples = list(samples)

    def get(self, timeout=None):
        if not self.samples:
            raise queue.Empty
        return self.samples.pop(0)

    def qsize(self) -> int:
        return len(self.samples)


def async_staleness_filter(ctx: CheckContext) -> str | None:
    from types import SimpleNamespace

    from accelerate import PartialState

    PartialState()  # TRL's dataset logs through accelerate's logger
    classes = _classes(ctx)

    def exhausted(stale_after_s):
        raise StopIteration("no more samples")

    samples = [SimpleNamespace(**_sample([1, 2], [3, 4], 0.25 * v, version=v, group=v), enqueued_at=None)
               for v in (5, 2, 3, 4)]  # staleness 0, 3, 2, 1 at version 5
    metrics = defaultdict(list)
    dataset = classes["RolloutQueueDataset"](_Samples(samples), lambda: 5, exhausted, 1.0, metrics, max_staleness=2)
    stream = iter(dataset)
    passed = [next(stream) for _ in range(3)]
    versions = [int(round(p["advantage"] / 0.25)) for p in passed]
    if versions != [5, 3, 4]:
        return f"with max_staleness=2 at version 5, samples of versions [5, 2, 3, 4] gave those of {versions}"
    if sum(metrics["sample/dropped_stale_total"]) != 1:
        return f"one sample dropped, sample/dropped_stale_total = {metrics['sample/dropped_stale_total']}"
    for item, sample in zip(passed, [samples[0], samples[2], samples[3]], strict=True):
        if not all(np.array_equal(item[key], getattr(sample, key)) for key in ("input_ids", "completion_mask",
                                                                              "old_log_probs")):
            return "a sample passed on does not carry the worker's input_ids, completion_mask and old_log_probs"
    return None


def _reward(completions, **kwargs) -> list[float]:
    return [min(len(c[-1]["content"]), LENGTH) / LENGTH for c in completions]


def _model_dir(ctx: CheckContext) -> str:
    if "async_model" not in ctx.memo:
        from ..toy.model import build_model
        from ..toy.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()
        model = build_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2, seed=0, intermediate_size=32,
                            max_position_embeddings=64, tie_word_embeddings=False)
        path = Path(ctx.workdir) / "async-model"
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        ctx.memo["async_model"] = str(path)
    return ctx.memo["async_model"]


def _run(ctx: CheckContext, name: str) -> dict:
    """Train the trainer `name` ("AsyncGRPOTrainer" or "AsyncRPGTrainer", reduced to TRL's loss) once; keep the
    parameters before and after each step and the versions the worker received."""
    if name in ctx.memo:
        return ctx.memo[name]
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    from .._compat import async_trainer_on_cpu
    from ..toy.async_rollouts import StaleRolloutWorker, VarlenAttention
    classes, path = _classes(ctx), _model_dir(ctx)
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS]})
    worker = StaleRolloutWorker(path, data, _reward, tokenizer, num_generations=GENERATIONS,
                                max_completion_length=LENGTH, staleness=1, seed=0, groups_per_call=2)
    settings = dict(output_dir=str(Path(ctx.workdir) / name), per_device_train_batch_size=2 * GENERATIONS,
                    num_generations=GENERATIONS, max_completion_length=LENGTH, max_steps=STEPS,
                    gradient_accumulation_steps=2, optim="sgd", learning_rate=1.0, lr_scheduler_type="constant",
                    max_grad_norm=0.0, max_staleness=4, token_budget=0, use_cpu=True, bf16=False, report_to="none",
                    save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True, epsilon=0.2, epsilon_high=0.2)
    if name == "AsyncRPGTrainer":
        args = classes["AsyncRPGTrainer"].config_class(**settings, beta=0.0, rpg_estimator="differentiable",
                                                       rpg_dual_clip_c=None)
    else:
        args = classes["AsyncGRPOConfig"](**settings)
    after: dict[int, dict] = {}

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            after[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}

    with async_trainer_on_cpu(VarlenAttention):
        trainer = classes[name](path, reward_funcs=_reward, args=args, train_dataset=data,
                                processing_class=tokenizer, rollout_worker=worker, weight_transfer=worker,
                                callbacks=[Record()])
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
    ctx.memo[name] = {"before": before, "after": after, "versions": worker.versions,
                      "sampled_with": list(worker.sampled_with)}
    return ctx.memo[name]


def _difference(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


def async_reduction(ctx: CheckContext) -> str | None:
    grpo, rpg = _run(ctx, "AsyncGRPOTrainer"), _run(ctx, "AsyncRPGTrainer")
    if sorted(rpg["after"]) != list(range(1, STEPS + 1)):
        return f"AsyncRPGTrainer took the steps {sorted(rpg['after'])}, not 1..{STEPS}"
    moved = _difference(grpo["after"][STEPS], grpo["before"])
    difference = _difference(rpg["after"][STEPS], grpo["after"][STEPS])
    if moved < MIN_MOVEMENT:
        return f"AsyncGRPOTrainer moved its parameters by {moved:.2e} only (< {MIN_MOVEMENT})"
    if difference > PARAM_ATOL:
        return (f"RPG reduced to TRL's loss ends {difference:.2e} from AsyncGRPOTrainer's parameters (> {PARAM_ATOL}; "
                "the packed loss, its token normaliser or the accumulation scaling changed)")
    return None


def async_weight_sync(ctx: CheckContext) -> str | None:
    rpg = _run(ctx, "AsyncRPGTrainer")
    versions, after = rpg["versions"], rpg["after"]
    if sorted(versions) != list(range(1, STEPS + 2)):
        return f"the worker received the versions {sorted(versions)}, not 1..{STEPS + 1} (one per step)"
    states = {1: rpg["before"], **{step + 1: params for step, params in after.items()}}
    for version, params in states.items():
        sent = versions[version]
        if set(sent) != set(params) or any(not torch.equal(sent[n], params[n]) for n in params):
            return f"version {version} as the worker received it is not the policy's parameters"
    if not rpg["sampled_with"] or not set(rpg["sampled_with"]) <= set(versions):
        return f"the worker sampled with versions {sorted(set(rpg['sampled_with']))} it was never sent"
    return None


#: The self-check of `AsyncRPGTrainer` (`upgrade_check.PROPERTIES[async_upgrade_guard.REVIEW]`).
ASYNC_PROPERTIES: tuple[Property, ...] = (
    Property("async_batch_fields", "TRL's collator packs the per-token fields RPG's loss reads with their meaning "
             "(token_index, old_log_probs, advantages, global_n_tokens)", f"{__name__}:async_batch_fields"),
    Property("async_staleness_filter", "TRL drops samples older than max_staleness and passes the others on with "
             "the worker's fields", f"{__name__}:async_staleness_filter"),
    Property("async_reduction", "RPG reduced to TRL's loss trains to AsyncGRPOTrainer's parameters (the packing, "
             "the token normaliser, the accumulation)", f"{__name__}:async_reduction"),
    Property("async_weight_sync", "TRL sends the policy after every step and moves the version the worker stamps",
             f"{__name__}:async_weight_sync"),
)

__all__ = ["ASYNC_PROPERTIES", "async_batch_fields", "async_reduction", "async_staleness_filter",
           "async_weight_sync"]

