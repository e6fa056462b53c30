"""The sampler's own log-probs (`rpg_sampler_logps`, issue 37) and the engine's bad output (issue 35 section 3).

With vLLM generation and the sampler as reference, mu is by definition the policy that generated the tokens, and the
engine returns exactly its log-probs. `rpg_sampler_logps="engine"` (what `"auto"` picks where it is exact) trains
with them: TRL's no-grad old-log-prob pass does not run and TRL's correction pi_old/mu is not applied on top
(docs/math.md section 4b). Through the fake engine of `tests/vllm_stub` (tests/_fake_vllm.py):

- the pass is gone (the no-grad log-prob passes per generation batch are counted), and with an engine whose
  log-probs equal the trainer's, "engine" trains to "recompute"'s parameters: every divergence and estimator, full
  and LoRA, colocate and server, 1 and 2 processes (wrong lines: the pass still run, the correction left on);
- with a perturbed engine, the per-token gradient is the objective library's with w = pi_theta/mu_engine (wrong line:
  mu recomputed); the mismatch log(pi_old/mu) is logged where pi_theta = pi_old and nowhere else;
- where "engine" is not exact it is refused (explicit) or not chosen (auto): no vLLM, truncated sampling, a
  reference other than the sampler, a custom rollout_func, a server without processed log-probs;
- tokens whose engine log-prob is NaN or +-inf are excluded from the loss and counted (`rpg/excluded_tokens`), in
  both modes: an infinite log-prob in every completion no longer makes TRL's sequence_mask reject every sequence
  (wrong lines: NaN tokens trained on with a ratio of 1; infinities passed to TRL); a malformed output (a missing
  or extra log-prob, an empty completion, no log-probs) is an error naming the engine;
- a run resumed inside a reused engine batch trains exactly as one that was not interrupted, even in the other mode
  (the batch keeps its own mu).

Cost: about 60 s of single-process runs and one two-process launch on a quiet machine (2 cores).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from _equivalence import lora_config, max_difference, parameters
from _fake_vllm import engine_of, installed, rewrite_outputs, served
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.objectives.per_token import DIVERGENCES, ESTIMATORS, rpg_per_token_loss
from trl_rpg.trainers.describe import describe_objective
from trl_rpg.trainers.sampler_logps import ENGINE_KEY, MalformedEngineOutput, SamplerLogps, checked_output

KERNEL_MISMATCH_ENV = "FAKE_VLLM_KERNEL_MISMATCH"  # tests/vllm_stub/vllm/__init__.py
#: "engine" against "recompute" with an engine whose log-probs are the trainer's (float noise of two forward passes,
#: 4.8e-7 per token): measured at most 2.2e-7 after 4 SGD steps, every divergence and estimator.
PARAM_ATOL = 1e-6
GENERATION_BATCH = 32  # 8 completions per micro-batch x steps_per_generation 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("sampler_model")))


@pytest.fixture(scope="module")
def fake_vllm():
    with installed():
        yield


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def settings(**overrides) -> dict:
    """One generation batch of 32 completions reused for 4 optimizer steps (3 off-policy), vLLM colocate, beta 0.5
    with the sampler as reference, plain SGD (Adam's first steps turn float noise into full-size updates)."""
    values = dict(max_steps=4, steps_per_generation=4, use_vllm=True, vllm_mode="colocate", beta=0.5,
                  temperature=1.0, gradient_checkpointing=False, optim="sgd", learning_rate=1.5, max_grad_norm=0.0,
                  lr_scheduler_type="constant", disable_tqdm=True)
    return {**values, **overrides}


def build(model_dir, output_dir, peft: bool = False, **overrides) -> RPGTrainer:
    """An RPGTrainer whose log-prob passes are recorded in `trainer.passes` as (with gradient, rows)."""
    trainer = RPGTrainer(model=model_dir, reward_funcs=length_reward, train_dataset=tiny_dataset(),
                         args=RPGConfig(**cpu_args(output_dir, **settings(**overrides))),
                         peft_config=lora_config() if peft else None)
    trainer.passes = []
    original = trainer._get_per_token_logps_and_entropies

    def counted(model, input_ids, *args, **kwargs):
        trainer.passes.append((torch.is_grad_enabled(), int(input_ids.size(0))))
        return original(model, input_ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted
    return trainer


def no_grad_rows(trainer) -> int:
    return sum(rows for grad, rows in trainer.passes if not grad)


# ----------------------------------------------------------------------------------------------------------------
# The pass is gone, and "engine" trains to "recompute"'s parameters
# ----------------------------------------------------------------------------------------------------------------

PAIRS = [pytest.param(d, e, "colocate", False, id=f"{d}-{e}") for d in DIVERGENCES for e in ESTIMATORS]
PAIRS += [pytest.param("urkl", "reinforce", "colocate", True, id="urkl-reinforce-lora"),
          pytest.param("ufkl", "differentiable", "server", False, id="ufkl-differentiable-server")]


@pytest.mark.parametrize("divergence,estimator,mode,peft", PAIRS)
def test_engine_runs_no_old_logprob_pass_and_trains_to_recompute_parameters(fake_vllm, model_dir, tmp_path,
                                                                          divergence, estimator, mode, peft):
    """An engine whose log-probs are the trainer's: "engine" makes no no-grad pass over the generation batch where
    "recompute" makes one, carries neither `old_per_token_logps` nor TRL's ratio, and ends with "recompute"'s
    parameters (the clip matters: tokens leave the trust region on the reused micro-batches; LoRA, whose B starts at
    0, moves the policy less: w up to 1.17, measured)."""
    runs = {}
    for name in ("engine", "recompute"):
        with served(model_dir):
            runs[name] = build(model_dir, tmp_path / name, peft=peft, vllm_mode=mode, rpg_divergence=divergence,
                               rpg_estimator=estimator, rpg_sampler_logps=name, learning_rate=20.0 if peft else 1.5)
            runs[name].train()
    engine, recompute = runs["engine"], runs["recompute"]
    assert engine.sampler_logps.mode == "engine" and recompute.sampler_logps.mode == "recompute"
    assert no_grad_rows(engine) == 0 and no_grad_rows(recompute) == GENERATION_BATCH
    assert [grad for grad, _ in engine.passes] == [True] * 4  # one training pass per micro-batch, nothing else
    batch = engine._buffered_inputs[0]
    assert "old_per_token_logps" not in batch and "importance_sampling_ratio" not in batch and ENGINE_KEY in batch
    assert "importance_sampling_ratio" in recompute._buffered_inputs[0]  # TRL's correction, on by default
    assert max_difference(parameters(engine), parameters(recompute)) <= PARAM_ATOL
    assert max(logged(engine, "rpg/w_max")) > (1.1 if peft else 1 + engine.args.epsilon_high)


# ----------------------------------------------------------------------------------------------------------------
# A perturbed engine: w = pi_theta / mu_engine; the mismatch; NaN tokens excluded and counted
# ----------------------------------------------------------------------------------------------------------------

KERNEL_MISMATCH = 0.3  # mean |log(pi_old / mu)| about 0.24 per token (tests/test_vllm_generation.py)


def nan_at_second_token(completion):
    """The engine reports no log-prob (NaN) for the second token of every completion that has one."""
    if len(completion.token_ids) > 1:
        completion.logprobs[1] = {t: type(lp)(math.nan, lp.rank) for t, lp in completion.logprobs[1].items()}
    return completion


def served_values(engine, inputs, field: str) -> torch.Tensor:
    """`field` ("logprobs": what the engine computed for mu, before any rewrite; "policy_logprobs": the engine's
    weights without the perturbation, i.e. pi_old) for each row of a batch, found by prompt and completion."""
    table = {(tuple(r.prompt_token_ids), tuple(c)): v for r in engine.requests
             for c, v in zip(r.completions, getattr(r, field))}
    rows = []
    for prompt, pmask, completion, cmask in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                                                inputs["completion_mask"]):
        values = table[(tuple(prompt[pmask.bool()].tolist()), tuple(completion[cmask.bool()].tolist()))]
        rows.append(values + [0.0] * (completion.numel() - len(values)))
    return torch.tensor(rows)


@pytest.fixture(scope="module")
def perturbed(fake_vllm, model_dir, tmp_path_factory):
    """Engine mode, a perturbed engine that reports NaN for every second token, five steps: the second generation
    batch (made at step 4) is trained on by step 5; its micro-batches 1-3 are untrained, off-policy."""
    mp = pytest.MonkeyPatch()
    mp.setenv(KERNEL_MISMATCH_ENV, str(KERNEL_MISMATCH))
    try:
        trainer = build(model_dir, tmp_path_factory.mktemp("perturbed"), max_steps=5, optim="adamw_torch",
                        learning_rate=0.05, max_grad_norm=1.0)
        rewrite_outputs(engine_of(trainer), nan_at_second_token)
        trainer.train()
    finally:
        mp.undo()
    trainer.model.train()
    return trainer


def token_gradient(trainer, inputs) -> torch.Tensor:
    """d loss / d per-token log-prob, as the trainer computes it (and the log-probs it used)."""
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def capture(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        logps.retain_grad()
        captured["logps"] = logps
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capture
    try:
        trainer.compute_loss(trainer.model, inputs).backward()
    finally:
        trainer._get_per_token_logps_and_entropies = original
    trainer.model.zero_grad()
    return captured["logps"].grad, captured["logps"].detach()


def spec_gradient(trainer, inputs, logps, mu, advantages) -> torch.Tensor:
    """The objective library's per-token gradient with w = pi_theta / mu (the reference is the sampler: rho = 1)."""
    args, mask = trainer.args, inputs["completion_mask"].float()
    leaf = logps.clone().requires_grad_(True)
    loss, _ = rpg_per_token_loss(leaf, mu, advantages, mask, divergence=args.rpg_divergence,
                                 estimator=args.rpg_estimator, beta=args.beta, epsilon_low=args.epsilon,
                                 epsilon_high=args.epsilon_high, dual_clip_c=args.rpg_dual_clip_c)
    normalizer = inputs["num_items_in_batch"] * args.gradient_accumulation_steps / args.steps_per_generation  # dapo
    (grad,) = torch.autograd.grad((loss * mask).sum() / normalizer, leaf)
    return grad


def test_perturbed_engine_gradient_is_the_spec_with_the_engine_mu(perturbed):
    """An off-policy micro-batch: the batch's sampler log-probs are what the engine computed (NaN where it reported
    none), and the trainer's per-token gradient is the library's with w = pi_theta/mu_engine, for the whole loss and
    the KL term alone; the NaN tokens get no gradient."""
    inputs = dict(perturbed._buffered_inputs[1])
    mask = inputs["completion_mask"].bool()
    served = served_values(engine_of(perturbed), inputs, "logprobs")
    missing = torch.isnan(inputs["sampling_per_token_logps"]) & mask
    assert missing.sum() >= 4 and (missing == (mask & (torch.arange(mask.size(1)) == 1))).all()
    mu = served.masked_fill(missing, math.nan)
    torch.testing.assert_close(inputs["sampling_per_token_logps"][mask & ~missing], mu[mask & ~missing])
    grad, logps = token_gradient(perturbed, inputs)
    advantages = inputs["advantages"].unsqueeze(1).expand_as(logps)
    assert ((logps - mu)[mask & ~missing]).abs().mean() > 0.1  # w far from 1: mu is not pi_theta
    torch.testing.assert_close(grad[mask], spec_gradient(perturbed, inputs, logps, mu, advantages)[mask], rtol=1e-5,
                               atol=1e-9)
    assert (grad[missing] == 0).all()
    inputs["advantages"] = torch.zeros_like(inputs["advantages"])  # the KL term alone
    grad, logps = token_gradient(perturbed, inputs)
    kl_only = spec_gradient(perturbed, inputs, logps, mu, torch.zeros_like(advantages))
    assert kl_only[mask].abs().max() > 0
    torch.testing.assert_close(grad[mask], kl_only[mask], rtol=1e-5, atol=1e-9)


def test_nan_engine_logprobs_are_excluded_and_counted(perturbed):
    """Every step counts the NaN tokens of the micro-batch it trained on; the parameters stay finite."""
    excluded = logged(perturbed, "rpg/excluded_tokens")
    assert len(excluded) == 5 and min(excluded) >= 1
    first = perturbed._buffered_inputs[0]  # step 5's micro-batch
    assert excluded[-1] == (torch.isnan(first["sampling_per_token_logps"]) & first["completion_mask"].bool()).sum()
    assert all(torch.isfinite(p).all() for p in perturbed.model.parameters())


def test_the_mismatch_is_logged_where_pi_theta_is_pi_old(perturbed):
    """Step 1 and step 5 train the first micro-batch of a fresh batch (pi_theta = pi_old): `rpg/sampler_mismatch_mean`
    is the mean |log pi_old - log mu| over its tokens (pi_old from the engine's own weights, unperturbed), also under
    TRL's name; steps 2-4 carry step 1's value (a batch's metrics show at every step trained on it)."""
    mean = logged(perturbed, "rpg/sampler_mismatch_mean")
    assert len(mean) == 5 and mean[1:4] == [mean[0]] * 3 and mean[4] != mean[0]
    assert logged(perturbed, "sampling/sampling_logp_difference/mean") == mean
    inputs = perturbed._buffered_inputs[0]
    valid = inputs["completion_mask"].bool() & ~torch.isnan(inputs["sampling_per_token_logps"])
    engine = engine_of(perturbed)
    gap = (served_values(engine, inputs, "policy_logprobs") - served_values(engine, inputs, "logprobs")).abs()
    assert mean[4] == pytest.approx(gap[valid].mean().item(), rel=1e-3)
    assert logged(perturbed, "rpg/sampler_mismatch_max")[4] == pytest.approx(gap[valid].max().item(), rel=1e-3)
    log_w = (served_values(engine, inputs, "policy_logprobs") - served_values(engine, inputs, "logprobs"))[valid]
    assert logged(perturbed, "rpg/sampler_mismatch_kl")[4] == pytest.approx((log_w.exp() - 1 - log_w).mean().item(),
                                                                           rel=1e-3)
    assert mean[4] > 0.1


# ----------------------------------------------------------------------------------------------------------------
# An infinite log-prob in every completion (TRL's correction): excluded and counted, not every sequence rejected
# ----------------------------------------------------------------------------------------------------------------


def infinite_at_first_token():
    """A rewrite giving the first token of each completion a log-prob of -inf, +inf, -inf, ... in turn."""
    count = [0]

    def rewrite(completion):
        sign = -1 if count[0] % 2 == 0 else 1
        count[0] += 1
        completion.logprobs[0] = {t: type(lp)(sign * math.inf, lp.rank) for t, lp in completion.logprobs[0].items()}
        return completion

    return rewrite


def test_an_infinite_logprob_per_completion_is_excluded_not_every_sequence_rejected(fake_vllm, model_dir,
                                                                                     tmp_path):
    """"recompute" with TRL's default correction (sequence_mask): before, one +-inf per completion made every
    sequence's ratio 0 and the run trained nothing with `rpg/excluded_tokens` 0; now that token has no correction
    and is excluded and counted, and the rest trains."""
    trainer = build(model_dir, tmp_path, max_steps=2, rpg_sampler_logps="recompute")
    initial = parameters(trainer)
    rewrite_outputs(engine_of(trainer), infinite_at_first_token())
    trainer.train()
    assert trainer.args.vllm_importance_sampling_mode == "sequence_mask"
    assert logged(trainer, "rpg/excluded_tokens") == [8.0, 8.0]  # one token of each of the 8 completions per step
    assert max(logged(trainer, "sampling/importance_sampling_ratio/min")) > 0
    assert max_difference(parameters(trainer), initial) > 1e-3


# ----------------------------------------------------------------------------------------------------------------
# Issue 46: log-probs above 0 (a server that returns logits) are not log-probs: excluded, counted, warned once
# ----------------------------------------------------------------------------------------------------------------


def logits_for(positions):
    """A rewrite giving the sampled token at `positions` (None: every position) a "log-prob" of 3 + |log-prob|, as
    a server returning logits would."""

    def rewrite(completion):
        for i, top in enumerate(completion.logprobs):
            if positions is None or i in positions:
                completion.logprobs[i] = {t: type(lp)(3.0 + abs(lp.logprob), lp.rank) for t, lp in top.items()}
        return completion

    return rewrite


@pytest.mark.parametrize("mode", ["engine", "recompute"])
def test_logits_for_logprobs_train_nothing_and_the_run_says_so(fake_vllm, model_dir, tmp_path, caplog, mode):
    """Every sampled token's "log-prob" above 0: before, "recompute" trained nothing (TRL's correction pi_old/mu ~ 0:
    parameters moved 1.7e-14 in 4 steps) with no warning and `rpg/trained_on_nothing` 0, and "engine" trained with
    w ~ 0.001. Now every token is excluded and counted, one warning says why, and the verdict is "trained on
    nothing"."""
    trainer = build(model_dir, tmp_path, max_steps=2, rpg_sampler_logps=mode)
    rewrite_outputs(engine_of(trainer), logits_for(None))
    initial = parameters(trainer)
    with caplog.at_level("WARNING", logger="trl_rpg"):
        metrics = trainer.train().metrics
    assert trainer.sampler_logps.mode == mode
    warned = [r.getMessage() for r in caplog.records if "log-prob(s) of sampled tokens above 0" in r.getMessage()]
    assert len(warned) == 1 and "logits" in warned[0]
    excluded = logged(trainer, "rpg/excluded_tokens")
    assert len(excluded) == 2 and min(excluded) > 0
    assert excluded[-1] == trainer._buffered_inputs[1]["completion_mask"].sum()  # every token of the micro-batch
    assert metrics["rpg/trained_on_nothing"] == 1.0 and "every completion token masked" in \
        metrics["rpg/trained_on_nothing_reason"]
    assert max_difference(parameters(trainer), initial) == 0.0


def test_a_logprob_above_0_is_excluded_the_rest_trains(fake_vllm, model_dir, tmp_path, caplog):
    """Engine mode, the first token of every completion with a positive "log-prob": those 8 tokens per step are
    excluded and counted (not trained with w ~ e^-3), the rest trains, one warning for the run."""
    trainer = build(model_dir, tmp_path, max_steps=2)
    rewrite_outputs(engine_of(trainer), logits_for({0}))
    initial = parameters(trainer)
    with caplog.at_level("WARNING", logger="trl_rpg"):
        metrics = trainer.train().metrics
    assert trainer.sampler_logps.mode == "engine"
    assert logged(trainer, "rpg/excluded_tokens") == [8.0, 8.0]
    assert sum("log-prob(s) of sampled tokens above 0" in r.getMessage() for r in caplog.records) == 1
    assert metrics["rpg/trained_on_nothing"] == 0.0 and max_difference(parameters(trainer), initial) > 1e-3


def test_rounding_above_0_is_a_logprob_beyond_it_is_not_and_each_kind_is_warned_once(caplog):
    """Up to LOGPROB_ROUNDING above 0 is float rounding of a near-certain token (kept); beyond it, not a log-prob."""
    from trl_rpg.trainers.sampler_logps import LOGPROB_ROUNDING

    warned = set()
    logprobs = [[[-0.1], [LOGPROB_ROUNDING], [0.0], [2 * LOGPROB_ROUNDING], [7.5], [math.nan]]]
    with caplog.at_level("WARNING", logger="trl_rpg"):
        for _ in range(3):
            output = checked_output(([[1]], [[5, 6, 7, 8, 9, 10]], logprobs, None), ENGINE, warned)
            assert output[2] == [[[-0.1], [LOGPROB_ROUNDING], [0.0], [None], [None], [None]]]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and warned == {"above 0", "non-finite"}
    assert "returned 2 log-prob(s) of sampled tokens above 0" in messages[1] and "logits" in messages[1]


def test_the_mismatch_kl_reads_log_w_with_its_sign():
    """`rpg/sampler_mismatch_kl` is k3 = w - 1 - log w with log w = log pi_old - log mu: with log w = +0.5 at both
    tokens it is e^0.5 - 1.5 = 0.1487; flipping the sign of log w gives e^-0.5 - 0.5 = 0.1065 (the mean and max of
    |log w| cannot tell)."""
    from trl_rpg.trainers.sampler_logps import mismatch_metrics

    logps, sampler = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.5]])
    metrics = mismatch_metrics(logps, sampler, torch.ones(1, 2), lambda t: t)
    assert metrics["rpg/sampler_mismatch_kl"] == pytest.approx(math.exp(0.5) - 1.5, rel=1e-6)
    assert metrics["rpg/sampler_mismatch_mean"] == pytest.approx(0.5) == metrics["rpg/sampler_mismatch_max"]


# ----------------------------------------------------------------------------------------------------------------
# A malformed output names the engine
# ----------------------------------------------------------------------------------------------------------------

ENGINE = "the colocated vLLM engine (vllm_mode='colocate')"


@pytest.mark.parametrize("logprobs,detail", [
    (None, "it returned 2 completions and no log-probs"),
    ([[[-0.1], [-0.2]]], "it returned 2 completions and 1 lists of log-probs"),
    ([[[-0.1], [-0.2]], [[-0.3]]], "completion 1 of 2 has 2 tokens and 1 log-probs"),
    ([[[-0.1], [-0.2]], [[-0.3], []]], "completion 1 of 2 has a token without a log-prob"),
    ([[[-0.1], ["x"]], [[-0.3], [-0.4]]], "completion 0 of 2 has a log-prob that is not a number"),
], ids=["none", "too-few-lists", "one-missing", "empty-position", "not-a-number"])
def test_a_malformed_engine_output_is_named(logprobs, detail):
    with pytest.raises(MalformedEngineOutput, match="the output of the colocated vLLM engine .* is malformed: " +
                       detail):
        checked_output(([[1], [1]], [[5, 6], [7, 8]], logprobs, None), ENGINE)
    with pytest.raises(MalformedEngineOutput, match="completion 0 of 1 is empty"):
        checked_output(([[1]], [[]], [[]], None), ENGINE)


def test_non_finite_logprobs_become_missing_and_the_rest_is_kept():
    output = checked_output(([[1]], [[5, 6, 7]], [[[-0.1, -0.5], [-math.inf, -0.1], [None]]], [[[5, 4], [6, 5], [7]]]),
                            ENGINE)
    assert output[2] == [[[-0.1, -0.5], [None, -0.1], [None]]] and output[3] == [[[5, 4], [6, 5], [7]]]


def test_the_check_leaves_an_instance_wrapper_of_generate_in_place():
    """Whoever wraps `vllm_generation.generate` on the instance (a profiler, benchmarks/cost_vllm.py's timer) keeps
    the wrapper after each checked generation; without one, the class's method is visible again."""
    from trl_rpg._compat import returning_through

    class Generation:
        def generate(self):
            return "class"

    generation = Generation()
    with returning_through(generation, "generate", lambda out: out + " checked"):
        assert generation.generate() == "class checked"
    assert "generate" not in vars(generation)
    generation.generate = lambda: "wrapper"
    with returning_through(generation, "generate", lambda out: out + " checked"):
        assert generation.generate() == "wrapper checked"
    assert generation.generate() == "wrapper"


def test_a_malformed_output_stops_training_naming_the_engine(fake_vllm, model_dir, tmp_path):
    """A completion whose last log-prob is missing: TRL would fail later with a raw shape error."""
    trainer = build(model_dir, tmp_path, max_steps=1)

    def drop_last(completion):
        completion.logprobs = completion.logprobs[:-1]
        return completion

    rewrite_outputs(engine_of(trainer), drop_last)
    with pytest.raises(MalformedEngineOutput, match=r"colocated vLLM engine .* completion 0 of \d+ has \d tokens and"):
        trainer.train()


# ----------------------------------------------------------------------------------------------------------------
# Where "engine" is not exact: refused when asked for, not chosen by "auto"
# ----------------------------------------------------------------------------------------------------------------

OBSTACLES = [
    ({"use_vllm": False}, "use_vllm=False"),
    ({"top_p": 0.9}, "top_p=0.9"), ({"top_k": 5}, "top_k=5"), ({"min_p": 0.1}, "min_p=0.1"),
    ({"generation_kwargs": {"top_k": 3}}, "top_k=3"),
    ({"vllm_structured_outputs_regex": "[0-9]+"}, "vllm_structured_outputs_regex"),
    ({"rpg_reference": "initial"}, "rpg_reference='initial'"),
]


@pytest.mark.parametrize("setting,named", OBSTACLES, ids=[named for _, named in OBSTACLES])
def test_engine_is_refused_where_it_is_not_exact_and_auto_recomputes(tmp_path, setting, named):
    base = dict(use_vllm=True, vllm_mode="colocate", beta=0.1)
    with pytest.raises(ValueError, match=r"`rpg_sampler_logps`='engine' is not allowed here.*" + named.replace(
            "[", r"\[")):
        RPGConfig(**cpu_args(tmp_path, **{**base, **setting}, rpg_sampler_logps="engine"))
    resolved = SamplerLogps.for_trainer(SimpleNamespace(args=RPGConfig(**cpu_args(tmp_path, **{**base, **setting})),
                                                        rollout_func=None))
    assert resolved.mode == "recompute" and (named in resolved.reason if setting.get("use_vllm", True) else
                                             resolved.reason is None)
    assert SamplerLogps.for_trainer(SimpleNamespace(args=RPGConfig(**cpu_args(tmp_path, **base)),
                                                    rollout_func=None)).mode == "engine"
    with pytest.raises(ValueError, match=r"`rpg_sampler_logps`='vllm' is not allowed; choose one of \['auto'"):
        RPGConfig(**cpu_args(tmp_path, rpg_sampler_logps="vllm"))


#: Issue 45: every generation setting that cuts the sampler's support or reweights it, one case each (the table of
#: docs/math.md section 4c): "auto" recomputes, naming it; "engine" is refused naming it.
SAMPLER_SETTINGS_CASES = [
    ("min_tokens", {"generation_kwargs": {"min_tokens": 4}}, "min_tokens=4"),
    ("bad_words", {"generation_kwargs": {"bad_words": ["abc"]}}, "bad_words=['abc']"),
    ("allowed_token_ids", {"generation_kwargs": {"allowed_token_ids": [1, 2]}}, "allowed_token_ids=[1, 2]"),
    ("structured_outputs", {"generation_kwargs": {"structured_outputs": {"regex": "[0-9]+"}}},
     "structured_outputs={'regex': '[0-9]+'}"),
    ("guided_decoding", {"generation_kwargs": {"guided_decoding": {"choice": ["a", "b"]}}}, "guided_decoding="),
    ("logit_bias", {"generation_kwargs": {"logit_bias": {5: -100}}}, "logit_bias={5: -100}"),
    ("logit_bias", {"generation_kwargs": {"logit_bias": {5: 2.0}}}, "logit_bias={5: 2.0}"),
    ("logits_processors", {"generation_kwargs": {"logits_processors": ["my.Processor"]}},
     "logits_processors=['my.Processor']"),
    ("repetition_penalty", {"repetition_penalty": 1.1}, "repetition_penalty=1.1"),
    ("repetition_penalty", {"generation_kwargs": {"repetition_penalty": 0.9}}, "repetition_penalty=0.9"),
    ("presence_penalty", {"generation_kwargs": {"presence_penalty": 0.5}}, "presence_penalty=0.5"),
    ("frequency_penalty", {"generation_kwargs": {"frequency_penalty": -0.5}}, "frequency_penalty=-0.5"),
]
NEUTRAL = {"min_tokens": 0, "bad_words": [], "allowed_token_ids": None, "structured_outputs": None,
           "guided_decoding": None, "logit_bias": {5: 0.0}, "logits_processors": [], "repetition_penalty": 1.0,
           "presence_penalty": 0.0, "frequency_penalty": 0.0, "temperature": 0.7}


def resolved_mode(tmp_path, **setting) -> SamplerLogps:
    args = RPGConfig(**cpu_args(tmp_path, use_vllm=True, vllm_mode="colocate", beta=0.1, **setting))
    return SamplerLogps.for_trainer(SimpleNamespace(args=args, rollout_func=None))


@pytest.mark.parametrize("name,setting,named", SAMPLER_SETTINGS_CASES, ids=[c[2] for c in SAMPLER_SETTINGS_CASES])
def test_each_sampler_setting_keeps_auto_on_recompute(tmp_path, name, setting, named):
    """`min_tokens` or a `logit_bias` of -100 cut the support as `allowed_token_ids` does; penalties and a positive
    bias reweight it: "auto" used to pick "engine" under them (and under all but three support settings)."""
    resolved = resolved_mode(tmp_path, **setting)
    assert resolved.mode == "recompute" and named in resolved.reason
    with pytest.raises(ValueError, match="`rpg_sampler_logps`='engine' is not allowed here"):
        RPGConfig(**cpu_args(tmp_path, use_vllm=True, beta=0.1, rpg_sampler_logps="engine", **setting))
    assert name in NEUTRAL


def test_neutral_sampler_settings_keep_the_engine(tmp_path):
    """Each setting at its neutral value (and temperature, which the processed log-probs include) leaves "auto" on
    "engine"."""
    assert resolved_mode(tmp_path, generation_kwargs=dict(NEUTRAL)).mode == "engine"
    assert resolved_mode(tmp_path, repetition_penalty=1.0, temperature=0.7).mode == "engine"


def test_the_sampler_settings_table_is_the_code_and_the_docs():
    """Every setting the code checks has a case above and a row in docs/math.md section 4c (and the reverse)."""
    from pathlib import Path

    from trl_rpg.trainers.sampler_logps import SAMPLER_SETTINGS

    assert set(SAMPLER_SETTINGS) == {c[0] for c in SAMPLER_SETTINGS_CASES} == set(NEUTRAL) - {"temperature"}
    text = (Path(__file__).resolve().parents[1] / "docs" / "math.md").read_text()
    section = text[text.index("## 4c."):text.index("## 5.")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    for name in [*SAMPLER_SETTINGS, "top_p", "top_k", "min_p", "vllm_structured_outputs_regex", "temperature"]:
        assert sum(f"`{name}" in row for row in rows) == 1, name


@pytest.mark.parametrize("info", [{"model_config": {}}, {"model_config": {"logprobs_mode": None}}, {}, None],
                         ids=["no-mode", "mode-none", "no-model-config", "no-info"])
def test_a_server_that_does_not_report_its_logprobs_mode_is_taken_as_raw(tmp_path, info):
    """Nothing says such a server's log-probs are the sampler's: "auto" recomputes, naming it."""
    args = RPGConfig(**cpu_args(tmp_path, use_vllm=True, vllm_mode="server", beta=0.1))
    client = SimpleNamespace(get_server_info=lambda: info)
    trainer = SimpleNamespace(args=args, rollout_func=None, vllm_generation=SimpleNamespace(vllm_client=client),
                              accelerator=SimpleNamespace(is_main_process=True, num_processes=1))
    resolved = SamplerLogps.for_trainer(trainer)
    assert resolved.mode == "recompute" and "does not report its logprobs_mode (taken as raw)" in resolved.reason
    info = {"model_config": {"logprobs_mode": "processed_logprobs"}}
    assert SamplerLogps.for_trainer(trainer).mode == "engine"


def test_a_rollout_func_keeps_the_recomputed_mu(tmp_path):
    args = RPGConfig(**cpu_args(tmp_path, use_vllm=True, vllm_mode="colocate"))
    resolved = SamplerLogps.for_trainer(SimpleNamespace(args=args, rollout_func=lambda prompts, trainer: {}))
    assert resolved.mode == "recompute" and "rollout_func" in resolved.reason


def test_a_server_without_processed_logprobs(fake_vllm, model_dir, tmp_path):
    """`trl vllm-serve` without `--logprobs-mode processed_logprobs`: "auto" recomputes (the pass runs), "engine" is
    refused naming the flag."""
    with served(model_dir, logprobs_mode="raw_logprobs"):
        trainer = build(model_dir, tmp_path / "auto", max_steps=1, vllm_mode="server")
        assert trainer.sampler_logps.mode == "recompute" and "--logprobs-mode processed_logprobs" in \
            trainer.sampler_logps.reason
        trainer.train()
        assert no_grad_rows(trainer) == GENERATION_BATCH
        with pytest.raises(ValueError, match="`rpg_sampler_logps`='engine' is not allowed.*logprobs_mode='raw_"):
            build(model_dir, tmp_path / "engine", max_steps=1, vllm_mode="server", rpg_sampler_logps="engine")


def test_the_start_up_line_says_what_mu_is(tmp_path):
    args = RPGConfig(**cpu_args(tmp_path, use_vllm=True, beta=0.0, rpg_estimator="differentiable",
                                rpg_dual_clip_c=None))
    engine = describe_objective(args, SamplerLogps("engine", None, ENGINE))
    assert "mu: those vLLM returned" in engine and "vllm_importance_sampling_correction, _mode, _clip_min and " \
        "_clip_max have no effect" in engine and "this trains exactly as GRPOTrainer" not in engine
    recompute = describe_objective(args, SamplerLogps("recompute", "top_p=0.9: cut", ENGINE))
    assert "pi_old recomputed by the trainer (rpg_sampler_logps='recompute' ('auto' chose it: top_p=0.9: cut))" in \
        recompute and "vllm_importance_sampling_mode='sequence_mask') weighs every term" in recompute
    assert "this trains exactly as GRPOTrainer" in recompute
    assert "Sampler log-probs" not in describe_objective(args, SamplerLogps("recompute"))  # no vLLM


# ----------------------------------------------------------------------------------------------------------------
# Resume inside a reused engine batch
# ----------------------------------------------------------------------------------------------------------------


def test_resume_inside_a_reused_engine_batch_is_exact(fake_vllm, model_dir, tmp_path, monkeypatch):
    """A perturbed engine; a checkpoint at step 2 of the 4 steps one batch is reused for. Resumed there (in engine
    mode, or in recompute mode: the restored batch keeps its own mu), the run ends with the uninterrupted run's
    parameters, and logs no mismatch for a batch generated before the resume."""
    monkeypatch.setenv(KERNEL_MISMATCH_ENV, str(KERNEL_MISMATCH))
    saving = dict(save_strategy="steps", save_steps=2)
    whole = build(model_dir, tmp_path / "run", **saving)
    whole.train()
    for mode in ("engine", "recompute"):
        resumed = build(model_dir, tmp_path / "run", **saving, rpg_sampler_logps=mode)
        resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
        assert no_grad_rows(resumed) == 0
        assert max_difference(parameters(resumed), parameters(whole)) <= PARAM_ATOL
        after = [entry for entry in resumed.state.log_history if entry.get("step", 0) > 2 and "loss" in entry]
        assert len(after) == 2 and not any("rpg/sampler_mismatch_mean" in entry for entry in after)
    assert max(logged(whole, "rpg/sampler_mismatch_mean")) > 0.1


# ----------------------------------------------------------------------------------------------------------------
# Two processes: colocated engines (full fine-tuning) and one server (LoRA), one launch
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_two_processes_engine_trains_to_recompute_parameters(model_dir, tmp_path):
    """DDP, two processes: per pair, "engine" makes no no-grad pass on either rank, "recompute" one over each rank's
    half of the generation batch, and both end with the same parameters; the mismatch is one value for both ranks."""
    from test_vllm_generation import launch_vllm

    runs = []
    for server, peft in ((False, False), (True, True)):
        config = settings(learning_rate=20.0 if peft else 1.5)
        for mode in ("engine", "recompute"):
            runs.append({"name": f"{'server' if server else 'colocate'}_{mode}", "trainer": "rpg", "peft": peft,
                         "server": server, "config": dict(config, rpg_sampler_logps=mode),
                         **({"compare_to": f"{'server' if server else 'colocate'}_engine"} if mode == "recompute"
                            else {})})
    ranks = launch_vllm(tmp_path, "ddp", model_dir, runs)
    for where in ("colocate", "server"):
        for results in ranks:
            engine, recompute = results[f"{where}_engine"], results[f"{where}_recompute"]
            assert (engine["sampler_logps"], recompute["sampler_logps"]) == ("engine", "recompute")
            assert engine["no_grad_rows"] == 0 and recompute["no_grad_rows"] == GENERATION_BATCH
            assert recompute["difference_to"] <= PARAM_ATOL
            assert len(engine["mismatch"]) == 4 and recompute["mismatch"] == []
        assert ranks[0][f"{where}_engine"]["mismatch"] == ranks[1][f"{where}_engine"]["mismatch"]


def test_dynamic_sampling_keeps_the_engine_mu(fake_vllm, model_dir, tmp_path):
    """DAPO's dynamic sampling (the recipes' setting) regroups the rows of several generation rounds: the merged
    batch is still an engine batch, with no old-log-prob pass in any round."""
    trainer = build(model_dir, tmp_path, max_steps=2, dynamic_sampling=True, dynamic_sampling_max_rounds=3)
    trainer.train()
    assert trainer.sampler_logps.mode == "engine" and no_grad_rows(trainer) == 0
    assert max(logged(trainer, "dynamic_sampling/rounds")) >= 2  # rows of several rounds merged
    assert all(ENGINE_KEY in batch and "old_per_token_logps" not in batch for batch in trainer._buffered_inputs)
    assert len(logged(trainer, "rpg/sampler_mismatch_mean")) == 2
