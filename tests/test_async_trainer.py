"""AsyncRPGTrainer on TRL's asynchronous trainer, on CPU: a stale rollout worker (`trl_rpg.toy.async_rollouts`) draws
every group with the policy version `s` before the current one, and a CPU stand-in replaces the FA3 varlen kernel.

- the stand-in reproduces the kernel's semantics on the packed rows TRL builds (shared prefixes): an unpacked forward
  gives the same log-probs;
- with beta = 0, no dual clip and the async trainer's clip widths, AsyncRPG trains to AsyncGRPO's parameters;
- with beta > 0, the gradient of a training step at staleness s = 0, 1, 3 is the spec's (docs/math.md sections 2-3:
  REINFORCE with RPG-Style Clip, w = pi_theta/mu with mu recomputed from the version that sampled);
- samples beyond `max_staleness` are dropped as TRL drops them; the weights the worker receives are the policy's
  (merged under LoRA); a non-finite gradient skips the step; the rpg/* metrics, the start-up line and the card.
"""

import logging
import math
import subprocess
import sys

import pytest
import torch
from _tiny import length_reward, save_tiny_model
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client (never called here)

from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer  # noqa: E402
from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout  # noqa: E402
from trl.experimental.async_grpo.packing import TREE_ATTENTION, TreeRow, register_tree_attention  # noqa: E402
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg._compat import async_trainer_on_cpu  # noqa: E402
from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention  # noqa: E402

GENERATIONS, BATCH, LENGTH = 4, 8, 8


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("async") / "model"))


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


def prompts(n: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}] for i in range(n)]})


def settings(tmp_path, **overrides) -> dict:
    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=BATCH, num_generations=GENERATIONS,
                max_completion_length=LENGTH, max_steps=4, learning_rate=3e-2, max_staleness=4, token_budget=0,
                use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=0,
                gradient_checkpointing=False, disable_tqdm=True)
    args.update(overrides)
    return args


def train(trainer_cls, model_path, tokenizer, args, staleness, callbacks=(), **kwargs):
    """Build and train `trainer_cls` with a `StaleRolloutWorker` as worker and weight transfer."""
    worker = StaleRolloutWorker(model_path, prompts(), length_reward, tokenizer, num_generations=GENERATIONS,
                                max_completion_length=LENGTH, staleness=staleness, seed=0,
                                groups_per_call=BATCH // GENERATIONS)
    with async_trainer_on_cpu(VarlenAttention):
        trainer = trainer_cls(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts(),
                              processing_class=tokenizer, rollout_worker=worker, weight_transfer=worker,
                              callbacks=list(callbacks), **kwargs)
        trainer.output = trainer.train()
    return trainer, worker


def parameters(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def logps_of(model, ids: list[int], prompt_length: int) -> torch.Tensor:
    """The completion tokens' log-probs (temperature 1) by a plain, unpacked forward."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)[
        prompt_length - 1:]


# ---------------------------------------------------------------------------------------------------------------------
# The CPU stand-in for the varlen attention kernel
# ---------------------------------------------------------------------------------------------------------------------


def test_varlen_stand_in_reproduces_an_unpacked_forward(model_path, tokenizer):
    """Samples sharing their prompt and part of their completion are packed into one prefix tree (TRL's `TreeRow`):
    the tree-attention forward through the stand-in gives every trained token the log-prob an unpacked forward of
    its own sample gives."""
    register_tree_attention()
    packed_model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation=TREE_ATTENTION).eval()
    add_fused_lm_head(packed_model, outputs=("log_probs", "entropy"))
    plain = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa").eval()
    prompt = [2, 5, 7, 3, 9, 4]
    completions = [[10, 11, 12, 13, 1], [10, 11, 14, 1], [15, 16, 17, 18, 19, 1], [10, 20, 1]]
    samples = [{"input_ids": torch.tensor(prompt + c), "completion_mask": torch.tensor([0] * 6 + [1] * len(c)),
                "old_log_probs": torch.zeros(6 + len(c)), "advantage": 0.5, "group_id": 0, "metrics": {}}
               for c in completions]
    row = TreeRow()
    for sample in samples:
        row.add(sample)
    batch = DataCollatorForRollout(tokenizer.pad_token_id)([[row]])
    assert batch["input_ids"].shape[1] < sum(len(s["input_ids"]) for s in samples)  # prefixes are shared
    tree = {key: batch[key][batch[key] >= 0] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    tree["tree_max_seqlen_q"], tree["tree_max_seqlen_k"] = batch["tree_max_seqlens"][0].tolist()
    with async_trainer_on_cpu(VarlenAttention), torch.no_grad():
        out = packed_model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                           shift_labels=batch["shift_labels"], fused_lm_head=True, **tree)
        got = out.log_probs.flatten()[batch["token_index"][0]]
        expected = torch.cat([logps_of(plain, s["input_ids"].tolist(), 6) for s in samples])
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------------------------
# beta = 0: AsyncGRPO's parameters
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpo_parameters(model_path, tokenizer, tmp_path_factory):
    args = AsyncGRPOConfig(**settings(tmp_path_factory.mktemp("grpo"), gradient_accumulation_steps=2))
    trainer, _ = train(AsyncGRPOTrainer, model_path, tokenizer, args, staleness=2)
    return parameters(trainer.model)


@pytest.mark.parametrize("estimator", ["reinforce", "differentiable"])
def test_beta_zero_trains_to_async_grpo_parameters(model_path, tokenizer, tmp_path, grpo_parameters, estimator):
    """Staleness 2, two micro-batches per step, 4 steps at a learning rate that moves `w` well outside the trust
    region: the same samples, the same parameters (the differentiable surrogate is TRL's loss itself; REINFORCE has
    its gradient, up to rounding)."""
    args = AsyncRPGConfig(**settings(tmp_path, gradient_accumulation_steps=2), beta=0.0, rpg_dual_clip_c=None,
                          epsilon=0.2, epsilon_high=0.2, rpg_estimator=estimator)
    trainer, _ = train(AsyncRPGTrainer, model_path, tokenizer, args, staleness=2)
    assert max(h.get("clip_ratio/region_mean", 0) for h in trainer.state.log_history) > 0.05  # the clip acts
    moved = max((grpo_parameters[n] - p).abs().max().item() for n, p in parameters(AutoModelForCausalLM
                                                                                     .from_pretrained(model_path))
                .items())
    difference = max((grpo_parameters[n] - p).abs().max().item() for n, p in parameters(trainer.model).items())
    assert moved > 0.1  # training moved the parameters far more than the tolerance below
    assert difference <= (0.0 if estimator == "differentiable" else 2e-4)


# ---------------------------------------------------------------------------------------------------------------------
# beta > 0: the per-token gradient at staleness s is the spec's
# ---------------------------------------------------------------------------------------------------------------------


def spec_weight(w, adv, beta, divergence, eps_low=0.2, eps_high=0.28, c=10.0):
    """g of docs/math.md section 3 with rho = 1 (reference = sampler): the loss gradient is -g * grad logp."""
    w_bar = w.clamp(1 - eps_low, 1 + eps_high)
    kl = -beta * w_bar * w_bar.log() if divergence == "urkl" else beta * (1 - w_bar)  # C_bar
    effective = adv + kl / w
    zero = ((effective >= 0) & (w >= 1 + eps_high)) | ((effective < 0) & (w <= 1 - eps_low)) | (
        (effective < 0) & (w >= c))
    return torch.where(zero, torch.zeros_like(w), w * adv + kl)


class GradientAtLastStep(TrainerCallback):
    def __init__(self, last):
        self.last, self.grads, self.params = last, None, None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.last:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            self.params = parameters(model)


@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_gradient_at_staleness_is_the_spec(model_path, tokenizer, tmp_path, staleness):
    """The last step's micro-batch: every sample's log-probs recomputed by a plain forward, under the trained policy
    and under the worker's copy of the version that sampled it (`model_version`); the gradient of
    -(1/N) sum_t SG(g_t) logp_t with the spec's g equals the trainer's."""
    beta, steps = 0.5, staleness + 3
    capture = GradientAtLastStep(steps)
    args = AsyncRPGConfig(**settings(tmp_path, max_steps=steps, max_grad_norm=0.0), beta=beta)
    worker_samples = []
    trainer, worker = None, None

    original = StaleRolloutWorker._next_sample

    def recording(self):
        worker_samples.append(original(self))
        return worker_samples[-1]

    StaleRolloutWorker._next_sample = recording
    try:
        trainer, worker = train(AsyncRPGTrainer, model_path, tokenizer, args, staleness, callbacks=[capture])
    finally:
        StaleRolloutWorker._next_sample = original
    trained = worker_samples[(steps - 1) * BATCH:steps * BATCH]  # one micro-batch per step, in the order pulled
    assert len(trained) == BATCH and capture.grads is not None
    assert {s.model_version for s in trained} == {max(1, steps - 1 - staleness)}  # s versions before its pull

    policy = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa")
    policy.load_state_dict(capture.params)
    sampler = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa").eval()
    sampler.load_state_dict(worker.versions[trained[0].model_version], strict=False)
    logps, logmu, adv = [], [], []
    for sample in trained:
        ids, prompt_length = sample.input_ids.tolist(), int((sample.completion_mask == 0).sum())
        logps.append(logps_of(policy, ids, prompt_length))
        with torch.no_grad():
            logmu.append(logps_of(sampler, ids, prompt_length))
        adv.append(torch.full_like(logmu[-1], sample.advantage))
    logps, logmu, adv = torch.cat(logps), torch.cat(logmu), torch.cat(adv)
    w = (logps.detach() - logmu).exp()
    torch.testing.assert_close(logmu, torch.cat([torch.tensor(s.old_log_probs[s.completion_mask == 1])
                                                 for s in trained]), atol=2e-5, rtol=0)  # the worker's mu
    if staleness > 0:
        assert (w - 1).abs().max() > 0.2  # off-policy: the KL part and the clip act

    def expected(b):
        grads = torch.autograd.grad(-(spec_weight(w, adv, b, "urkl") * logps).sum() / len(logps),
                                    list(policy.parameters()), retain_graph=True)
        return torch.cat([g.flatten() for g in grads])

    got = torch.cat([capture.grads[n].flatten() for n, _ in policy.named_parameters()])
    want, without_kl = expected(beta), expected(0.0)
    error = ((got - want).norm() / want.norm()).item()
    assert error < 1e-4, error
    if staleness > 0:
        assert ((without_kl - want).norm() / want.norm()).item() > 100 * 1e-4  # the KL part is far above the error


# ---------------------------------------------------------------------------------------------------------------------
# One run for the rest: stale samples dropped, weights sent, the guard, metrics, start-up line, card
# ---------------------------------------------------------------------------------------------------------------------


class Record(TrainerCallback):
    """Parameters after every optimizer step; the gradient of step `poisoned` made NaN."""

    def __init__(self, poisoned: int):
        self.poisoned, self.step, self.after = poisoned, 0, {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.lm_head.weight.register_hook(lambda grad: grad * float("nan") if self.step == self.poisoned else grad)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step] = parameters(model)


@pytest.fixture(scope="module")
def run(model_path, tokenizer, tmp_path_factory):
    """5 steps, max_staleness 1; every third generation call samples with the version 3 before the current one;
    step 3's gradient is NaN."""
    record = Record(poisoned=3)
    handler = logging.Handler()
    handler.records = []
    handler.emit = handler.records.append
    logging.getLogger("trl_rpg").addHandler(handler)
    pulls = []  # (version when generated, version that sampled, samples)
    original = StaleRolloutWorker._generate_groups

    def generating(self):
        samples = original(self)
        pulls.append((self.version, samples[0].model_version, len(samples)))
        return samples

    StaleRolloutWorker._generate_groups = generating
    args = AsyncRPGConfig(**settings(tmp_path_factory.mktemp("run"), max_steps=5, max_staleness=1), beta=0.1)
    try:
        trainer, worker = train(AsyncRPGTrainer, model_path, tokenizer, args, lambda group: 3 if group % 6 >= 4 else 0,
                                callbacks=[record])
    finally:
        StaleRolloutWorker._generate_groups = original
        logging.getLogger("trl_rpg").removeHandler(handler)
    return {"trainer": trainer, "worker": worker, "record": record, "pulls": pulls,
            "initial": parameters(AutoModelForCausalLM.from_pretrained(model_path)),
            "logs": [r.getMessage() for r in handler.records]}


def test_samples_beyond_max_staleness_are_dropped_as_trl_drops_them(run):
    trainer, pulls = run["trainer"], run["pulls"]
    stale = sum(n for current, sampled, n in pulls if current - sampled > 1)
    assert stale > 0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert sum(h.get("sample/dropped_stale_total", 0) for h in logs) == stale
    assert max(h["sample/staleness_max"] for h in logs) <= 1


def test_the_weights_sent_are_the_policys(run):
    versions, after = run["worker"].versions, run["record"].after
    assert sorted(versions) == list(range(1, 7))  # the first sync, then one per step
    for name, value in run["initial"].items():
        assert torch.equal(versions[1][name], value)
    for step in range(1, 6):
        for name, value in after[step].items():
            assert torch.equal(versions[step + 1][name], value), (step, name)


def test_a_non_finite_gradient_skips_the_step(run):
    trainer, after = run["trainer"], run["record"].after
    assert trainer.skipped_steps == 1
    assert all(torch.equal(after[2][n], after[3][n]) for n in after[2])  # step 3 moved nothing
    assert any(not torch.equal(after[3][n], after[4][n]) for n in after[3])  # step 4 trains again
    assert [h["rpg/skipped_steps"] for h in trainer.state.log_history if "rpg/skipped_steps" in h] == [1.0]
    assert any("optimizer step skipped" in line and "AsyncRPGTrainer" in line for line in run["logs"])


def test_parameters_the_optimizer_makes_non_finite_stop_the_run(run):
    """The sync trainer's guard (`parameter_guard.ParameterGuard`, tested there with a real NaN step) is on."""
    from trl_rpg.run.parameter_guard import ParameterGuard

    guards = [c for c in run["trainer"].callback_handler.callbacks if isinstance(c, ParameterGuard)]
    assert len(guards) == 1 and guards[0].trainer == "AsyncRPGTrainer"


def test_rpg_metrics_beside_trls_and_the_start_up_line(run):
    logs = [h for h in run["trainer"].state.log_history if "loss" in h]
    for h in logs:
        for key in ("rpg/divergence", "rpg/w_mean", "rpg/w_max", "rpg/clip_frac_high", "rpg/clip_frac_dual",
                    "sample/staleness_mean", "kl", "ratio", "clip_ratio/region_mean", "entropy"):
            assert key in h and math.isfinite(h[key]), key
    assert abs(logs[-1]["rpg/w_mean"] - logs[-1]["ratio"]) < 1e-5  # the same w, two names
    assert sum(line.startswith("AsyncRPGTrainer: optimising E[A] - beta*D") and "beta=0.1" in line and
               "max_staleness=1" in line for line in run["logs"]) == 1


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def test_a_run_that_learns_nothing_from_its_rewards_says_so(run, model_path, tokenizer, tmp_path, caplog):
    """Every group's rewards equal: every advantage 0; train() warns and its metrics say so (a normal run: 0.0)."""
    assert run["trainer"].output.metrics["rpg/trained_on_nothing"] == 0.0
    worker = StaleRolloutWorker(model_path, prompts(), constant_reward, tokenizer, num_generations=GENERATIONS,
                                max_completion_length=LENGTH, groups_per_call=BATCH // GENERATIONS)
    args = AsyncRPGConfig(**settings(tmp_path, max_steps=1), beta=0.1)
    with async_trainer_on_cpu(VarlenAttention), caplog.at_level(logging.WARNING, logger="trl_rpg"):
        trainer = AsyncRPGTrainer(model_path, reward_funcs=constant_reward, args=args, train_dataset=prompts(),
                                  processing_class=tokenizer, rollout_worker=worker, weight_transfer=worker)
        metrics = trainer.train().metrics
    assert metrics["rpg/trained_on_nothing"] == 1.0 and "advantage 0" in metrics["rpg/trained_on_nothing_reason"]
    assert caplog.records[-1].getMessage() == metrics["rpg/trained_on_nothing_reason"]


def test_model_card(run):
    trainer = run["trainer"]
    trainer.create_model_card(model_name="async-tiny")
    with open(f"{trainer.args.output_dir}/README.md", encoding="utf-8") as f:
        card = f.read()
    assert "`trl_rpg.AsyncRPGTrainer`, a subclass of TRL's `AsyncGRPOTrainer`" in card
    assert "| staleness allowed (`max_staleness`) | `1` |" in card and "| beta | `0.1` |" in card
    assert "2505.17508" in card and "async-rpg" in card


# ---------------------------------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------------------------------


def test_lora_trains_the_adapter_and_sends_the_merged_policy(model_path, tokenizer, tmp_path):
    from peft import LoraConfig

    args = AsyncRPGConfig(**settings(tmp_path, max_steps=3, learning_rate=5e-2), beta=0.1)
    trainer, worker = train(AsyncRPGTrainer, model_path, tokenizer, args, staleness=1,
                            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model = trainer.model
    base = parameters(AutoModelForCausalLM.from_pretrained(model_path))
    for name, p in model.named_parameters():  # only the adapter trained (TRL merges and unmerges it at every sync:
        if "lora_" not in name:  # the base weights keep that round trip's rounding)
            torch.testing.assert_close(p.detach(), base[name.removeprefix("base_model.model.").replace(
                ".base_layer", "")], atol=1e-6, rtol=0)
    merged = parameters(model.merge_and_unload())
    sent = worker.versions[max(worker.versions)]
    assert set(sent) == set(merged)
    assert any(not torch.equal(sent[n], base[n]) for n in sent)  # the adapter moved the policy the worker runs
    for name in sent:
        torch.testing.assert_close(sent[name], merged[name], atol=1e-6, rtol=0)


def test_a_worker_holding_only_the_versions_sampling_can_use_trains_the_same(model_path, tokenizer, tmp_path,
                                                                             grpo_parameters):
    """`keep_versions=staleness + 1` (what a real model's benchmark needs: each version is the whole weights): the
    same versions sample every group and the trained parameters are those of the worker that holds every version."""
    worker = StaleRolloutWorker(model_path, prompts(), length_reward, tokenizer, num_generations=GENERATIONS,
                                max_completion_length=LENGTH, staleness=2, seed=0,
                                groups_per_call=BATCH // GENERATIONS, keep_versions=3)
    held = []
    update = worker.update_model_version
    worker.update_model_version = lambda v: (update(v), held.append(sorted(worker.versions)))
    args = AsyncGRPOConfig(**settings(tmp_path, gradient_accumulation_steps=2))
    with async_trainer_on_cpu(VarlenAttention):
        trainer = AsyncGRPOTrainer(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts(),
                                   processing_class=tokenizer, rollout_worker=worker, weight_transfer=worker)
        trainer.train()
    assert max(len(h) for h in held) == 3 and held[-1] == [held[-1][0] + i for i in range(3)]
    assert len(held) >= 4 and min(worker.sampled_with) not in held[-1]  # a version that sampled was dropped
    for name, p in parameters(trainer.model).items():
        torch.testing.assert_close(p, grpo_parameters[name], atol=0, rtol=0)
    for staleness, keep, why in [(2, 2, "at least staleness \\+ 1 \\(3\\); got 2"),
                                 (lambda group: 1, 3, "needs a fixed \\(integer\\) staleness")]:
        with pytest.raises(ValueError, match=why):
            StaleRolloutWorker(model_path, prompts(), length_reward, tokenizer, num_generations=GENERATIONS,
                               max_completion_length=LENGTH, staleness=staleness, keep_versions=keep)


# ---------------------------------------------------------------------------------------------------------------------
# Configuration and imports
# ---------------------------------------------------------------------------------------------------------------------

BASE = dict(output_dir="/tmp/trl-rpg-async-config-test", use_cpu=True, report_to="none")


@pytest.mark.parametrize("overrides,field,allowed", [
    (dict(rpg_divergence="kl"), "rpg_divergence", "fkl"),
    (dict(rpg_estimator="ppo"), "rpg_estimator", "reinforce"),
    (dict(beta=-1.0), "beta", ">= 0"),
    (dict(epsilon=0.0), "epsilon", "no gradient"),
    (dict(rpg_dual_clip_c=1.0), "rpg_dual_clip_c", "> 1"),
    (dict(rpg_reference="initial"), "rpg_reference", "second forward pass"),
    (dict(learning_rate=math.inf), "learning_rate", "finite number >= 0"),  # as RPGConfig (parameter_guard)
])
def test_bad_rpg_values_name_the_field(overrides, field, allowed):
    with pytest.raises(ValueError) as error:
        AsyncRPGConfig(**BASE, **overrides)
    assert str(error.value).startswith(f"AsyncRPGConfig: `{field}`=") and allowed in str(error.value)


def test_an_async_grpo_config_is_upgraded():
    from trl_rpg.trainers.async_config import as_async_rpg_config

    args = as_async_rpg_config(AsyncGRPOConfig(**BASE, epsilon=0.1, max_staleness=2), "model")
    assert isinstance(args, AsyncRPGConfig)
    assert (args.epsilon, args.epsilon_high, args.max_staleness) == (0.1, 0.1, 2)  # TRL's symmetric region kept
    assert (args.rpg_divergence, args.beta) == ("urkl", 1e-4)
    assert AsyncRPGConfig(**BASE).epsilon_high == 0.28  # the paper's when neither width is set
    with pytest.raises(ValueError, match="AsyncRPGConfig or an AsyncGRPOConfig"):
        as_async_rpg_config(object(), "model")


def test_import_trl_rpg_does_not_import_the_async_trainer():
    """The synchronous path (the package, RPGConfig) never imports TRL's async trainer (nor
    its experimental-API warning); `from trl_rpg import AsyncRPGTrainer` (this module's own import) does."""
    code = ("import sys, trl_rpg; trl_rpg.RPGConfig; "
            "sys.exit('trl.experimental.async_grpo' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert AsyncRPGTrainer.__module__ == "trl_rpg.trainers.async_trainer"


def test_the_upgrade_guard_covers_the_async_trainer(monkeypatch, model_path):
    """On the reviewed TRL nothing is flagged; a changed method or an unclassified AsyncGRPOConfig field stops the
    trainer before any model is loaded, naming it."""
    import dataclasses

    from trl_rpg.upgrade import async_guard as async_upgrade_guard
    from trl_rpg.upgrade import guard as upgrade_guard
    assert async_upgrade_guard.check_async() == []

    @dataclasses.dataclass
    class NewerConfig(AsyncGRPOConfig):
        new_loss_option: bool = False

    with pytest.raises(upgrade_guard.UnreviewedUpgrade, match="new_loss_option"):
        async_upgrade_guard.check_async(config_class=NewerConfig)
    changed = dataclasses.replace(async_upgrade_guard.ASYNC_REVIEWED_METHODS[1], digest="0" * 16)
    monkeypatch.setattr(async_upgrade_guard, "ASYNC_REVIEWED_METHODS", (changed,))
    from trl_rpg.upgrade import (
        verdict as upgrade_verdict,  # the self-check (tests/test_async_upgrade_check.py), here failed
    )

    monkeypatch.setattr(upgrade_verdict, "verdict", lambda *args: upgrade_verdict.Verdict(False, error="stub"))
    with pytest.raises(upgrade_guard.UnreviewedUpgrade, match=r"AsyncRPGTrainer was reviewed.*"
                                                              r"AsyncGRPOTrainer\.compute_loss"):
        AsyncRPGTrainer("not-a-model-path-because-the-guard-runs-first", args=AsyncRPGConfig(**BASE))


def test_the_cpu_stand_ins_are_put_back():
    """`_compat.async_trainer_on_cpu` replaces TRL's kernel loader and MFU lookup only within its block."""
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    before = packing._flash_attn, async_grpo_trainer.get_peak_flops_per_device
    with async_trainer_on_cpu(VarlenAttention):
        assert packing._flash_attn() is VarlenAttention
        assert async_grpo_trainer.get_peak_flops_per_device(None, "float32") is None
    assert (packing._flash_attn, async_grpo_trainer.get_peak_flops_per_device) == before
