"""Training script launched by tests/test_distributed.py, alone (`python`) or under `accelerate launch`.

Usage: `python train_script.py SPEC.json` (or `accelerate launch ... train_script.py SPEC.json`). SPEC holds:

    model_dir      local model directory (tests/_tiny.py `save_tiny_model`)
    output_dir     trainer output directory
    result         path of the JSON result file; each rank writes `<result>.rank<R>.json`
    gather_numel   optional: trl_rpg.trainers.reference.ZERO3_GATHER_NUMEL (elements gathered at once under ZeRO-3)
    runs           list of runs trained one after the other in this process; each run is a dict with
        name                 key of the run in the result file
        peft                 train a LoRA adapter instead of the full model
        fixed_completions    completions are a fixed function of the prompt (no sampling): the loss is then
                             independent of the process layout and of the random number generators
        config               RPGConfig keyword arguments (on top of tests/_tiny.py `cpu_args`)
        resume_from_checkpoint   forwarded to `trainer.train`
        expect_error         optional: `trainer.train` is expected to raise; the run's result is then the error
        save_model           directory for `trainer.save_model` after training
        probe                record the policy's (and the reference's) log-probs of a fixed probe sequence before
                             training and after every optimizer step
        poison_step          optional: during this optimizer step (1-based) the `lm_head` gradient is multiplied
                             by inf on every rank, so the step's gradient norm is not finite

Each rank's result file holds, per run: the per-step losses of `trainer.state.log_history`, the probe log-probs,
and under ZeRO-3 the partitioning of the policy's (and the reference model's) parameters on that rank.
"""

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for _tiny.py

from _processes import end_processes  # noqa: E402
from _tiny import cpu_args, length_reward, tiny_dataset  # noqa: E402
from accelerate import PartialState  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402

from trl_rpg import RPGConfig, RPGTrainer  # noqa: E402

PROBE_PROMPT = "7+5="
PROBE_COMPLETION = "12ab 3x"


def fixed_completion(prompt_ids, index, vocab, eos_id, max_len):
    """A completion that depends only on the prompt tokens and the completion's index within its group."""
    seed = sum((k + 1) * t for k, t in enumerate(prompt_ids))
    length = 1 + (seed + 5 * index) % max_len  # 1..max_len, distinct within a group of 4: rewards differ
    body = [vocab[(7 * seed + 13 * index + 3 * k) % len(vocab)] for k in range(length)]
    return body + [eos_id] if length < max_len else body


class FixedCompletionRPGTrainer(RPGTrainer):
    """RPGTrainer whose "generation" returns `fixed_completion`s, so a run's data does not depend on the layout."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tokenizer = self.processing_class
        vocab = sorted(i for i in tokenizer.get_vocab().values() if i not in tokenizer.all_special_ids)
        seen: dict[tuple, int] = {}
        completions = []
        for ids in prompt_ids:
            key = tuple(ids)
            index = seen.get(key, 0)
            seen[key] = index + 1
            completions.append(fixed_completion(ids, index % num_generations, vocab, tokenizer.eos_token_id,
                                                self.max_completion_length))
        return completions, None


def zero3_partition(model) -> dict | None:
    """How a ZeRO-3 model's parameters are held on this rank (None without ZeRO-3 parameters).

    DeepSpeed keeps parameters below `stage3_param_persistence_threshold` elements whole on every rank
    ("persistent"); every other parameter exists on a rank only as its partition `ds_tensor` (and as a full tensor
    only while gathered).
    """
    params = [(n, p) for n, p in model.named_parameters() if hasattr(p, "ds_id")]
    if not params:
        return None
    persistent = [p for _, p in params if getattr(p, "ds_persist", False)]
    partitioned = [p for _, p in params if not getattr(p, "ds_persist", False)]
    return {
        "num_params": len(params),
        "num_persistent": len(persistent),
        "full_numel": int(sum(p.ds_numel for _, p in params)),  # the whole model
        "persistent_numel": int(sum(p.ds_numel for p in persistent)),
        "partitioned_full_numel": int(sum(p.ds_numel for p in partitioned)),
        "partitioned_local_numel": int(sum(p.ds_tensor.numel() for p in partitioned)),  # this rank's share, padded
        # parameters of the partitioned kind that are whole on this rank right now (should be none between steps)
        "materialised": [n for n, p in params if not getattr(p, "ds_persist", False) and p.numel() > 0],
    }


def probe_inputs(tokenizer, device):
    prompt = torch.tensor([tokenizer(PROBE_PROMPT, add_special_tokens=False)["input_ids"]], device=device)
    completion = torch.tensor([tokenizer(PROBE_COMPLETION, add_special_tokens=False)["input_ids"]], device=device)
    return prompt, completion


@torch.no_grad()
def policy_probe(trainer) -> list[float]:
    """Log-probs of the probe completion under the policy (a collective call under ZeRO-3: every rank runs it)."""
    prompt, completion = probe_inputs(trainer.processing_class, trainer.accelerator.device)
    input_ids = torch.cat([prompt, completion], dim=1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, torch.ones_like(input_ids), completion.size(1), batch_size=1)
    return logps[0].float().cpu().tolist()


@torch.no_grad()
def reference_probe(trainer) -> list[float] | None:
    """Log-probs of the probe completion under the reference, through the trainer's own reference path."""
    if trainer.beta == 0.0:
        return None  # rpg_reference="sampling": no reference model
    prompt, completion = probe_inputs(trainer.processing_class, trainer.accelerator.device)
    inputs = {"prompt_ids": prompt, "completion_ids": completion, "prompt_mask": torch.ones_like(prompt),
              "completion_mask": torch.ones_like(completion)}
    return trainer.reference.logps(inputs, completion.size(1))[0].float().cpu().tolist()


class Recorder(TrainerCallback):
    """After each optimizer step: how the ZeRO-3 parameters are held, then (with `probe`) the probe log-probs.

    Also records the probes before training. Added after RPGTrainer's reference-schedule callback, so a record at
    step k sees the reference update of step k.
    """

    def __init__(self, trainer, probe: bool):
        self.trainer = trainer
        self.probe = probe
        self.partitions = []
        self.probes = []

    def _probe(self, step):
        if self.probe:
            self.probes.append({"step": step, "policy": policy_probe(self.trainer),
                                "reference": reference_probe(self.trainer),
                                "reference_updates": self.trainer.reference.updates})

    def on_train_begin(self, args, state, control, **kwargs):
        self._probe(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        ref = self.trainer.ref_model
        self.partitions.append({"step": state.global_step, "policy": zero3_partition(self.trainer.model),
                                "reference": zero3_partition(ref) if ref is not None else None})
        self._probe(state.global_step)


class Poison(TrainerCallback):
    """Multiplies the `lm_head` weight's gradient by inf during optimizer step `step` (a tensor hook on the parameter,
    which runs before DeepSpeed's own gradient hooks)."""

    def __init__(self, model, step: int):
        self.step = step
        self.active = False
        model.lm_head.weight.register_hook(lambda grad: grad * float("inf") if self.active else grad)

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step + 1 == self.step


def run_one(spec, run, model_dir):
    overrides = dict(run.get("config", {}))
    overrides.setdefault("output_dir", os.path.join(spec["output_dir"], run["name"]))
    if "ddp_backend" not in overrides and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        overrides["ddp_backend"] = "gloo"
    args = RPGConfig(**cpu_args(**overrides))
    peft_config = None
    if run.get("peft"):
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                 task_type="CAUSAL_LM")
    trainer_cls = FixedCompletionRPGTrainer if run.get("fixed_completions") else RPGTrainer
    trainer = trainer_cls(
        model=model_dir, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(16),
        processing_class=AutoTokenizer.from_pretrained(model_dir), peft_config=peft_config,
    )
    recorder = Recorder(trainer, probe=bool(run.get("probe")))
    trainer.add_callback(recorder)
    if run.get("poison_step"):
        trainer.add_callback(Poison(trainer.model, run["poison_step"]))

    try:
        trainer.train(resume_from_checkpoint=run.get("resume_from_checkpoint"))
    except Exception as error:
        if not run.get("expect_error"):
            raise
        return {"error": f"{type(error).__name__}: {error}"}

    result = {
        "losses": {int(e["step"]): e["loss"] for e in trainer.state.log_history if "loss" in e},
        "is_deepspeed": bool(trainer.is_deepspeed_enabled),
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled
        else None,
        "num_processes": trainer.accelerator.num_processes,
        "partitions": recorder.partitions,
        "reference_updates": trainer.reference.updates,
        "probes": recorder.probes,
        "final_policy_probe": policy_probe(trainer),
        "peft": bool(run.get("peft")),
        "skipped_steps": trainer.skipped_steps,  # counted by RPG's own guard
    }
    if run.get("save_model"):
        trainer.save_model(run["save_model"])
        trainer.accelerator.wait_for_everyone()
    return result


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if spec.get("gather_numel"):
        import trl_rpg.trainers.reference

        trl_rpg.trainers.reference.ZERO3_GATHER_NUMEL = spec["gather_numel"]
    results = {}
    for run in spec["runs"]:
        results[run["name"]] = run_one(spec, run, spec["model_dir"])
    rank = PartialState().process_index
    with open(f"{spec['result']}.rank{rank}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
    end_processes()  # only after a run that succeeded: a failed one exits at once
