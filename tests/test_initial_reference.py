"""`rpg_reference="initial"` is the policy at the start of training, the model the user passed in (issue 27 sec. 3).

TRL builds its reference model from the model's path, so a model changed in memory before RL (an SFT stage in the
same script, merged adapters) would be regularised towards its on-disk weights (measured before the fix: divergence
3.5e-2 at step 1). RPGTrainer copies the policy into it once at construction; at step 1 pi_theta = pi_ref, so the
logged divergence is exactly 0. With PEFT: a `PeftModel` passed in is regularised towards its initial adapter (not
the adapter-disabled base), a `peft_config` towards the base model, which is the policy at the start while the new
LoRA adapter is the identity. Where the path's model has other parameters than the policy, the trainer warns.
"""

import warnings

import pytest
import torch
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from trl_rpg import RPGConfig, RPGTrainer

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def changed_in_memory(model_path):
    """The saved model, then changed in memory (as an SFT stage in the same script would change it)."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def first_step_divergence(tmp_path, model, **settings):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1, beta=0.1, **settings))
    trainer = RPGTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    [divergence] = [h["rpg/divergence"] for h in trainer.state.log_history if "loss" in h]
    return divergence


@pytest.mark.parametrize("settings", [dict(rpg_reference="initial"),
                                      dict(rpg_reference="periodic", rpg_reference_update_steps=2)])
def test_reference_starts_as_the_model_passed_in_not_its_saved_weights(tmp_path, model_path, settings):
    model = changed_in_memory(model_path)
    assert first_step_divergence(tmp_path, model, **settings) == 0.0


def test_peft_model_passed_in_is_regularised_towards_its_initial_adapter(tmp_path, model_path):
    """A PeftModel whose adapter is not the identity: its reference is that adapter (divergence 0 at step 1), not the
    base model with the adapter disabled."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path),
                           LoraConfig(init_lora_weights=False, **LORA))
    assert first_step_divergence(tmp_path, model, rpg_reference="initial") == 0.0


def test_peft_config_is_regularised_towards_the_base_model(tmp_path, model_path):
    """A peft_config: the reference is the base model (adapter disabled), the policy at the start of training while
    the new LoRA adapter is the identity (its default initialisation)."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1, beta=0.1, rpg_reference="initial"))
    trainer = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(),
                         peft_config=LoraConfig(**LORA))
    assert "ref" not in trainer.model.peft_config  # no adapter copy: the reference is the adapter disabled
    trainer.train()
    [divergence] = [h["rpg/divergence"] for h in trainer.state.log_history if "loss" in h]
    assert divergence == 0.0


def test_a_reference_that_cannot_be_the_policy_is_named_at_construction(tmp_path, model_path):
    """Resized embeddings: TRL's reference model (loaded from the path) has other shapes than the policy, so it stays
    the saved model, and the trainer says so."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    saved = model.config.vocab_size
    model.resize_token_embeddings(saved + 8)
    args = RPGConfig(**cpu_args(tmp_path, beta=0.1, rpg_reference="initial"))
    with pytest.warns(UserWarning, match=rf"reference is the model as saved at '{model_path}', not the model passed "
                                         rf"in.*embed_tokens.weight \({saved + 8}, 32\) vs .*embed_tokens.weight "
                                         rf"\({saved}, 32\)"):
        RPGTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    with warnings.catch_warnings():  # the model as saved: no warning
        warnings.simplefilter("error", UserWarning)
        RPGTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), reward_funcs=length_reward, args=args,
                   train_dataset=tiny_dataset())


@pytest.mark.parametrize("init", [False, "pissa", "olora"])
def test_peft_config_whose_adapter_is_not_the_identity_warns_naming_init_lora_weights(tmp_path, model_path, init):
    """Issue 34 section 5: with such an adapter the adapter-disabled reference is the (residual) base model, not the
    policy at the start (step-1 divergence measured 1.1e-2, 6.6e-4, 1.8e-3 at learning rate 0), as in GRPO: the
    trainer says so at construction, naming the setting and the way to regularise towards the start."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1, beta=0.1, rpg_reference="initial"))
    with pytest.warns(UserWarning, match=rf"init_lora_weights={init!r}: the adapter is not the identity.*not the "
                                         r"policy at the start.*pass a PeftModel"):
        RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(),
                   peft_config=LoraConfig(init_lora_weights=init, **LORA))
    with warnings.catch_warnings():  # LoRA's default initialisation (B = 0) is the identity: no warning
        warnings.filterwarnings("error", message=".*init_lora_weights", category=UserWarning)
        RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(),
                   peft_config=LoraConfig(**LORA))
