#!/usr/bin/env python
# /// script
# dependencies = [
#     "trl-rpg[math,plot]",
# ]
# ///
"""RPG on DAPO-Math: the recipe of the RPG paper (Zhang et al., ICLR 2026, arXiv:2505.17508) in TRL terms.

* Data: DAPO-Math-17k (default `--dataset_name BytedTsinghua-SIA/DAPO-Math-17k`), or any local `.parquet` /
  `.json` / `.jsonl` / `.csv` file (or folder), loaded by the loader of `trl-rpg train`
  (`trl_rpg.cli.load_training_data`): a `prompt` chat list and a `reward_model.ground_truth` (verl/DAPO format, like
  the bundled AIME/AMC files), or a `problem` (or `question`, or plain-text `prompt`) column with a `ground_truth` or
  `answer` column; bare problems are wrapped in the paper's prompt ("... The last line of your response should be of
  the form Answer: $Answer ..."). The reference answer is read as the math rewards read it
  (`trl_rpg.rewards.reference_answer`), and a data set without one of its columns is refused before the model loads.
  Duplicated problems (the Hub copy repeats each one many times) are dropped unless `--dedupe False`.
* Reward: `trl_rpg.rewards.paper_math_reward`, the paper's values: +1 for a correct final answer, -1 otherwise (the
  RPG authors' scorer; `math_reward` gives 1 / 0). The final answer is the last one the completion commits to, an
  `Answer:` line or a `\\boxed{}`, compared by math-verify equivalence where it parses, else as normalised strings
  (how that differs from the authors' strict `Answer:` match: docs/rewards.md). Plus DAPO's soft overlong punishment
  (TRL's `get_soft_overlong_punishment`, 0 down to -1; `--soft_punish_cache 0` turns it off).
* Objective: `RPGTrainer` with RPG's defaults (RPG-REINFORCE, unnormalised reverse KL, beta 1e-4, RPG-Style Clip
  (0.2, 0.28) with dual-clip c = 10, the sampling policy as reference) and dynamic sampling that keeps the groups
  whose `paper_math_reward` varies (`dynamic_sampling_metric="paper_math_reward"`: DAPO and the paper filter on
  accuracy, not on the length penalty); the paper's optimiser settings are this script's defaults (AdamW lr 1e-6,
  weight decay 0.1, clip 1.0, constant lr after warm-up, 16 completions at temperature 1.0). Batch sizes and reuse
  come from the command line: see `examples/recipes/`.
* Evaluation: mean@k on AIME 2024, AIME 2025 and AMC 2023 (bundled; `--eval_num_samples 32` is the paper's
  mean@32) after training, optionally before (`--eval_before`). Results go to `<output_dir>/eval_results.json`.
  `--eval_backend vllm` generates them with vLLM (one call sampling the k completions of every problem: the paper's
  3,200 completions of up to 8k tokens per benchmark); the default batched `model.generate` suits quick checks.
* LoRA: `--use_peft --lora_r 64 --lora_alpha 128` (TRL's `ModelConfig`).
* Curves: `<output_dir>/rpg_curves.png` (reward, divergence, the range of `w`, clip fractions over steps), redrawn at
  every checkpoint and at the end (`trl_rpg.evaluation.plot_callback.RPGPlotCallback`; matplotlib: `pip install
  'trl-rpg[plot]'`).

    accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml examples/rpg_math.py \\
        --model_name_or_path Qwen/Qwen3-4B-Base --output_dir qwen3-4b-rpg ...   # see examples/recipes/*.sh

A quick local run, on CPU (`--use_cpu True --bf16 False`: like TRL's `GRPOConfig`, `RPGConfig` defaults to
`bf16=True`, which needs a GPU; on a GPU leave both flags out). It checks the plumbing, not the recipe: 32-token
completions and no dynamic sampling (a model that never solves a problem would make dynamic sampling generate its
8 rounds for every batch and keep nothing), trained on the length penalty's spread; it prints where
`eval_results.json` went. Measured with the tests' tiny model on 2 cores: 7 s at load 1, 15 s at load 3 (2026-12-02);
it grows with the model:

    python examples/rpg_math.py --model_name_or_path ./my-model --dataset_name ./train.parquet --output_dir out \\
        --max_steps 2 --num_generations 4 --max_completion_length 32 --dynamic_sampling False \\
        --eval_num_samples 1 --eval_max_problems 2 --use_cpu True --bf16 False
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.cli import load_training_data, show_upstream_warnings_once
from trl_rpg.evaluation.evaluate import BENCHMARKS, evaluate_benchmarks, problem_text
from trl_rpg.evaluation.plot_callback import RPGPlotCallback
from trl_rpg.rewards import check_reward_columns, make_overlong_punishment, paper_math_reward, reference_answer

logger = logging.getLogger("rpg_math")

#: The DAPO-Math prompt used by the paper (and by the bundled AIME/AMC evaluation files).
PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)

#: The paper's optimisation settings (Appendix H), used as this script's defaults; any flag overrides them.
PAPER_DEFAULTS = {
    "learning_rate": 1e-6,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,
    "lr_scheduler_type": "constant_with_warmup",
    "num_generations": 16,
    "temperature": 1.0,
    "max_completion_length": 4096,
    "dynamic_sampling": True,
    "dynamic_sampling_metric": "paper_math_reward",  # the groups whose accuracy varies (DAPO), not the length penalty
    "logging_steps": 1,
    "save_strategy": "steps",
    "save_steps": 160,
    "report_to": "none",
}


@dataclass
class MathScriptArguments(ScriptArguments):
    """Data, reward and evaluation settings of `rpg_math.py` (plus TRL's `ScriptArguments`)."""

    dataset_name: str | None = field(
        default="BytedTsinghua-SIA/DAPO-Math-17k",
        metadata={"help": "Hub data set or local .parquet/.json/.jsonl/.csv file or folder, in DAPO-Math format "
                          "(`prompt` chat list + `reward_model.ground_truth`) or with `problem`/`question` + "
                          "`ground_truth`/`answer` columns."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training problems (after de-duplication)."})
    dedupe: bool = field(
        default=True, metadata={"help": "Drop repeated problems (DAPO-Math-17k on the Hub repeats each one)."})
    soft_punish_cache: int = field(
        default=1024,
        metadata={"help": "DAPO soft overlong punishment: completions longer than max_completion_length - "
                          "soft_punish_cache tokens are penalised linearly down to -1. 0 disables it."},
    )
    eval_benchmarks: list[str] = field(
        default_factory=lambda: list(BENCHMARKS),
        metadata={"help": f"Benchmarks evaluated as mean@k: any of {list(BENCHMARKS)}; 'none' skips evaluation."},
    )
    eval_before: bool = field(default=False, metadata={"help": "Also evaluate the initial model."})
    eval_num_samples: int | None = field(
        default=32, metadata={"help": "Samples per problem (k of mean@k; the bundled files hold 32 per problem)."})
    eval_max_problems: int | None = field(
        default=None, metadata={"help": "Evaluate only the first N problems of each benchmark (quick checks)."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Generation budget of the evaluation (default: max_completion_length)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the evaluation."})
    eval_top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold of the evaluation."})
    eval_batch_size: int = field(default=32, metadata={"help": "Rows per `generate` call in the evaluation."})
    eval_backend: str = field(
        default="transformers", metadata={
            "help": "Evaluation generation: 'transformers' (batched `model.generate`) or 'vllm' (one vLLM call "
                    "sampling the k completions of every problem, for the paper's scale; needs vLLM; the saved model "
                    "is loaded by its path).", "choices": ["transformers", "vllm"]})


def make_parser(prog: str | None = None) -> TrlParser:
    parser = TrlParser((MathScriptArguments, RPGConfig, ModelConfig), prog=prog, allow_abbrev=False)
    parser.set_defaults(**PAPER_DEFAULTS)
    return parser


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def prepare_math_dataset(dataset, dedupe: bool = True, max_samples: int | None = None):
    """Bring a math data set into the format `RPGTrainer` + `paper_math_reward` read: a conversational `prompt` in the
    paper's format and a `ground_truth` column holding each row's `trl_rpg.rewards.reference_answer`."""
    columns = set(dataset.column_names)
    problem_column = next((c for c in ("problem", "question") if c in columns), None)
    if "prompt" not in columns and problem_column is None:
        raise ValueError(f"The data set needs a `prompt` (chat list) or a `problem`/`question` column; it has "
                         f"{sorted(columns)}.")
    check_reward_columns([paper_math_reward], dataset.column_names)  # the reference answers, where it reads them

    def convert(row):
        prompt = row.get("prompt")
        if not isinstance(prompt, list):
            text = str(prompt) if prompt is not None else str(row[problem_column])
            if "Answer:" not in text:  # a bare problem: wrap it in the paper's prompt
                text = PROMPT_TEMPLATE.format(problem=text)
            prompt = [{"role": "user", "content": text}]
        else:
            prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
        gold = reference_answer(row)
        return {"prompt": prompt, "ground_truth": "" if gold is None else gold}

    if dedupe:
        seen: set[str] = set()

        def first_time(row):
            key = problem_text(row)
            if key in seen:
                return False
            seen.add(key)
            return True

        dataset = dataset.filter(first_time)
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    keep = [c for c in dataset.column_names if c not in ("prompt", "ground_truth")]
    dataset = dataset.map(convert, remove_columns=keep)
    missing = sum(1 for g in dataset["ground_truth"] if not g)
    if missing:
        logger.warning("%d training problems have no reference answer; paper_math_reward skips them.", missing)
    return dataset


# ----------------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------------


def evaluate(model, tokenizer, script_args, training_args, tag: str) -> dict:
    """mean@k on the chosen bundled benchmarks with `trl_rpg.evaluation.evaluate.evaluate_benchmarks`."""
    names = [n for n in script_args.eval_benchmarks if n.lower() != "none"]
    if not names:
        return {}
    results = evaluate_benchmarks(
        model, tokenizer, names,
        max_new_tokens=script_args.eval_max_new_tokens or training_args.max_completion_length,
        temperature=script_args.eval_temperature, top_p=script_args.eval_top_p,
        batch_size=script_args.eval_batch_size, num_samples=script_args.eval_num_samples,
        max_problems=script_args.eval_max_problems, seed=training_args.seed, return_completions=False,
        backend=script_args.eval_backend,
        chat_template_kwargs=training_args.chat_template_kwargs if isinstance(training_args.chat_template_kwargs,
                                                                              dict) else None,
    )
    summary = {name: {k: r[k] for k in ("mean_at_k", "k", "num_problems", "pass_at_k", "mean_completion_length",
                                        "truncated_fraction")} for name, r in results.items()}
    for name, r in summary.items():
        print(f"[{tag}] {name}: mean@{r['k']} = {r['mean_at_k']:.4f} over {r['num_problems']} problems "
              f"(pass@{r['k']} {r['pass_at_k']:.3f}, mean length {r['mean_completion_length']:.0f} tokens)")
    return summary


def _load_for_eval(path: str, model_args, use_peft: bool, backend: str = "transformers"):
    """A fresh copy of a saved (or Hub) model for evaluation on the main process; for the vLLM backend its path (a
    LoRA adapter merged into its base first, saved in `<path>/merged`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = model_args.dtype if model_args.dtype not in (None, "auto") else "auto"
    adapter = use_peft and os.path.exists(os.path.join(path, "adapter_config.json"))
    if backend == "vllm" and not adapter:
        return path, AutoTokenizer.from_pretrained(path)
    if adapter:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype)
        if backend == "vllm":  # vLLM loads whole models
            merged = os.path.join(path, "merged")
            model.merge_and_unload().save_pretrained(merged)
            AutoTokenizer.from_pretrained(path).save_pretrained(merged)
            return merged, AutoTokenizer.from_pretrained(path)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device), AutoTokenizer.from_pretrained(path)


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(script_args: MathScriptArguments, training_args: RPGConfig, model_args: ModelConfig) -> dict:
    from accelerate import PartialState

    state = PartialState()
    model_init_kwargs = {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code,
                         "attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype}
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    rewards = [paper_math_reward]
    if script_args.soft_punish_cache > 0:
        rewards.append(make_overlong_punishment(training_args.max_completion_length,
                                                min(script_args.soft_punish_cache,
                                                    training_args.max_completion_length)))
    with state.main_process_first():
        data = load_training_data(script_args)
        if script_args.dataset_train_split not in data:
            raise ValueError(f"The data set has no split {script_args.dataset_train_split!r} (it has {list(data)}); "
                             "set --dataset_train_split.")
        raw = data[script_args.dataset_train_split]
        check_reward_columns(rewards, raw.column_names)  # before any model loads
        train_dataset = prepare_math_dataset(raw, dedupe=script_args.dedupe,
                                             max_samples=script_args.max_train_samples)
    peft_config = get_peft_config(model_args)
    results: dict = {"settings": {"model": model_args.model_name_or_path, "dataset": script_args.dataset_name,
                                  "rpg_divergence": training_args.rpg_divergence,
                                  "rpg_estimator": training_args.rpg_estimator,
                                  "rpg_reference": training_args.rpg_reference, "beta": training_args.beta,
                                  "train_problems": len(train_dataset)}}

    if script_args.eval_before and state.is_main_process:
        model, tokenizer = _load_for_eval(model_args.model_name_or_path, model_args, use_peft=False,
                                          backend=script_args.eval_backend)
        results["before"] = evaluate(model, tokenizer, script_args, training_args, "before")
        del model
    state.wait_for_everyone()

    trainer = RPGTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=train_dataset,
        peft_config=peft_config,
        quantization_config=get_quantization_config(model_args),
        callbacks=[RPGPlotCallback()],  # <output_dir>/rpg_curves.png at every checkpoint and at the end
    )
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model(training_args.output_dir)
        trainer.create_model_card(model_name=Path(training_args.output_dir).name,
                                  dataset_name=script_args.dataset_name)
        state.wait_for_everyone()

        if state.is_main_process and any(n.lower() != "none" for n in script_args.eval_benchmarks):
            if (script_args.eval_backend == "transformers" and state.num_processes == 1
                    and not trainer.is_deepspeed_enabled and not trainer.is_fsdp_enabled):
                model = trainer.accelerator.unwrap_model(trainer.model)
                tokenizer = trainer.processing_class
            else:  # sharded training or vLLM: evaluate the saved, gathered model on this process alone
                model, tokenizer = _load_for_eval(training_args.output_dir, model_args, peft_config is not None,
                                                  script_args.eval_backend)
            results["after"] = evaluate(model, tokenizer, script_args, training_args, "after")
        if state.is_main_process:
            path = os.path.join(training_args.output_dir, "eval_results.json")
            with open(path, "w") as f:
                json.dump(results, f, indent=2)
            print(f"Evaluation results written to {path}")
        state.wait_for_everyone()
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=script_args.dataset_name)
    finally:
        trainer.end()  # as TRL's grpo.py, however the run ends: finish the trackers, destroy the process group
    return results


if __name__ == "__main__":
    show_upstream_warnings_once()
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    main(script_args, training_args, model_args)
