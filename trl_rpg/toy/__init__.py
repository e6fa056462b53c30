"""The bundled toy task: not part of the training API.

A character-level tokenizer and a tiny Qwen2 model built on the spot (nothing is downloaded), chained single-digit
arithmetic with a verifiable reward and a short supervised warm-up. The demo (`trl_rpg.cli.toy_demo`, `trl-rpg
demo`), the upgrade self-check's tiny model, the tests, the benchmarks and `scripts/gpu_check.py` use it; `trl-rpg
train --reward_funcs toy_reward` reaches `toy_reward` through the reward registry. The task itself is
`trl_rpg.toy.task` (every public name of the toy's modules).

May import: `trl_rpg._compat` (lazily), torch, transformers, tokenizers; never a trainer (the upgrade check, below
the trainers, builds its model here).

The CPU stand-ins for the vLLM side of TRL's asynchronous trainer (`trl_rpg.toy.async_rollouts`; they need
`requests`, in the `demo` extra): `StaleRolloutWorker` (rollout worker and weight transfer), `VarlenAttention` (the
FA3 varlen kernel), installed with `async_trainer_on_cpu(VarlenAttention)`, within which `AsyncRPGTrainer` /
`AsyncGRPOTrainer` train on CPU (`trl-rpg demo --async`, docs/asynchronous.md).
"""

from .task import build_model, build_tokenizer, build_toy_model, evaluate_accuracy, make_dataset, toy_reward

__all__ = ["StaleRolloutWorker", "VarlenAttention", "async_trainer_on_cpu", "build_model", "build_tokenizer",
           "build_toy_model", "evaluate_accuracy", "make_dataset", "toy_reward"]


def __getattr__(name):
    # The stand-ins need `requests`: imported when asked for.
    if name in ("StaleRolloutWorker", "VarlenAttention"):
        from . import async_rollouts

        return getattr(async_rollouts, name)
    if name == "async_trainer_on_cpu":
        from .._compat import async_trainer_on_cpu

        return async_trainer_on_cpu
    raise AttributeError(f"module 'trl_rpg.toy' has no attribute {name!r}")
