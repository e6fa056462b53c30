"""The run's safety, shared by both trainers through small functions (`checkpointing` is their interface):
checkpoints and their manifests (`checkpoint/`), the output-dir lock, Hub uploads, the parameter and gradient
guards, reward calls, exits and timeouts, the reward-scale check and the learning-signal verdict, and the generation
batch layout the checkpointed buffers use (`batch`).

May import: `trl_rpg._compat`, torch, transformers / accelerate / huggingface_hub; never a trainer, so that both
trainers can use it.
"""
