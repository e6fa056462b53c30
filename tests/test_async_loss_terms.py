"""Lines of `AsyncRPGTrainer` and of its CPU stand-in worker that a passing run would not show wrong (issue 44): the
dual clip in the loss, the MoE auxiliary loss's accumulation scaling, the stand-in's advantages and temperature
against TRL's own code on the same inputs, and `TRL_RPG_ALLOW_UNREVIEWED=0` read as "no". The loss is called
directly on a packed micro-batch TRL's collator builds from the stand-in's samples."""

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _tiny import length_reward, save_tiny_model
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout  # noqa: E402
from trl.experimental.async_grpo.async_rollout_worker import (  # noqa: E402
    RolloutGroup,
    TrainingSequence,
    _AsyncRolloutLoop,
)
from trl.experimental.async_grpo.packing import TreeRow  # noqa: E402
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg._compat import async_trainer_on_cpu  # noqa: E402
from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention  # noqa: E402

GENERATIONS, LENGTH, TEMPERATURE = 4, 6, 0.7


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("terms") / "model"))


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


def prompts(n: int = 8) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}] for i in range(n)],
                              "answer": [str(i) for i in range(n)]})


def worker_at_initial_weights(model_path, tokenizer, reward_funcs=length_reward, **kwargs):
    """A stand-in worker holding the initial weights as version 1 (as the trainer's first sync leaves it)."""
    worker = StaleRolloutWorker(model_path, prompts(), reward_funcs, tokenizer, num_generations=GENERATIONS,
                                max_completion_length=LENGTH, seed=1, **kwargs)
    worker.send_weights(AutoModelForCausalLM.from_pretrained(model_path).named_parameters())
    worker.update_model_version(1)
    return worker


def group_of(worker) -> list:
    return [worker.rollout_buffer.get() for _ in range(GENERATIONS)]


# ---------------------------------------------------------------------------------------------------------------------
# The stand-in against TRL's code
# ---------------------------------------------------------------------------------------------------------------------


def test_the_stand_ins_log_probs_are_the_trainers_at_the_temperature(model_path, tokenizer):
    """The stand-in's sampler log-probs are what the trainer's model computes for the same tokens with TRL's fused
    head at `temperature` (`add_fused_lm_head`, the head of TRL's asynchronous trainer): w = 1 at staleness 0."""
    worker = worker_at_initial_weights(model_path, tokenizer, temperature=TEMPERATURE)
    samples = group_of(worker)

    def fused_logps(temperature):
        model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa").eval()
        add_fused_lm_head(model, temperature=temperature)
        out = []
        with torch.no_grad():
            for s in samples:
                ids = torch.tensor(s.input_ids).unsqueeze(0)
                labels = torch.where(torch.tensor(s.completion_mask).bool(), ids, torch.full_like(ids, -100))
                shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
                result = model(input_ids=ids, shift_labels=shifted, fused_lm_head=True)
                out.append(result.log_probs.flatten()[shifted.flatten() != -100])
        return torch.cat(out)

    sent = torch.cat([torch.tensor(s.old_log_probs[s.completion_mask == 1]) for s in samples])
    torch.testing.assert_close(sent, fused_logps(TEMPERATURE), atol=2e-5, rtol=0)
    assert (sent - fused_logps(1.0)).abs().max() > 1e-2  # the temperature matters on these tokens


def trl_scored(reward_funcs, samples, answer) -> list:
    """TRL's rollout worker scoring the stand-in's group (`_AsyncRolloutLoop._score_group`: the rewards, the
    advantages), on the same prompts, completions and token ids."""
    from accelerate import PartialState

    PartialState()  # TRL's worker logs through accelerate's logger
    loop = SimpleNamespace(reward_funcs=reward_funcs, _env_reward_types=[], _provides_rollout_reward=False,
                           reward_func_names=[f.__name__ for f in reward_funcs])
    n = len(samples)
    group = RolloutGroup(
        prompts=[s.prompt for s in samples], reward_kwargs={"answer": [answer] * n},
        completions=[s.completion for s in samples],
        completions_ids=[s.input_ids[s.completion_mask == 1].tolist() for s in samples],
        completions_sequences=[[TrainingSequence(s.input_ids.tolist(), s.completion_mask.tolist(),
                                                 s.old_log_probs.tolist(), 0)] for s in samples],
        tool_call_counts=[0] * n, tool_failure_counts=[0] * n, model_version=1, group_id=0,
        env_rewards=[None] * n, rollout_rewards=[None] * n)
    return asyncio.run(_AsyncRolloutLoop._score_group(loop, group))


def unscored_first(completions, **kwargs):
    """None (unscorable) for the group's first completion, the length reward for the others."""
    return [None] + length_reward(completions[1:])


def answer_column(completions, answer, **kwargs):
    return [float(len(a)) for a in answer]


def test_the_stand_in_reads_each_prompt_once_with_the_same_samples(model_path, tokenizer):
    """`_sample(prompts, copies=k)` reads each prompt once and repeats its cache: the same tokens as reading every
    copy, and every row's log-probs those of its own prompt and tokens read whole (prompts of different lengths:
    left padding), in order."""
    worker = worker_at_initial_weights(model_path, tokenizer, temperature=TEMPERATURE)
    worker._load(1)
    first, second = ([int(t) for t in tokenizer(text)["input_ids"]] for text in ("1+2", "31+4=7?"))
    assert len(first) != len(second)
    results = []
    for prompts, copies in (([first, second], 3), ([first] * 3 + [second] * 3, 1)):
        worker.generator.manual_seed(5)
        results.append(worker._sample(prompts, copies=copies))
    (tokens, logps), (tokens_each, _) = results
    assert tokens == tokens_each and len(tokens) == 6
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        for prompt, row, row_logps in zip([first] * 3 + [second] * 3, tokens, logps, strict=True):
            logits = model(input_ids=torch.tensor([prompt + row])).logits[0, len(prompt) - 1:-1]
            whole = torch.log_softmax(logits / TEMPERATURE, dim=-1).gather(1, torch.tensor(row)[:, None])[:, 0]
            assert row_logps == pytest.approx(whole.tolist(), abs=1e-4)


@pytest.mark.parametrize("reward_funcs", [[length_reward], [length_reward, answer_column], [unscored_first]],
                         ids=["one", "two-with-a-column", "one-unscored"])
def test_the_stand_ins_advantages_are_trl_workers(model_path, tokenizer, reward_funcs):
    worker = worker_at_initial_weights(model_path, tokenizer, reward_funcs=reward_funcs)
    samples = group_of(worker)
    answer = next(row["answer"] for row in prompts() if row["prompt"] == samples[0].prompt)
    trl = trl_scored(reward_funcs, samples, answer)
    rewards = [s.metrics["reward"] for s in samples]
    assert len(set(r for r in rewards if not math.isnan(r))) > 1  # the std is not 1: dividing by it matters
    np.testing.assert_allclose([s.advantage for s in samples], [t.advantage for t in trl], atol=1e-6, rtol=0)
    np.testing.assert_allclose(rewards, [t.metrics["reward"] for t in trl], atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------------------------
# The loss on one packed micro-batch
# ---------------------------------------------------------------------------------------------------------------------


def trainer_and_batch(model_path, tokenizer, tmp_path, old_log_probs, advantage, **fields):
    """A trainer (stand-in worker, never started) and one packed micro-batch of a stand-in group whose completion
    tokens get `old_log_probs` (a function of the sent ones) and whose samples get `advantage`."""
    worker = worker_at_initial_weights(model_path, tokenizer)
    samples = group_of(worker)
    row = TreeRow()
    for s in samples:
        mask = s.completion_mask == 1
        logps = s.old_log_probs.copy()
        logps[mask] = old_log_probs(logps[mask])
        row.add({"input_ids": s.input_ids, "completion_mask": s.completion_mask, "old_log_probs": logps,
                 "advantage": advantage, "group_id": 0, "metrics": {}})
    batch = DataCollatorForRollout(tokenizer.pad_token_id)([[row]])
    args = AsyncRPGConfig(output_dir=str(tmp_path), per_device_train_batch_size=GENERATIONS,
                          num_generations=GENERATIONS, max_completion_length=LENGTH, use_cpu=True, report_to="none",
                          **fields)
    trainer = AsyncRPGTrainer(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts(),
                              processing_class=tokenizer, rollout_worker=worker, weight_transfer=worker)
    trainer.current_gradient_accumulation_steps = 1
    return trainer, batch


def gradient(trainer, batch, model=None) -> torch.Tensor:
    trainer.model.zero_grad()
    trainer.compute_loss(model or trainer.model, batch).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def test_the_dual_clip_acts_in_the_async_loss(model_path, tokenizer, tmp_path):
    """Every token with a negative advantage and w = pi_theta/mu far above `rpg_dual_clip_c` (mu = the sent log-prob
    minus 30): the dual clip's cell has no gradient, so with beta = 0 the step's gradient is 0; without the dual clip
    it is not."""
    with async_trainer_on_cpu(VarlenAttention):
        clipped, batch = trainer_and_batch(model_path, tokenizer, tmp_path, lambda lp: lp - 30.0, -1.0, beta=0.0,
                                           rpg_dual_clip_c=10.0)
        assert gradient(clipped, batch).abs().max() == 0.0
        assert clipped._metrics["train"]["rpg/clip_frac_dual"] == [1.0]
        unclipped, batch = trainer_and_batch(model_path, tokenizer, tmp_path, lambda lp: lp - 30.0, -1.0, beta=0.0,
                                             rpg_dual_clip_c=None)
        assert gradient(unclipped, batch).abs().max() > 1.0


class WithAuxLoss(torch.nn.Module):
    """The model, its output carrying a MoE load-balancing loss `aux` (as a router's would)."""

    def __init__(self, model, aux: float):
        super().__init__()
        self.model, self.aux = model, aux

    def forward(self, output_router_logits=False, **kwargs):
        assert output_router_logits  # TRL asks for the router logits when the auxiliary loss is on
        out = self.model(**kwargs)
        return SimpleNamespace(log_probs=out.log_probs, entropy=out.entropy,
                               aux_loss=self.aux * torch.ones((), requires_grad=True))


def test_the_moe_auxiliary_loss_is_divided_by_the_accumulation_steps(model_path, tokenizer, tmp_path):
    """As TRL adds it: `router_aux_loss_coef * aux_loss / accumulation steps`, beside the policy loss (itself
    divided by them)."""
    with async_trainer_on_cpu(VarlenAttention):
        trainer, batch = trainer_and_batch(model_path, tokenizer, tmp_path, lambda lp: lp, 0.5, beta=0.1)
        trainer.current_gradient_accumulation_steps = 4
        without = trainer.compute_loss(trainer.model, batch).item()
        trainer.aux_loss_enabled, trainer.router_aux_loss_coef = True, 0.5
        with_aux = trainer.compute_loss(WithAuxLoss(trainer.model, 0.8), batch).item()
    assert with_aux - without == pytest.approx(0.5 * 0.8 / 4, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# TRL_RPG_ALLOW_UNREVIEWED
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,allowed", [("0", False), ("false", False), ("no", False), ("", False),
                                           ("1", True), ("true", True), ("YES", True)])
def test_only_a_yes_lets_an_unreviewed_async_trl_train(monkeypatch, value, allowed):
    import dataclasses

    from trl_rpg.upgrade import async_guard as async_upgrade_guard
    from trl_rpg.upgrade import guard as upgrade_guard
    from trl_rpg.upgrade import verdict as upgrade_verdict
    changed = dataclasses.replace(async_upgrade_guard.ASYNC_REVIEWED_METHODS[1], digest="0" * 16)
    monkeypatch.setattr(async_upgrade_guard, "ASYNC_REVIEWED_METHODS", (changed,))
    failed = upgrade_verdict.Verdict(False, [{"name": "async_reduction", "passed": False, "detail": "off by 2"}])
    monkeypatch.setattr(upgrade_verdict, "verdict", lambda *args: failed)  # the self-check failed (its own tests)
    monkeypatch.setenv(upgrade_guard.ALLOW_ENV, value)
    if allowed:
        with pytest.warns(UserWarning, match="TRL_RPG_ALLOW_UNREVIEWED is set: training anyway"):
            assert async_upgrade_guard.check_async() == ["AsyncGRPOTrainer.compute_loss"]
    else:
        with pytest.raises(upgrade_guard.UnreviewedUpgrade, match="AsyncGRPOTrainer.compute_loss"):
            async_upgrade_guard.check_async()
