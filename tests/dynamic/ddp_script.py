"""Dynamic sampling under DDP.

Run with `accelerate launch --num_processes 2 --cpu tests/dynamic/ddp_script.py MODEL OUT`.

Each process writes OUT/rank{R}.json: its training batches (rows, advantages, reward calls, plan statistics), its
logged dynamic-sampling metrics, and a checksum of its final parameters. `tests/test_dynamic_sampling.py` checks them.

The layout makes groups span processes: 2 processes x (2 rows x 3 steps per generation) = 12 rows = 3 groups of 4,
so group 1 is rows 4..7: rows 4, 5 on rank 0 and rows 6, 7 on rank 1.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

import torch  # noqa: E402
from _helpers import RecordingTrainer, SubsetReward  # noqa: E402
from _processes import end_processes  # noqa: E402
from _tiny import cpu_args, tiny_dataset  # noqa: E402

from trl_rpg import RPGConfig  # noqa: E402


def main(model, out):
    reward = SubsetReward()
    args = RPGConfig(**cpu_args(
        out, per_device_train_batch_size=2, gradient_accumulation_steps=1, steps_per_generation=3, max_steps=6,
        num_generations=4, dynamic_sampling=True, dynamic_sampling_max_rounds=8, ddp_backend="gloo",
        logging_steps=1))
    trainer = RecordingTrainer(model, reward_funcs=reward, args=args, train_dataset=tiny_dataset(16), reward=reward)
    trainer.train()
    rank = trainer.accelerator.process_index
    params = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    # each batch's metrics from its first step's log line (the batch's later steps repeat them)
    logs = [{k: v for k, v in h.items() if k.startswith("dynamic_sampling/")} for h in trainer.state.log_history
            if "step" in h and (h["step"] - 1) % 3 == 0]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world_size": trainer.accelerator.num_processes, "batches": trainer.batches,
                   "logs": [entry for entry in logs if entry], "param_sum": float(params.double().sum()),
                   "param_abs_sum": float(params.double().abs().sum())}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_processes()  # only after a run that succeeded: a failed one exits at once
