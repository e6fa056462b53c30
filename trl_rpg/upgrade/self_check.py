"""The self-check: the behaviour RPG relies on in TRL, checked on the installed TRL with a tiny model in seconds.

When the installed TRL's code differs from the reviewed code (`upgrade_guard`), RPG may still train on it if that
code still does what RPG relies on. Each property below checks one thing, on a tiny Qwen2 and a character tokenizer
built in memory (`trl_rpg.toy`; nothing downloaded, nothing written but a temporary folder), on CPU:

- `reduction`: RPG reduced to GRPO (`beta=0`, the differentiable estimator, no dual clip) trains to
  `GRPOTrainer`'s parameters, each generation batch reused for 2 optimizer steps of 2 accumulated micro-batches;
  new `GRPOConfig` fields sit at their defaults in both runs, so a default that changed GRPO's training shows here.
- `generation_batch`: the generation batch carries the fields RPG reads, with the meaning it reads them with.
- `grpo_kl_term`: GRPO's KL term is what RPG's drop-in contract says it is (docs/drop-in.md).
- `checkpoint_resume`: TRL calls the checkpoint and resume hooks where RPG expects them.

Completions are a fixed function of the prompt (`_Scripted`), so the two trainers of a pair see the same data and
a float difference in the parameters can never flip a token; the optimizer is plain SGD without clipping, so a
wrong constant factor in a loss moves the parameters differently. A property returns `None` when it holds, else
what it saw. `upgrade_verdict` runs them in a fresh process (no process group, no GPU, no telemetry) and caches the
verdict. Another trainer registers its own properties (`register_properties`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

#: Parameters must agree to this (float32; the reduction computes the same operations: measured 0.0).
PARAM_ATOL = 1e-5
#: ...and move by at least this much, so that a difference cannot hide under the tolerance.
MIN_MOVEMENT = 1e-2
#: Values read from a batch or a loss must agree to this (relative, with an absolute floor of 1e-6).
VALUE_RTOL = 1e-4


@dataclass(frozen=True)
class Property:
    """One property a changed TRL must keep: `name`, `why` (what RPG relies on), `target` ("module:function", a
    function of a `CheckContext` returning None or what failed)."""

    name: str
    why: str
    target: str

    def function(self) -> Callable[[CheckContext], str | None]:
        import importlib

        module, attribute = self.target.split(":")
        return getattr(importlib.import_module(module), attribute)


@dataclass
class CheckContext:
    """What the properties share: the trainer classes under test (a test passes patched ones) and the runs made."""

    grpo_class: type
    rpg_class: type
    workdir: str
    memo: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------------
# The tiny set-up
# ---------------------------------------------------------------------------------------------------------------------

PROMPTS = ("1+2", "3+4", "5-2", "9-6", "2+7", "8-1", "4+4", "6-3")
MAX_COMPLETION_LENGTH = 6


def _completion(prompt_ids, index: int, vocab: list[int], eos: int) -> list[int]:
    """Lengths 1..MAX_COMPLETION_LENGTH, distinct within a group of 4; one of MAX_COMPLETION_LENGTH has no EOS."""
    seed = sum((k + 1) * int(t) for k, t in enumerate(prompt_ids))
    length = 1 + (seed + 5 * index) % MAX_COMPLETION_LENGTH
    body = [vocab[(7 * seed + 13 * index + 3 * k) % len(vocab)] for k in range(length)]
    return body + [eos] if length < MAX_COMPLETION_LENGTH else body


class _Scripted:
    """Mixin: "generation" returns `_completion`s; with `use_vllm` set, the sampler's log-probs too (a stand-in
    for vLLM's, some far from the policy's so that vLLM's correction truncates or masks)."""

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        tokenizer = self.processing_class
        vocab = sorted(i for i in tokenizer.get_vocab().values() if i not in tokenizer.all_special_ids)
        seen: dict[tuple, int] = {}
        completions = []
        for ids in prompt_ids:
            index = seen.get(tuple(ids), 0)
            seen[tuple(ids)] = index + 1
            completions.append(_completion(ids, index, vocab, tokenizer.eos_token_id))
        if not self.use_vllm:
            return completions, None
        return completions, [[-1.0 - 2.5 * ((len(c) + k) % 3) for k in range(len(c))] for c in completions]


def length_reward(completions, **kwargs) -> list[float]:
    return [len(c) / MAX_COMPLETION_LENGTH for c in completions]


def _settings(workdir: str, name: str, **overrides) -> dict:
    """GRPO settings shared by both trainers of a pair: every field whose RPGConfig default differs is set."""
    settings = dict(
        output_dir=str(Path(workdir) / name), per_device_train_batch_size=4, num_generations=4,
        gradient_accumulation_steps=2, steps_per_generation=4, max_completion_length=MAX_COMPLETION_LENGTH,
        max_steps=2, beta=0.0, epsilon=0.2, epsilon_high=0.28, scale_rewards="group", loss_type="dapo",
        optim="sgd", learning_rate=1.0, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=0.0,
        weight_decay=0.0, logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    settings.update(overrides)
    return settings


def _rpg_settings(workdir: str, name: str, **overrides) -> dict:
    return {**_settings(workdir, name, **overrides), "rpg_estimator": "differentiable", "rpg_dual_clip_c": None,
            "rpg_reference": "sampling"}


def _build(trainer_class, args):
    from datasets import Dataset

    from ..toy.model import build_model
    from ..toy.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2, seed=0, intermediate_size=32,
                        max_position_embeddings=64, tie_word_embeddings=False)
    data = Dataset.from_dict({"prompt": list(PROMPTS)})
    return trainer_class(model=model, reward_funcs=length_reward, args=args, train_dataset=data,
                         processing_class=tokenizer)


def _parameters(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}


def _max_difference(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and bool(torch.allclose(got.float(), want.float(), rtol=VALUE_RTOL, atol=1e-6))


def _recording(base: type) -> type:
    """`base` with the hooks RPG relies on recorded in order (`events`)."""

    class Recording(_Scripted, base):
        events: list

        def _save_checkpoint(self, model, trial):
            self.events.append(("save", self.state.global_step))
            return super()._save_checkpoint(model, trial)

        def _load_optimizer_and_scheduler(self, checkpoint):
            self.events.append(("load", checkpoint))
            return super()._load_optimizer_and_scheduler(checkpoint)

        def _generate_and_score_completions(self, inputs):
            self.events.append(("generate", self._step))
            return super()._generate_and_score_completions(inputs)

        def _prepare_inputs(self, generation_batch):
            self.events.append(("micro-batch", self._step))
            return super()._prepare_inputs(generation_batch)

    Recording.events = []
    return Recording


def _train(ctx: CheckContext, key: str, base: type, args, resume_from=None) -> dict:
    """Train (once per `key`) and keep the parameters and the recorded hooks."""
    if key not in ctx.memo:
        trainer_class = _recording(base)
        trainer_class.events = []
        trainer = _build(trainer_class, args)
        before = _parameters(trainer)
        trainer.train(resume_from_checkpoint=resume_from)
        ctx.memo[key] = {"before": before, "after": _parameters(trainer), "events": list(trainer_class.events),
                         "output_dir": args.output_dir}
    return ctx.memo[key]


# ---------------------------------------------------------------------------------------------------------------------
# The properties
# ---------------------------------------------------------------------------------------------------------------------


def _rpg_run(ctx: CheckContext) -> dict:
    args = ctx.rpg_class.config_class(**_rpg_settings(ctx.workdir, "rpg", save_strategy="steps", save_steps=1))
    return _train(ctx, "rpg", ctx.rpg_class, args)


def reduction(ctx: CheckContext) -> str | None:
    from trl import GRPOConfig

    grpo = _train(ctx, "grpo", ctx.grpo_class, GRPOConfig(**_settings(ctx.workdir, "grpo")))
    rpg = _rpg_run(ctx)
    moved, diff = _max_difference(grpo["after"], grpo["before"]), _max_difference(rpg["after"], grpo["after"])
    if moved < MIN_MOVEMENT:
        return f"GRPOTrainer barely trained (largest change {moved:.3g} < {MIN_MOVEMENT}): nothing to compare"
    if diff > PARAM_ATOL:
        return (f"RPG and GRPO parameters differ by {diff:.3g} (> {PARAM_ATOL}) after 2 optimizer steps on one reused "
                f"generation batch: GRPO's loss, batch reuse or accumulation no longer trains as RPG's does")
    return None


def _logps(trainer, batch: dict, model=None, grad: bool = False) -> torch.Tensor:
    """A model's (default: the policy's) per-token log-probs of the batch's completions (TRL's own function, which
    RPG's loss calls)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.set_grad_enabled(grad):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model or trainer.model, ids, mask,
                                                                 batch["completion_ids"].size(1))
    return logps


def _perturbed_copy(model) -> torch.nn.Module:
    """A reference model that differs from the policy."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for k, p in enumerate(reference.parameters()):
            p.add_(0.05 * torch.sin(torch.arange(p.numel(), dtype=p.dtype) + k).view_as(p))
    return reference.eval()


def _advantage_problems(batch: dict, trainer) -> list[str]:
    """RPG's default `scale_rewards="none"` reads the advantage as reward - its group's mean (rows in groups of 4)."""
    texts = trainer.processing_class.batch_decode(batch["completion_ids"], skip_special_tokens=True)
    rewards = torch.tensor(length_reward(texts))
    want = rewards - rewards.view(-1, 4).mean(-1).repeat_interleave(4)
    if not _close(batch["advantages"].view(-1), want):
        return ["advantages are not reward - group mean under scale_rewards='none'"]
    return []


def _batch_trainer(ctx: CheckContext):
    """One GRPOTrainer whose layout is aligned (2 micro-batches per generation batch, 2 accumulated): on-policy."""
    if "batch_trainer" not in ctx.memo:
        from trl import GRPOConfig

        args = GRPOConfig(**_settings(ctx.workdir, "batch", steps_per_generation=2, scale_rewards="none"))
        trainer = _build(_recording(ctx.grpo_class), args)
        trainer.model.train()
        ctx.memo["batch_trainer"] = trainer
    return ctx.memo["batch_trainer"]


def _generate(trainer, **attributes) -> dict:
    """One generation batch (2 prompts x 4 completions) with the trainer's `attributes` set for the call."""
    saved = {name: getattr(trainer, name) for name in attributes}
    for name, value in attributes.items():
        setattr(trainer, name, value)
    try:
        rows = [{"prompt": prompt} for prompt in PROMPTS[:2] for _ in range(4)]
        return trainer._generate_and_score_completions(rows)
    finally:
        for name, value in saved.items():
            setattr(trainer, name, value)


def _simulated_vllm(trainer, mode: str) -> dict:
    """What a vLLM run sets (the engine replaced by `_Scripted`'s sampler log-probs; its weight sync a no-op)."""
    trainer.vllm_generation = SimpleNamespace(sync_weights=lambda: None)
    trainer._last_loaded_step = trainer.state.global_step
    return {"use_vllm": True, "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": mode}


def _vllm_ratio(old, sampling, mask, mode: str, low, high) -> torch.Tensor:
    """vLLM's correction as RPG reads it: pi_old / mu per token, or per sequence (the product over its tokens),
    truncated to [low, high] (`*_truncate`) or set to 0 outside it (`*_mask`)."""
    diff = (old - sampling) * mask
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    low, high = (-math.inf if low is None else low), (math.inf if high is None else high)
    if mode.endswith("truncate"):
        return ratio.clamp(min=low, max=high)
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def generation_batch(ctx: CheckContext) -> str | None:
    from ..run.batch import unknown_fields

    trainer = _batch_trainer(ctx)
    problems, lacking = [], {}
    for mode in ("token_truncate", "sequence_mask"):  # on-policy: TRL still scores old log-probs for the ratio
        batch = _generate(trainer, **_simulated_vllm(trainer, mode))
        missing = [k for k in ("old_per_token_logps", "importance_sampling_ratio", "sampling_per_token_logps")
                   if batch.get(k) is None]
        if missing:
            lacking.setdefault(", ".join(missing), []).append(mode)
            continue
        mask = batch["completion_mask"].float()
        want = _vllm_ratio(batch["old_per_token_logps"], batch["sampling_per_token_logps"], mask, mode,
                           trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max)
        got = batch["importance_sampling_ratio"]
        if not _close(got * (mask if got.size(-1) > 1 else 1), want * (mask if want.size(-1) > 1 else 1)):
            level, bound = mode.split("_")
            problems.append(f"importance_sampling_ratio ({mode}) is not pi_old / mu per {level}, {bound}d at "
                            "vllm_importance_sampling_clip_min/max (RPG weighs its loss by it)")
        if not _close(batch["old_per_token_logps"] * mask, _logps(trainer, batch) * mask):
            problems.append("old_per_token_logps are not the policy's log-probs at generation")
    problems = [f"under vLLM's importance-sampling correction ({', '.join(modes)}; on-policy) the batch lacks "
                f"{fields} (RPG's loss weighs every term by importance_sampling_ratio)"
                for fields, modes in lacking.items()] + problems
    batch = _generate(trainer, num_iterations=2)  # each batch used twice: off-policy
    mask = batch["completion_mask"].float()
    if batch.get("old_per_token_logps") is None:
        problems.append("with batch reuse (num_iterations=2) the batch lacks old_per_token_logps (RPG's sampler)")
    elif not _close(batch["old_per_token_logps"] * mask, _logps(trainer, batch) * mask):
        problems.append("old_per_token_logps are not the policy's log-probs at generation")
    problems += _advantage_problems(batch, trainer)
    if int(batch["num_items_in_batch"]) != int(mask.sum()):
        problems.append(f"num_items_in_batch is {int(batch['num_items_in_batch'])}, not the batch's {int(mask.sum())} "
                        "completion tokens (RPG's 'dapo' aggregation divides by it)")
    trainer.beta, trainer.ref_model = 0.04, _perturbed_copy(trainer.model)  # a reference model, as with beta > 0
    try:
        batch = _generate(trainer)
        ref = batch.get("ref_per_token_logps")
        if ref is None or not _close(ref * mask, _logps(trainer, batch, trainer.ref_model) * mask):
            problems.append("with beta > 0 ref_per_token_logps is missing or not the reference model's log-probs")
    finally:
        trainer.beta, trainer.ref_model = 0.0, None
    unknown = unknown_fields(batch)
    if unknown:
        problems.append(f"the batch carries fields RPG cannot checkpoint or regroup: {', '.join(unknown)} "
                        "(trl_rpg.run.batch.KNOWN_FIELDS)")
    return "; ".join(dict.fromkeys(problems)) or None


def _k3(ref: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    return torch.exp(ref - logps) - (ref - logps) - 1


def _kl_part(trainer, inputs: dict, beta: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """GRPOTrainer's loss with `beta` minus its loss with 0 (the KL term), and that difference's gradient."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    losses = []
    for value in (beta, 0.0):
        trainer.beta = value
        losses.append(trainer._compute_loss(trainer.model, dict(inputs)))
    difference = losses[0] - losses[1]
    return difference.detach(), list(torch.autograd.grad(difference, params))


def grpo_kl_term(ctx: CheckContext) -> str | None:
    """GRPO's KL term, as RPG's drop-in contract describes it: beta x k3(ref / pi), weighted by GRPO's importance
    ratio at `importance_sampling_level` (`use_bias_correction_kl`, its default), never by vLLM's correction."""
    trainer = _batch_trainer(ctx)
    batch = _generate(trainer, num_iterations=2)
    mask = batch["completion_mask"].float()
    steps = torch.arange(mask.size(1), dtype=torch.float32)
    shift = 0.3 * torch.sin(steps + torch.arange(mask.size(0)).unsqueeze(1))  # w varies along each completion
    inputs = {**batch, "old_per_token_logps": batch["old_per_token_logps"] - shift,
              "ref_per_token_logps": batch["old_per_token_logps"] + 0.2 * torch.cos(3 * steps),
              "importance_sampling_ratio": 1.5 + 0 * mask}
    beta, problems = 0.04, []
    saved = {k: getattr(trainer, k, None) for k in ("beta", "loss_type", "importance_sampling_level", "use_vllm",
                                                    "vllm_importance_sampling_correction",
                                                    "current_gradient_accumulation_steps")}
    trainer.loss_type, trainer.use_vllm, trainer.vllm_importance_sampling_correction = "bnpo", True, True
    trainer.current_gradient_accumulation_steps = 2  # set by the training loop
    try:
        for level in ("token", "sequence"):
            trainer.importance_sampling_level = level
            got, got_grad = _kl_part(trainer, inputs, beta)
            logps = _logps(trainer, inputs, grad=True)
            log_w = logps - inputs["old_per_token_logps"]
            if level == "sequence":
                log_w = ((log_w * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0))
            term = beta * _k3(inputs["ref_per_token_logps"], logps) * torch.exp(log_w)
            want = (term * mask).sum() / mask.sum() / trainer.current_gradient_accumulation_steps
            params = [p for p in trainer.model.parameters() if p.requires_grad]
            want_grad = torch.autograd.grad(want, params)
            scale = max(g.abs().max().item() for g in want_grad)
            grad_gap = max((a - b).abs().max().item() for a, b in zip(got_grad, want_grad))
            if not _close(got, want.detach()) or grad_gap > VALUE_RTOL * scale + 1e-9:
                problems.append(f"at importance_sampling_level='{level}' GRPO's KL term is not beta x k3 weighted by "
                                f"its {level}-level importance ratio, outside vLLM's correction (value "
                                f"{got.item():.6g}, expected {want.item():.6g}; gradient off by {grad_gap:.3g})")
    finally:
        for name, value in saved.items():
            setattr(trainer, name, value)
    return "; ".join(problems) or None


def checkpoint_resume(ctx: CheckContext) -> str | None:
    """TRL calls `_save_checkpoint` after each saved optimizer step, `_load_optimizer_and_scheduler` once with the
    checkpoint before the first micro-batch of a resumed run, and uses the generation buffer RPG restores there: a
    run resumed in the middle of a reused generation batch trains to the uninterrupted run's parameters."""
    run = _rpg_run(ctx)
    saves = [step for event, step in run["events"] if event == "save"]
    if saves != [1, 2]:
        return f"_save_checkpoint was called at steps {saves}, not after each saved optimizer step [1, 2]"
    checkpoint = str(Path(run["output_dir"]) / "checkpoint-1")
    args = ctx.rpg_class.config_class(**_rpg_settings(ctx.workdir, "rpg", save_strategy="no"))
    resumed = _train(ctx, "resumed", ctx.rpg_class, args, resume_from=checkpoint)
    events = resumed["events"]
    loads = [i for i, (event, value) in enumerate(events) if event == "load" and value == checkpoint]
    first_batch = next((i for i, (event, _) in enumerate(events) if event == "micro-batch"), len(events))
    if len(loads) != 1 or loads[0] > first_batch:
        return (f"_load_optimizer_and_scheduler was not called once with {checkpoint} before the first micro-batch "
                f"(calls: {events})")
    if any(event == "generate" for event, _ in events):
        return "the resumed run generated a new batch instead of reusing the generation buffer RPG restored"
    diff = _max_difference(resumed["after"], run["after"])
    if diff > PARAM_ATOL:
        return f"the resumed run ends {diff:.3g} away from the uninterrupted run's parameters (> {PARAM_ATOL})"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# The registry and the run
# ---------------------------------------------------------------------------------------------------------------------

#: The properties of each trainer's review, by the trainer's name (`upgrade_guard.REVIEWS`).
PROPERTIES: dict[str, tuple[Property, ...]] = {"RPGTrainer": (
    Property("reduction", "RPG reduced to GRPO trains to GRPOTrainer's parameters with batch reuse and gradient "
             "accumulation (new GRPOConfig fields at their defaults)", f"{__name__}:reduction"),
    Property("generation_batch", "the generation batch carries the fields RPG reads, with their meaning "
             "(old_per_token_logps, vLLM's importance_sampling_ratio, ref_per_token_logps, advantages, "
             "num_items_in_batch)", f"{__name__}:generation_batch"),
    Property("grpo_kl_term", "GRPO's KL term is beta x k3 weighted by its importance ratio, outside vLLM's "
             "correction (the drop-in contract)", f"{__name__}:grpo_kl_term"),
    Property("checkpoint_resume", "TRL calls the checkpoint and resume hooks where RPG expects them (a resumed run "
             "trains to the uninterrupted run's parameters)", f"{__name__}:checkpoint_resume"),
)}


def register_properties(trainer: str, *properties: Property) -> None:
    """Add `properties` to the self-check of `trainer` (e.g. `"AsyncRPGTrainer"`); each `target` must be importable
    in a fresh process."""
    PROPERTIES[trainer] = (*PROPERTIES.get(trainer, ()), *properties)


def default_context(workdir: str, rpg_class: type | None) -> CheckContext:
    """The context of the self-check of `rpg_class`, the trainer under review, handed in by the check's process from
    its `Review` (this module never imports a trainer), against TRL's `GRPOTrainer`."""
    from trl import GRPOTrainer

    return CheckContext(grpo_class=GRPOTrainer, rpg_class=rpg_class, workdir=workdir)


__all__ = ["MIN_MOVEMENT", "PARAM_ATOL", "PROPERTIES", "CheckContext", "Property", "checkpoint_resume",
           "default_context", "generation_batch", "grpo_kl_term", "reduction", "register_properties"]
