"""What RPG says beta does is what it does in training, where more than the layout decides (issue 45).

The layout can make log(pi/ref) = 0 in principle (the sampler as reference with every micro-batch on-policy, or a
reference refreshed after every optimizer step: `describe.inert_kl_reason`); the KL term then acts all the same where
the trainer's policy is not its reference in the training forward:

- under vLLM with `rpg_sampler_logps` "auto" -> "engine", mu and the reference are the engine's log-probs, which differ
  from the trainer's by the train/inference mismatch (the fake engine's kernel mismatch here): parameters at beta 1
  and 0 differ (the issue measured 0.30 after 3 steps at a mismatch of 0.3), where the config warned "trains exactly
  as with beta=0" and the start-up line contradicted itself; with "recompute" they are equal, as then said;
- with TRL's `disable_dropout=False` and LoRA dropout, a reference refreshed every step (its pass runs without
  dropout) is not the policy that trains: parameters at two betas differ (the issue: 0.076 of a 0.10 move); with
  `disable_dropout=True` they are equal, as then said.

Each case trains two betas and checks the words (the construction warning, the start-up line) against the parameters.
The loss-type case (a length bias for FKL/RKL outside `dr_grpo`) is an expectation, shown by exact enumeration in
tests/test_kl_normalisation.py. Cost: 10 short single-process runs (about 40 s on 2 cores).
"""

from __future__ import annotations

import logging
import warnings

import pytest
from _equivalence import max_difference, parameters
from _fake_vllm import installed
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from peft import LoraConfig

from trl_rpg import RPGConfig, RPGTrainer

KERNEL_MISMATCH_ENV = "FAKE_VLLM_KERNEL_MISMATCH"  # tests/vllm_stub/vllm/__init__.py
#: Parameter moves below this are float noise of two forward passes (recompute: w = 1 up to ~1e-7 per token).
SAME = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("kl_claims_model")))


def run(model_dir, output_dir, caplog, peft=None, **overrides) -> tuple[RPGTrainer, str, str]:
    """Three plain-SGD steps, every micro-batch on-policy; the trained model, its construction warnings (config and
    trainer) and its start-up line."""
    values = dict(max_steps=3, rpg_generation_reuse=1, temperature=1.0, gradient_checkpointing=False, optim="sgd",
                  learning_rate=1.0, max_grad_norm=0.0, lr_scheduler_type="constant", disable_tqdm=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        args = RPGConfig(**cpu_args(output_dir, **{**values, **overrides}))
        trainer = RPGTrainer(model=model_dir, reward_funcs=length_reward, train_dataset=tiny_dataset(), args=args,
                             peft_config=peft)
    said = " ".join(str(r.message) for r in record if "beta=" in str(r.message))
    trainer.initial = parameters(trainer)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_rpg"):
        trainer.train()
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("RPGTrainer: optimising")]
    return trainer, said, line


def moved(first: RPGTrainer, second: RPGTrainer) -> float:
    return max_difference(parameters(first), parameters(second))


@pytest.fixture(scope="module")
def fake_vllm():
    with installed():
        yield


VLLM = dict(use_vllm=True, vllm_mode="colocate", rpg_divergence="urkl")


@pytest.mark.parametrize("mismatch", [0.3, 0.02])
def test_engine_logprobs_make_beta_act_on_policy_and_say_so(fake_vllm, model_dir, tmp_path, caplog, monkeypatch,
                                                             mismatch):
    """URKL (exactly 0 where pi = pi_ref), vLLM colocate, on-policy, "auto" -> "engine": beta pulls towards the
    engine's distribution, so the parameters at beta 1 and 0 differ, even at a small mismatch, and the words say so
    (they said "trains exactly as with beta=0")."""
    monkeypatch.setenv(KERNEL_MISMATCH_ENV, str(mismatch))
    engine = {beta: run(model_dir, tmp_path / f"engine{beta}", caplog, beta=beta, **VLLM) for beta in (1.0, 0.0)}
    trainer, said, line = engine[1.0]
    assert trainer.sampler_logps.mode == "engine"
    assert moved(engine[1.0][0], engine[0.0][0]) > 1e-3
    assert "train/inference mismatch" in said and "does not train as with beta=0" in said
    assert "rpg_sampler_logps='recompute' removes it" in said and "trains exactly as with beta=0" not in said
    assert "as with beta=0" not in line and "train/inference mismatch makes w != 1" in line


def test_recomputed_logprobs_leave_beta_inert_on_policy_and_say_so(fake_vllm, model_dir, tmp_path, caplog,
                                                                   monkeypatch):
    """The same with rpg_sampler_logps="recompute" (mu = pi_old, the trainer's own): equal parameters at beta 1 and
    0, and the words say "as with beta=0"."""
    monkeypatch.setenv(KERNEL_MISMATCH_ENV, "0.3")
    recompute = {beta: run(model_dir, tmp_path / f"recompute{beta}", caplog, beta=beta, rpg_sampler_logps="recompute",
                           **VLLM) for beta in (1.0, 0.0)}
    trainer, said, line = recompute[1.0]
    assert trainer.sampler_logps.mode == "recompute"
    assert moved(recompute[1.0][0], recompute[0.0][0]) < SAME < max_difference(parameters(trainer), trainer.initial)
    assert "trains exactly as with beta=0" in said and "The KL term is 0 at every token here" in line


LORA_DROPOUT = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.3,
                          task_type="CAUSAL_LM")


def test_dropout_makes_beta_act_against_a_reference_refreshed_every_step_and_say_so(model_dir, tmp_path, caplog):
    """LoRA with lora_dropout 0.3, the reference refreshed after every step, URKL: with TRL's default
    disable_dropout=False the training forward draws dropout and the reference pass does not, so beta acts (two betas,
    two results) and the trainer says so at construction; with disable_dropout=True the results are equal, as
    said."""
    periodic = dict(rpg_reference="periodic", rpg_reference_update_steps=1, rpg_divergence="urkl",
                    learning_rate=20.0)
    on = {beta: run(model_dir, tmp_path / f"on{beta}", caplog, peft=LORA_DROPOUT, beta=beta, **periodic)
          for beta in (2.0, 0.5)}
    trainer, said, line = on[2.0]
    assert moved(on[2.0][0], on[0.5][0]) > 1e-3
    assert "RPGTrainer: beta=2.0 regularises towards nothing you asked for" in said
    assert "dropout is on in the training forward (lora_dropout=0.3; disable_dropout=False)" in said
    assert "disable_dropout=True" in said and "This holds only without dropout" in said  # the config's proviso
    assert "as with beta=0" not in line and "dropout is on in the training forward (lora_dropout=0.3)" in line

    off = {beta: run(model_dir, tmp_path / f"off{beta}", caplog, peft=LORA_DROPOUT, beta=beta, disable_dropout=True,
                     **periodic) for beta in (2.0, 0.5)}
    trainer, said, line = off[2.0]
    assert moved(off[2.0][0], off[0.5][0]) < SAME < max_difference(parameters(trainer), trainer.initial)
    assert "trains exactly as with beta=0" in said and "RPGTrainer: beta" not in said
    assert "The KL term is 0 at every token here" in line


def test_where_dropout_acts_in_the_training_forward():
    """`describe.training_dropout`: the model config's attention_dropout (which TRL's disable_dropout does not reach),
    an nn.Dropout with p > 0, the active LoRA adapter's lora_dropout; not RPG's frozen "ref" adapter's, which never
    trains."""
    from _tiny import tiny_model, tiny_tokenizer
    from peft import get_peft_model
    from torch import nn

    from trl_rpg.trainers.describe import training_dropout

    model = tiny_model(tiny_tokenizer())
    assert training_dropout(model) == []
    model.config.attention_dropout = 0.1
    assert training_dropout(model) == ["attention_dropout=0.1"]
    model.config.attention_dropout = 0.0
    model.model.layers[0].mlp.extra = nn.Dropout(0.2)
    assert training_dropout(model) == ["model dropout p=0.2"]
    model.model.layers[0].mlp.extra = nn.Dropout(0.0)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.0,
                                            task_type="CAUSAL_LM"))
    peft.add_adapter("ref", LORA_DROPOUT)
    assert training_dropout(peft) == []  # only the inactive "ref" adapter has dropout
    peft.set_adapter("ref")
    assert training_dropout(peft) == ["lora_dropout=0.3"]
