"""AsyncRPGTrainer on one CPU process, or on each of two (`torch.distributed.run`, gloo), for
tests/test_async_distributed.py. argv: a JSON spec {model_dir, output_dir, result, runs: [{name, per_device,
poison_rank?, poison_step?, max_steps?}]}. The stand-in worker (`trl_rpg.toy.async_rollouts`, on the main process)
samples at staleness 0 from the same seed in every layout; each run writes, per rank, `{result}.{name}.rank{r}.json`
(the error it ended in, if any) and, on rank 0, `{result}.{name}.pt` (the final parameters)."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for _tiny

from _processes import end_processes  # noqa: E402
from _tiny import length_reward  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg._compat import async_trainer_on_cpu  # noqa: E402
from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention  # noqa: E402

GENERATIONS, LENGTH, MICRO_BATCH = 4, 6, 8


class Poison(TrainerCallback):
    """After optimizer step `step`, a parameter of this process made NaN (as an optimizer gone wrong on one rank)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] = float("nan")


def prompts() -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}]
                                         for i in range(16)]})


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    rank = int(os.environ.get("RANK", "0"))
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    for run in spec["runs"]:
        worker = StaleRolloutWorker(spec["model_dir"], prompts(), length_reward, tokenizer,
                                    num_generations=GENERATIONS, max_completion_length=LENGTH, staleness=0, seed=0,
                                    groups_per_call=MICRO_BATCH // GENERATIONS)
        args = AsyncRPGConfig(output_dir=os.path.join(spec["output_dir"], run["name"]),
                              per_device_train_batch_size=run["per_device"], num_generations=GENERATIONS,
                              max_completion_length=LENGTH, max_steps=run.get("max_steps", 3),
                              gradient_accumulation_steps=2,
                              optim="sgd", learning_rate=0.5, max_grad_norm=0.0, max_staleness=4, token_budget=0,
                              use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
                              seed=0, disable_tqdm=True, beta=0.1)
        poisoned = run.get("poison_rank") == rank
        callbacks = [Poison(run["poison_step"])] if poisoned else []
        error = None
        with async_trainer_on_cpu(VarlenAttention):
            trainer = AsyncRPGTrainer(spec["model_dir"], reward_funcs=length_reward, args=args,
                                      train_dataset=prompts(), processing_class=tokenizer, rollout_worker=worker,
                                      weight_transfer=worker, callbacks=callbacks)
            try:
                trainer.train()
            except Exception as caught:  # noqa: BLE001 - reported to the test
                error = f"{type(caught).__name__}: {caught}"
        model = trainer.accelerator.unwrap_model(trainer.model)
        with open(f"{spec['result']}.{run['name']}.rank{rank}.json", "w") as f:
            json.dump({"error": error, "processes": trainer.accelerator.num_processes, "step":
                       trainer.state.global_step,
                       "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters())}, f)
        if rank == 0:
            torch.save({n: p.detach().cpu() for n, p in model.named_parameters()},
                       f"{spec['result']}.{run['name']}.pt")


if __name__ == "__main__":
    main()
    end_processes()  # only after a run that succeeded: a failed one exits at once
