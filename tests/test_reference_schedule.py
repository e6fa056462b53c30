"""Reference policy schedules (paper section 5, "iterative reference updates"; docs/math.md section 4)."""

import pytest
import torch
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from peft import LoraConfig
from transformers import TrainerCallback

from trl_rpg import RPGConfig, RPGTrainer


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def lora():
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def probe(trainer):
    tok = trainer.processing_class
    prompt = tok(["1+2=", "3*4="], return_tensors="pt", padding=True)
    completion = tok(["3<eos>", "12"], return_tensors="pt", padding=True, padding_side="right")
    return {"prompt_ids": prompt.input_ids, "prompt_mask": prompt.attention_mask,
            "completion_ids": completion.input_ids, "completion_mask": completion.attention_mask}


class RecordReference(TrainerCallback):
    """Reference log-probs of a fixed probe after every optimizer step (and the policy's, for comparison)."""

    def __init__(self, trainer):
        self.trainer, self.ref, self.policy, self.updates = trainer, [], [], []

    def on_step_end(self, args, state, control, **kwargs):
        inputs = probe(self.trainer)
        t = inputs["completion_ids"].size(1)
        self.ref.append(self.trainer.reference.logps(dict(inputs), t).clone())
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            logps, _, _ = self.trainer._get_per_token_logps_and_entropies(self.trainer.model, ids, mask, t)
        self.policy.append(logps)
        self.updates.append(self.trainer.reference.updates)


def test_sampling_reference_creates_no_reference_model_even_with_beta(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, beta=0.5, rpg_reference="sampling"))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    assert trainer.ref_model is None and trainer.args.beta == 0.5 and not trainer.trl_computes_reference_logps
    trainer.train()
    assert "ref_per_token_logps" not in trainer._buffered_inputs[0]
    assert trainer.state.log_history[1]["rpg/divergence"] > 0  # the KL acts on the reused batch


def test_sampling_reference_with_lora_adds_no_reference_adapter(tmp_path, model_path):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=2, beta=0.5))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                         peft_config=lora())
    assert list(trainer.model.peft_config) == ["default"]
    trainer.train()


@pytest.mark.parametrize("use_lora", [False, True])
def test_periodic_reference_updates_exactly_when_due(tmp_path, model_path, use_lora):
    args = RPGConfig(**cpu_args(tmp_path, max_steps=5, beta=0.1, rpg_reference="periodic",
                                rpg_reference_update_steps=2, steps_per_generation=4,
                                learning_rate=5e-2 if use_lora else 1e-2))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                         peft_config=lora() if use_lora else None)
    recorder = RecordReference(trainer)
    trainer.add_callback(recorder)
    initial = trainer.reference.logps(probe(trainer), probe(trainer)["completion_ids"].size(1)).clone()
    trainer.train()
    previous = [initial] + recorder.ref[:-1]
    changed = [not torch.equal(before, after) for before, after in zip(previous, recorder.ref)]
    assert changed == [False, True, False, True, False]  # steps 1..5, K = 2
    assert recorder.updates == [0, 1, 1, 2, 2]
    for step in (1, 3):  # right after an update the reference IS the policy
        torch.testing.assert_close(recorder.ref[step], recorder.policy[step], rtol=0, atol=1e-6)
    assert not torch.allclose(recorder.ref[4], recorder.policy[4])
    if use_lora:
        model = trainer.model
        assert "ref" in model.peft_config
        assert all(not p.requires_grad for n, p in model.named_parameters() if ".ref." in n)
        assert trainer.ref_model is None  # the snapshot is an adapter, not a second model


def test_buffered_batch_is_rescored_after_a_reference_update(tmp_path, model_path):
    """A reference update in the middle of a reused generation batch refreshes the stored reference log-probs."""
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, beta=0.1, rpg_reference="periodic",
                                rpg_reference_update_steps=2, steps_per_generation=4))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    assert int(trainer._buffered_inputs[2]["rpg_ref_version"]) == 1  # used at step 3, after the update
    assert int(trainer._buffered_inputs[3]["rpg_ref_version"]) == 0  # not used yet


@pytest.mark.parametrize("use_lora", [False, True])
def test_adaptive_reference_updates_when_the_divergence_crosses_the_target(tmp_path, model_path, use_lora):
    target = 2e-3
    args = RPGConfig(**cpu_args(tmp_path, max_steps=8, beta=0.1, rpg_reference="adaptive",
                                rpg_reference_kl_target=target, rpg_reference_kl_decay=0.5,
                                steps_per_generation=4, learning_rate=5e-2 if use_lora else 1e-2))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                         peft_config=lora() if use_lora else None)
    seen = []
    original = trainer.reference.update

    def update_and_record():
        seen.append(("update", trainer.state.global_step, trainer.reference.trigger.average))
        original()

    trainer.reference.update = update_and_record

    class After(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(("after", state.global_step, trainer.reference.trigger.average))

    trainer.add_callback(After())
    trainer.train()
    updates = [s for s in seen if s[0] == "update"]
    assert updates, "the divergence never crossed the target"
    assert all(ema > target for _, _, ema in updates)
    # without an update at a step, the moving average stayed at or below the target
    update_steps = {step for _, step, _ in updates}
    assert all(ema is None or ema <= target for kind, step, ema in seen if kind == "after" and step not in
               update_steps)


@pytest.mark.parametrize("reference", ["initial", "periodic", "adaptive"])
def test_lora_runs_with_each_reference_schedule(tmp_path, model_path, reference):
    extra = {"periodic": {"rpg_reference_update_steps": 1}, "adaptive": {"rpg_reference_kl_target": 1e-6}}
    args = RPGConfig(**cpu_args(tmp_path, max_steps=3, beta=0.1, rpg_reference=reference, learning_rate=5e-2,
                                **extra.get(reference, {})))
    trainer = RPGTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                         peft_config=lora())
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora" not in n}
    trainer.train()
    assert trainer.ref_model is None
    assert ("ref" in trainer.model.peft_config) == (reference != "initial")
    # the base weights are untouched: "initial" is the adapter-disabled base model
    assert all(torch.equal(p, base[n]) for n, p in trainer.model.named_parameters() if n in base)
    assert trainer.state.log_history[-2]["rpg/divergence"] >= 0


@pytest.mark.parametrize("autocast", [True, False])
def test_lora_reference_adapter_has_the_trained_adapters_dtype(tmp_path, model_path, autocast):
    """A moving reference under LoRA is a frozen adapter copy in the trained adapter's dtype: with a bf16 base and
    ZeRO-3, TRL keeps the adapter in bf16 (`autocast_adapter_dtype=False`, TRL #6089: ZeRO-3 fails on a mixed
    bf16/float32 layout), and the copy must be bf16 too; otherwise both are PEFT's float32."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    model = get_peft_model(base, lora(), autocast_adapter_dtype=autocast)
    args = RPGConfig(**cpu_args(tmp_path, max_steps=1, rpg_reference="periodic", rpg_reference_update_steps=1,
                                beta=0.1))
    trainer = RPGTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    named = dict(trainer.model.named_parameters())
    refs = {n: p for n, p in named.items() if ".ref." in n}
    assert refs
    want = torch.float32 if autocast else torch.bfloat16
    for name, param in refs.items():
        trained = named[name.replace(".ref.", ".default.")]
        assert trained.dtype == want and param.dtype == want, name
        assert not param.requires_grad and torch.equal(param, trained)
