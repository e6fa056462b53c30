"""GRPOTrainer and RPGTrainer trained side by side on identical data (used by tests/test_grpo_equivalence.py and
tests/distributed/equivalence_script.py).

What makes the comparison exact:

- Completions are a fixed function of the prompt (`FixedCompletions`, mixed into both trainers): the data do not
  depend on the parameters, so a float difference in the parameters can never flip a sampled token.
- Both configs come from one dict (`config_pair`) and every `GRPOConfig` field of the two is checked equal
  (`assert_same_grpo_fields`): RPGConfig's different defaults (beta, epsilon_high, scale_rewards, loss_type,
  steps_per_generation from rpg_generation_reuse) cannot slip in.
- Both trainers seed the global RNG with `seed` in their constructor and consume it identically afterwards, so
  TRL's shuffle of each generation batch (`shuffle_sequence_dict`) is the same permutation in both runs.
- The optimizer is plain SGD without gradient clipping and with a constant learning rate: the update is the
  gradient times the learning rate, so a constant factor in the loss (a wrong accumulation or normalisation
  factor) changes the trained parameters. AdamW (scale invariant) and clipping by the total norm would hide it.
"""

from __future__ import annotations

import dataclasses

import torch
from _tiny import length_reward
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_rpg import RPGConfig, RPGTrainer

#: Fields that legitimately differ between the two configs of a pair (where each trainer writes).
PER_RUN_FIELDS = {"output_dir", "logging_dir", "run_name"}


def fixed_completion(prompt_ids, index: int, vocab: list[int], eos_id: int, max_len: int,
                     full_length: bool = False) -> list[int]:
    """A completion that depends only on the prompt tokens and on its index within the prompt's group.

    Lengths 1..max_len, distinct within a group of up to 4 (so `length_reward` gives distinct rewards and
    non-zero advantages), or all max_len with `full_length`; a completion of max_len tokens has no EOS, i.e. it is
    truncated.
    """
    seed = sum((k + 1) * int(t) for k, t in enumerate(prompt_ids))
    length = max_len if full_length else 1 + (seed + 5 * index) % max_len
    body = [vocab[(7 * seed + 13 * index + 3 * k) % len(vocab)] for k in range(length)]
    return body + [eos_id] if length < max_len else body


class FixedCompletions:
    """Mixin for a GRPOTrainer subclass: "generation" returns `fixed_completion`s (no sampling, no model call).

    `full_length = True` makes every completion `max_completion_length` tokens long, so every micro-batch holds
    the same number of completion tokens.
    """

    full_length = False

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tokenizer = self.processing_class
        vocab = sorted(i for i in tokenizer.get_vocab().values() if i not in tokenizer.all_special_ids)
        seen: dict[tuple, int] = {}
        completions = []
        for ids in prompt_ids:
            index = seen.get(tuple(ids), 0)
            seen[tuple(ids)] = index + 1
            completions.append(fixed_completion(ids, index % num_generations, vocab, tokenizer.eos_token_id,
                                                self.max_completion_length, self.full_length))
        return completions, None


def first_character_reward(completions, **kwargs):
    """A second reward, independent of length: the first character's code modulo 3, halved."""
    return [(ord(c[0]) % 3) / 2 if c else 0.0 for c in completions]


class AsyncDistinctCharacters:
    """A third reward, written as TRL allows: a class instance with `async def __call__`."""

    __name__ = "distinct_characters"

    async def __call__(self, completions, **kwargs):
        return [len(set(c)) / 8 for c in completions]


def three_rewards() -> list:
    """Three reward functions of three kinds (a function, another, an async class instance)."""
    return [length_reward, first_character_reward, AsyncDistinctCharacters()]


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")


class FixedGRPOTrainer(FixedCompletions, GRPOTrainer):
    pass


class FixedRPGTrainer(FixedCompletions, RPGTrainer):
    pass


def prompts(n: int, offset: int = 0) -> Dataset:
    """n distinct arithmetic prompts (distinct prompts give distinct fixed completions)."""
    return Dataset.from_dict({"prompt": [f"{i // 10}{i % 10}+{(7 * i) % 10}" for i in range(offset, offset + n)]})


def base_settings(**overrides) -> dict:
    """GRPO settings shared by both trainers of a pair: every field whose RPGConfig default differs is set.

    Layout: 4 completions per micro-batch, 2 micro-batches per optimizer step (gradient_accumulation_steps=2) and
    8 micro-batches per generation batch (steps_per_generation=8): each generation batch of 32 completions (8
    prompts x 4) is used for 4 optimizer steps, the last 3 of them off-policy.
    """
    settings = {
        # batch layout
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "steps_per_generation": 8,
        "num_generations": 4, "max_completion_length": 8, "max_steps": 8,
        # the loss: every field whose RPGConfig default differs from GRPOConfig's
        "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28, "scale_rewards": "group", "loss_type": "dapo",
        "use_bias_correction_kl": False,
        # plain SGD: the update is proportional to the gradient
        "optim": "sgd", "learning_rate": 0.3, "lr_scheduler_type": "constant", "warmup_steps": 0,
        "max_grad_norm": 0.0, "weight_decay": 0.0,
        # a fast, quiet CPU run
        "logging_steps": 1, "report_to": "none", "use_cpu": True, "bf16": False, "save_strategy": "no", "seed": 0,
        "dataloader_num_workers": 0,
    }
    return {**settings, **overrides}


def config_pair(tmp_path, settings: dict, **rpg_settings) -> tuple[GRPOConfig, RPGConfig]:
    """A GRPOConfig and an RPGConfig from the same settings; RPG gets the reduction's settings (differentiable
    estimator, no dual clip) unless `rpg_settings` says otherwise."""
    rpg = {"rpg_estimator": "differentiable", "rpg_dual_clip_c": None, "rpg_reference": "sampling", **rpg_settings}
    grpo_args = GRPOConfig(output_dir=str(tmp_path / "grpo"), **settings)
    rpg_args = RPGConfig(output_dir=str(tmp_path / "rpg"), **settings, **rpg)
    assert_same_grpo_fields(grpo_args, rpg_args)
    return grpo_args, rpg_args


def assert_same_grpo_fields(grpo_args: GRPOConfig, rpg_args: RPGConfig) -> None:
    differ = [f.name for f in dataclasses.fields(GRPOConfig)
              if f.name not in PER_RUN_FIELDS and getattr(grpo_args, f.name) != getattr(rpg_args, f.name)]
    assert not differ, {name: (getattr(grpo_args, name), getattr(rpg_args, name)) for name in differ}


def make_trainer(trainer_cls, model_dir: str, args, train_dataset, eval_dataset=None, reward=length_reward,
                 peft_config=None):
    from transformers import AutoTokenizer

    return trainer_cls(model=model_dir, reward_funcs=reward, args=args, train_dataset=train_dataset,
                       eval_dataset=eval_dataset, processing_class=AutoTokenizer.from_pretrained(model_dir),
                       peft_config=peft_config)


def parameters(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


def logged(trainer, key: str) -> dict[int, float]:
    """{step: value} of a key in `trainer.state.log_history`."""
    return {int(e["step"]): e[key] for e in trainer.state.log_history if key in e}
