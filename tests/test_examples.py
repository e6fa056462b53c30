"""`examples/`: rpg_math.py runs on a tiny local model and local data; the shell recipes parse, reference existing
accelerate configs and pass only arguments that rpg_math.py accepts, with the paper's batch layout."""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _tiny import save_tiny_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RECIPES = sorted((EXAMPLES / "recipes").glob("*.sh"))


def _load_rpg_math():
    spec = importlib.util.spec_from_file_location("rpg_math_example", EXAMPLES / "rpg_math.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


def _env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


def _dapo_rows(n):
    return [{"data_source": "toy", "prompt": [{"role": "user", "content": f"what is {i}+{i + 1}"}],
             "ability": "MATH", "reward_model": {"ground_truth": str(2 * i + 1), "style": "rule"},
             "extra_info": {"index": i}} for i in range(n)]


def test_rpg_math_trains_and_evaluates_on_a_tiny_local_model(tmp_path):
    model = save_tiny_model(str(tmp_path / "model"))
    data = tmp_path / "train.parquet"
    pd.DataFrame(_dapo_rows(16) + _dapo_rows(4)).to_parquet(data)  # 4 duplicated problems, dropped by dedupe
    out = tmp_path / "out"
    cmd = [sys.executable, str(EXAMPLES / "rpg_math.py"), "--model_name_or_path", model, "--dataset_name", str(data),
           "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "8",
           "--num_generations", "4", "--max_completion_length", "8", "--soft_punish_cache", "4",
           "--learning_rate", "1e-2", "--use_cpu", "True", "--bf16", "False", "--save_strategy", "no",
           "--gradient_checkpointing", "False",
           "--eval_num_samples", "2", "--eval_max_problems", "1", "--eval_max_new_tokens", "4",
           "--eval_batch_size", "8", "--eval_benchmarks", "aime24", "amc23"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    results = json.loads((out / "eval_results.json").read_text())
    assert results["settings"]["train_problems"] == 16
    assert results["settings"]["rpg_divergence"] == "urkl"
    assert set(results["after"]) == {"aime24", "amc23"}
    for stats in results["after"].values():
        assert stats["k"] == 2 and stats["num_problems"] == 1 and 0.0 <= stats["mean_at_k"] <= 1.0
    assert "[after] aime24: mean@2" in proc.stdout
    assert (out / "model.safetensors").exists() and "2505.17508" in (out / "README.md").read_text()


def test_rpg_math_prepares_problem_answer_data_with_the_paper_prompt():
    from datasets import Dataset

    m = _load_rpg_math()
    plain = Dataset.from_dict({"problem": ["What is 1+1?", "What is 2+2?", "What is 1+1?"], "answer": ["2", "4", "2"],
                               "source": ["a", "b", "c"]})
    data = m.prepare_math_dataset(plain)
    assert set(data.column_names) == {"prompt", "ground_truth"}
    assert len(data) == 2 and data["ground_truth"] == ["2", "4"]
    content = data[0]["prompt"][0]["content"]
    assert content.startswith("Solve the following math problem step by step.") and "What is 1+1?" in content
    assert content.endswith('Remember to put your answer on its own line after "Answer:".')

    dapo = Dataset.from_list(_dapo_rows(3))
    data = m.prepare_math_dataset(dapo, max_samples=2)
    assert len(data) == 2 and data["ground_truth"] == ["1", "3"]
    assert data[0]["prompt"] == [{"role": "user", "content": "what is 0+1"}]

    with pytest.raises(ValueError, match="reference answers"):
        m.prepare_math_dataset(Dataset.from_dict({"problem": ["x"]}))
    with pytest.raises(ValueError, match="`prompt`"):
        m.prepare_math_dataset(Dataset.from_dict({"text": ["x"], "answer": ["1"]}))

    # the bundled evaluation files use the very same prompt
    from trl_rpg.evaluation import load_benchmark

    aime = load_benchmark("aime24")[0]
    problem = aime["extra_info"]["raw_problem"]
    assert aime["prompt"][0]["content"] == m.PROMPT_TEMPLATE.format(problem=problem)


def test_rpg_math_defaults_are_the_papers():
    m = _load_rpg_math()
    script_args, args, model_args = m.make_parser().parse_args_and_config(
        ["--model_name_or_path", "x", "--output_dir", "o", "--use_cpu", "True"])
    assert script_args.dataset_name == "BytedTsinghua-SIA/DAPO-Math-17k"
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm) == (1e-6, 0.1, 1.0)
    assert args.lr_scheduler_type == "constant_with_warmup"
    assert (args.num_generations, args.temperature, args.beta, args.epsilon, args.epsilon_high) == (
        16, 1.0, 1e-4, 0.2, 0.28)
    assert (args.rpg_dual_clip_c, args.dynamic_sampling, args.loss_type) == (10.0, True, "dapo")
    assert script_args.soft_punish_cache > 0 and script_args.eval_num_samples == 32
    assert set(script_args.eval_benchmarks) == {"aime24", "aime25", "amc23"}


def _recipe_command(recipe: Path, extra_env=None) -> list[str]:
    env = {**os.environ, "DRY_RUN": "1", **(extra_env or {})}
    proc = subprocess.run(["bash", str(recipe)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_recipe_parses_and_uses_existing_configs(recipe):
    assert os.access(recipe, os.X_OK), f"{recipe.name} is not executable"
    syntax = subprocess.run(["bash", "-n", str(recipe)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr

    argv = _recipe_command(recipe)
    assert argv[:2] == ["accelerate", "launch"]
    config = argv[argv.index("--config_file") + 1]
    assert (ROOT / config).is_file(), f"{recipe.name} references a missing accelerate config: {config}"
    script = argv.index("examples/rpg_math.py")
    assert (ROOT / argv[script]).is_file()

    # every flag after the script is one rpg_math.py accepts (parse on CPU: bf16 needs use_cpu here)
    m = _load_rpg_math()
    script_args, args, model_args = m.make_parser().parse_args_and_config(argv[script + 1:] + ["--use_cpu", "True"])
    num_processes = int(argv[argv.index("--num_processes") + 1]) if "--num_processes" in argv else 1
    # the paper's layout: 16 completions per prompt, 16 optimizer steps per rollout, constant lr after warm-up
    assert args.num_generations == 16 and args.temperature == 1.0 and args.dynamic_sampling
    assert args.steps_per_generation // args.gradient_accumulation_steps == 16
    assert args.lr_scheduler_type == "constant_with_warmup" and args.warmup_steps == 10 * 16
    assert args.max_steps == 400 * 16
    assert (args.beta, args.epsilon, args.epsilon_high, args.rpg_dual_clip_c) == (1e-4, 0.2, 0.28, 10.0)
    assert (args.weight_decay, args.max_grad_norm) == (0.1, 1.0)
    assert script_args.soft_punish_cache > 0
    prompts_per_rollout = args.generation_batch_size * num_processes // args.num_generations
    if "lora" in recipe.name:
        assert model_args.use_peft and num_processes == 1
    else:
        assert num_processes == 8 and config.endswith("deepspeed_zero3.yaml") and args.learning_rate == 1e-6
        assert prompts_per_rollout == 512  # 512 prompts x 16 completions per rollout, 32 prompts per mini-batch
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * num_processes
        assert per_step == 32 * 16


def test_recipe_settings_can_be_changed_from_the_environment():
    recipe = EXAMPLES / "recipes" / "rpg_math_8gpu.sh"
    argv = _recipe_command(recipe, {"MODEL": "Qwen/Qwen3-8B-Base", "MICRO_BATCH": "2", "DIVERGENCE": "ufkl"})
    value = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert value["--model_name_or_path"] == "Qwen/Qwen3-8B-Base" and value["--rpg_divergence"] == "ufkl"
    assert (value["--per_device_train_batch_size"], value["--gradient_accumulation_steps"]) == ("2", "32")
    bad = subprocess.run(["bash", str(recipe)], env={**os.environ, "DRY_RUN": "1", "MICRO_BATCH": "3"},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "not a multiple" in bad.stderr
