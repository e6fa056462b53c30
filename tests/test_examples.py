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


def _quick_local_run_command() -> list[str]:
    """The "quick local run" command of `examples/rpg_math.py`'s docstring, as written."""
    doc = _load_rpg_math().__doc__
    lines = doc[doc.index("    python examples/rpg_math.py"):].splitlines()
    command = []
    for line in lines:
        command.append(line.strip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    return shlex.split(" ".join(command))


def test_quick_local_run_of_the_docstring_works_on_cpu_as_written(tmp_path):
    """The docstring's quick local run, word for word (on CPU; `./my-model` a tiny local model and `./train.parquet`
    plain `problem` + `answer` rows with repeats): it trains, evaluates, saves and says where the results are."""
    argv = _quick_local_run_command()
    assert argv[:2] == ["python", "examples/rpg_math.py"] and "--use_cpu" in argv and "--bf16" in argv
    (tmp_path / "examples").symlink_to(EXAMPLES)
    save_tiny_model(str(tmp_path / "my-model"))
    problems = [f"what is {i}+{i + 1}?" for i in range(16)]
    pd.DataFrame({"problem": problems + problems[:4],
                  "answer": [str(2 * i + 1) for i in range(16)] + ["1", "3", "5", "7"]}).to_parquet(
        tmp_path / "train.parquet")
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    out = tmp_path / "out"
    results = json.loads((out / "eval_results.json").read_text())
    assert results["settings"]["train_problems"] == 16  # the 4 repeated problems were dropped
    assert set(results["after"]) == {"aime24", "aime25", "amc23"}
    for stats in results["after"].values():
        assert stats["k"] == 1 and stats["num_problems"] == 2 and 0.0 <= stats["mean_at_k"] <= 1.0
    assert "[after] aime24: mean@1" in proc.stdout
    assert f"Evaluation results written to {os.path.join('out', 'eval_results.json')}" in proc.stdout
    assert (out / "model.safetensors").exists() and "2505.17508" in (out / "README.md").read_text()
    logs = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    first = next(h for h in logs if "rewards/paper_math_reward/mean" in h)
    # paper_math_reward scored the `answer` column with the paper's -1 for a wrong answer (a random model never gets
    # it right); the length penalty varies
    assert first["rewards/paper_math_reward/mean"] == -1.0
    assert first["rewards/soft_overlong_punishment_reward/std"] > 0
    assert not any(key.startswith("dynamic_sampling/") for h in logs for key in h)  # off in the quick run


def test_rpg_math_checks_the_reward_columns_before_loading_the_model(tmp_path):
    m = _load_rpg_math()
    pd.DataFrame({"problem": ["1+1"], "solution": ["2"]}).to_parquet(tmp_path / "bad.parquet")
    script_args, args, model_args = m.make_parser().parse_args_and_config(
        ["--model_name_or_path", str(tmp_path / "no-such-model"), "--dataset_name", str(tmp_path / "bad.parquet"),
         "--output_dir", str(tmp_path / "out"), "--use_cpu", "True", "--bf16", "False"])
    with pytest.raises(ValueError, match=r"'paper_math_reward' reads one of the columns \['ground_truth', "
                                         r"'reward_model', 'answer'\]; the data set has the columns "
                                         r"\['problem', 'solution'\]"):
        m.main(script_args, args, model_args)
    with pytest.raises(FileNotFoundError, match="no such file"):  # the loader of `trl-rpg train`
        m.main(*m.make_parser().parse_args_and_config(
            ["--model_name_or_path", "m", "--dataset_name", "nope.parquet", "--output_dir", str(tmp_path / "out"),
             "--use_cpu", "True"]))
    assert not (tmp_path / "out").exists()


def test_prompt_answer_data_is_scored_alike_by_the_cli_and_the_example():
    """One notion of the answer column: the CLI hands the raw `answer` column to math_reward, the example converts it
    to `ground_truth`; both score the same."""
    from datasets import Dataset

    from trl_rpg.rewards import math_reward

    m = _load_rpg_math()
    raw = Dataset.from_dict({"prompt": ["1+1?", "2+2?", "3+3?"], "answer": ["2", "4", "6"]})
    prepared = m.prepare_math_dataset(raw, dedupe=False)
    completions = ["Answer: 2", "so \\boxed{5}", "no idea"]
    by_cli = math_reward(completions, **{k: raw[k] for k in raw.column_names if k != "prompt"})
    by_example = math_reward(completions, **{k: prepared[k] for k in prepared.column_names if k != "prompt"})
    assert by_cli == by_example == [1.0, 0.0, 0.0]


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

    with pytest.raises(ValueError, match=r"'paper_math_reward' reads one of the columns"):
        m.prepare_math_dataset(Dataset.from_dict({"problem": ["x"]}))
    with pytest.raises(ValueError, match="`prompt`"):
        m.prepare_math_dataset(Dataset.from_dict({"text": ["x"], "answer": ["1"]}))

    # the bundled evaluation files use the very same prompt
    from trl_rpg.evaluation.evaluate import load_benchmark

    aime = load_benchmark("aime24")[0]
    problem = aime["extra_info"]["raw_problem"]
    assert aime["prompt"][0]["content"] == m.PROMPT_TEMPLATE.format(problem=problem)


def test_rpg_math_defaults_are_the_papers():
    m = _load_rpg_math()
    script_args, args, _ = m.make_parser().parse_args_and_config(
        ["--model_name_or_path", "x", "--output_dir", "o", "--use_cpu", "True"])
    assert script_args.dataset_name == "BytedTsinghua-SIA/DAPO-Math-17k"
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm) == (1e-6, 0.1, 1.0)
    assert args.lr_scheduler_type == "constant_with_warmup"
    assert (args.num_generations, args.temperature, args.beta, args.epsilon, args.epsilon_high) == (
        16, 1.0, 1e-4, 0.2, 0.28)
    assert (args.rpg_dual_clip_c, args.dynamic_sampling, args.loss_type) == (10.0, True, "dapo")
    assert args.dynamic_sampling_metric == "paper_math_reward"  # DAPO and the paper filter on accuracy
    assert script_args.soft_punish_cache > 0 and script_args.eval_num_samples == 32
    assert set(script_args.eval_benchmarks) == {"aime24", "aime25", "amc23"}


def _recipe_command(recipe: Path, extra_env=None) -> list[str]:
    env = {**os.environ, "DRY_RUN": "1", **(extra_env or {})}
    proc = subprocess.run(["bash", str(recipe)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_recipe_parses_and_uses_existing_configs(recipe):
    assert os.access(recipe, os.X_OK), f"{recipe.name} is not executable"
    syntax = subprocess.run(["bash", "-n", str(recipe)], capture_output=True, text=True, check=False)
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
    # dynamic sampling keeps the groups whose accuracy varies, said in the recipe itself (not only by the default)
    assert args.dynamic_sampling_metric == "paper_math_reward" and "--dynamic_sampling_metric" in argv
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
                         capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "not a multiple" in bad.stderr


def test_dependency_floors_are_the_tested_versions_and_the_readme_names_them():
    """pyproject's floors are versions this suite runs on (the installed ones reach them: a floor above what is
    installed was never tested here) and the README's supported versions are the same floors."""
    import re
    from importlib.metadata import version

    from packaging.version import Version

    text = (ROOT / "pyproject.toml").read_text()
    dependencies = text.split("[project.optional-dependencies]")[0]  # an extra may raise a floor for itself
    floors = dict(re.findall(r'"(torch|trl|transformers|accelerate|peft|datasets)>=([0-9.]+)', dependencies))
    assert set(floors) == {"torch", "trl", "transformers", "accelerate", "peft", "datasets"}, floors
    for name, floor in floors.items():
        installed = Version(version(name).split("+")[0])
        assert installed >= Version(floor), f"{name} {installed} is below the floor {floor}"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"torch {floors['torch']}–2.14" in readme and f"transformers >= {floors['transformers']}" in readme
    assert f"TRL {floors['trl']}" in readme
    assert f"accelerate {floors['accelerate']}–1.16" in readme and '"accelerate>=1.15,<1.17"' in text
    for name in ("peft", "datasets"):
        assert f"{name} >= {floors[name]}" in readme, name
    from trl_rpg import _compat  # noqa: F401  (its imports resolve on the tested transformers: tests/test_compat.py)


def test_rpg_math_carries_the_inline_script_metadata_a_one_file_runner_reads():
    """PEP 723's `# /// script` block, as TRL's example scripts carry it (issue 36 s.2): parsed with the
    specification's reference regex; it names this project with extras that exist (math-verify for the reward,
    matplotlib for the curves)."""
    import re
    import tomllib

    text = (EXAMPLES / "rpg_math.py").read_text()
    regex = r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$"
    (block,) = [m for m in re.finditer(regex, text) if m.group("type") == "script"]
    content = "".join(line[2:] if line.startswith("# ") else line[1:]
                      for line in block.group("content").splitlines(keepends=True))
    metadata = tomllib.loads(content)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (dependency,) = metadata["dependencies"]
    name, extras = re.fullmatch(r"([\w-]+)\[([\w,]+)\]", dependency).groups()
    assert name == project["name"] and {"math", "plot"} <= set(extras.split(","))
    assert set(extras.split(",")) <= set(project["optional-dependencies"])
