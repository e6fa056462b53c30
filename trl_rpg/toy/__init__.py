"""The bundled toy task and the `trl-rpg demo`: not part of the training API.

A character-level tokenizer and a tiny Qwen2 model built on the spot (nothing is downloaded), chained single-digit
arithmetic with a verifiable reward, a short supervised warm-up, and the demo that trains the result with
`RPGTrainer` on CPU. The demo, the tests, the benchmarks and `scripts/gpu_check.py` use it; `trl-rpg train
--reward_funcs toy_reward` reaches `toy_reward` through the reward registry. The task itself is `trl_rpg.toy.task`
(every public name of the toy's modules), the demo `trl_rpg.toy.demo`.
"""

from .task import build_model, build_tokenizer, build_toy_model, evaluate_accuracy, make_dataset, toy_reward

__all__ = ["build_model", "build_tokenizer", "build_toy_model", "evaluate_accuracy", "make_dataset", "run_demo",
           "toy_reward"]


def __getattr__(name):
    # The demo pulls in the trainer (TRL); import it lazily so that `trl_rpg.toy` stays light.
    if name == "run_demo":
        from .demo import run_demo

        return run_demo
    raise AttributeError(f"module 'trl_rpg.toy' has no attribute {name!r}")
