"""Train a tiny RPG run; optionally SIGKILL itself at a given step or in the middle of writing a checkpoint.

Usage: python _resume_script.py MODEL OUTPUT_DIR REFERENCE [--kill-at-step N] [--kill-in-save N] [--lora]
"""

import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

from _tiny import cpu_args, digit_reward, tiny_dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from trl_rpg import RPGConfig, RPGTrainer  # noqa: E402
from trl_rpg.run import checkpointing

SCHEDULE_ARGS = {
    "sampling": {},
    "initial": {"beta": 0.05},
    "periodic": {"beta": 0.05, "rpg_reference_update_steps": 2},
    "adaptive": {"beta": 0.05, "rpg_reference_kl_target": 1e-4},
}


def make_trainer(model, output_dir, reference, lora=False, **overrides):
    kwargs = cpu_args(output_dir, max_steps=6, save_strategy="steps", save_steps=3, steps_per_generation=4,
                      rpg_reference=reference, **SCHEDULE_ARGS[reference])
    kwargs.update(overrides)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        kwargs["learning_rate"] = 5e-2
    return RPGTrainer(model=model, reward_funcs=digit_reward, args=RPGConfig(**kwargs),
                      train_dataset=tiny_dataset(), peft_config=peft_config)


class KillAtStep(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def verified_checkpoint(trainer, request):
    """The checkpoint `trainer.train(resume_from_checkpoint=request)` resumes from, verified as `train` verifies it."""
    return checkpointing.verified_checkpoint(request, trainer.args, trainer.accelerator, trainer._rpg_run_identity())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output_dir")
    parser.add_argument("reference")
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--kill-in-save", type=int, help="die while writing the checkpoint of this step")
    parser.add_argument("--lora", action="store_true")
    a = parser.parse_args()
    trainer = make_trainer(a.model, a.output_dir, a.reference, lora=a.lora)
    if a.kill_at_step:
        trainer.add_callback(KillAtStep(a.kill_at_step))
    if a.kill_in_save:
        original = checkpointing.save_files

        def dying_save(output_dir, *rest):
            if trainer.state.global_step == a.kill_in_save:
                os.kill(os.getpid(), signal.SIGKILL)  # model and optimizer are written, RPG state is not
            original(output_dir, *rest)

        checkpointing.save_files = dying_save
    trainer.train()


if __name__ == "__main__":
    main()
