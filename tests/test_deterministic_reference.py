"""The reference policy is deterministic whatever the dropout settings (issue 34 section 1, docs/math.md section 4).

A moving reference under LoRA is a frozen copy of the adapter ("ref") added after TRL's `disable_dropout` pass, so it
kept its `lora_dropout`; its log-probs were computed with the model in training mode: with `lora_dropout=0.5` and the
reference refreshed after every step, log r measured 0.13-0.26 where it is 0. Every reference pass (TRL's at
generation, wrapped by `_compat.around_trl_reference_pass`, and RPG's recomputation in `ReferencePolicy.logps`) now
runs with every module in eval mode (`reference.without_dropout`). With full fine-tuning, model dropout and
`disable_dropout=False`, the reference is the reference model in eval mode (the network without dropout); the policy's
and the sampler's log-probs stay TRL's training-mode ones, as in GRPO.
"""

import warnings

import pytest
import torch
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset, tiny_model, tiny_tokenizer
from peft import LoraConfig

from trl_rpg import RPGConfig, RPGTrainer

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def dropout_model_path(tmp_path_factory):
    """The tiny model with attention dropout 0.5 (active in training mode)."""
    path = str(tmp_path_factory.mktemp("dropout_model"))
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    model.config.attention_dropout = 0.5
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_moving_lora_reference_refreshed_every_step_equals_the_policy(tmp_path, model_path):
    """lora_dropout 0.5, disable_dropout=True (the policy is deterministic), the "ref" adapter refreshed after every
    optimizer step: log r = 0 at every token of every micro-batch, at step 1 (TRL's reference pass at generation)
    and at step 2 (RPG's recomputation after the update), so the logged divergence is exactly 0."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*regularises nothing", category=UserWarning)
        args = RPGConfig(**cpu_args(tmp_path, max_steps=2, beta=0.5, learning_rate=0.05, disable_dropout=True,
                                    rpg_reference="periodic", rpg_reference_update_steps=1))
    trainer = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(),
                         peft_config=LoraConfig(lora_dropout=0.5, **LORA))  # no model dropout: only the adapter's
    assert trainer.model.base_model.model.model.layers[0].self_attn.q_proj.lora_dropout["ref"].p == 0.5
    trainer.train()
    divergences = [h["rpg/divergence"] for h in trainer.state.log_history if "loss" in h]
    assert len(divergences) == 2 and trainer.reference.updates == 2
    assert divergences == [0.0, 0.0]


def generation_batch(trainer):
    trainer.model.train()
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def eval_mode_logps(trainer, batch, adapter_disabled=False):
    """The log-probs of `batch` under the model passed in with dropout off (the policy at the start)."""
    model = trainer.model
    model.eval()
    try:
        with torch.no_grad():
            ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
            mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
            call = lambda: trainer._get_per_token_logps_and_entropies(  # noqa: E731
                model, ids, mask, batch["completion_ids"].size(1))[0]
            if adapter_disabled:
                with model.disable_adapter():
                    return call()
            return call()
    finally:
        model.train()


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_initial_reference_has_no_dropout_whatever_disable_dropout_says(tmp_path, dropout_model_path, peft):
    """Attention dropout 0.5 and disable_dropout=False (dropout on in training mode): the reference log-probs TRL
    stores at generation and those RPG recomputes are the same deterministic values, the model's without dropout
    (full fine-tuning: the reference model, kept in eval mode; LoRA: the base model with the adapter disabled)."""
    args = RPGConfig(**cpu_args(tmp_path, beta=0.1, disable_dropout=False, rpg_reference="initial"))
    trainer = RPGTrainer(model=dropout_model_path, reward_funcs=length_reward, args=args,
                         train_dataset=tiny_dataset(), peft_config=LoraConfig(**LORA) if peft else None)
    batch = generation_batch(trainer)
    completion_length = batch["completion_ids"].size(1)
    stored = batch.pop("ref_per_token_logps")  # TRL's pass at generation
    recomputed = trainer.reference.logps(batch, completion_length)
    batch.pop("ref_per_token_logps")
    again = trainer.reference.logps(batch, completion_length)
    mask = batch["completion_mask"].bool()
    assert trainer.model.training
    with torch.no_grad():  # the precondition: in training mode, dropout makes two passes of the model differ
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        first, second = (trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                                    completion_length)[0] for _ in range(2))
    assert (first - second)[mask].abs().max() > 1e-3
    torch.testing.assert_close(recomputed[mask], again[mask], rtol=0, atol=0)
    torch.testing.assert_close(stored[mask], recomputed[mask], rtol=0, atol=0)
    torch.testing.assert_close(recomputed[mask], eval_mode_logps(trainer, batch, adapter_disabled=peft)[mask],
                               rtol=0, atol=1e-6)
    if not peft:
        assert not trainer.ref_model.training
