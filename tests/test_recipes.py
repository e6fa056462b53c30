"""`examples/recipes/*.yaml`: the recipes `trl-rpg train --config` takes (as TRL ships its own), each parsed by the
training parser with every key a training argument or a launcher option, launched as far as `accelerate launch`
(the GPU recipes on this CPU machine: the launch itself is replaced), and the same settings as the shell recipe of
the same name that runs examples/rpg_math.py. The toy recipe trains for real in tests/test_readme_commands.py, as
the README's quick start from the command line (issue 36 section 3)."""

import os
import shlex
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from trl_rpg import cli
from trl_rpg.cli import launcher
from trl_rpg.cli.arguments import _parser_flags, check_recipe_keys, make_train_parser

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
GPU_RECIPES = ["rpg_math_8gpu", "rpg_math_1gpu_lora"]


def parse_recipe(path: str, *argv: str):
    """What each training process parses (`python -m trl_rpg train --config path argv`); its keys checked as there."""
    parser = make_train_parser("python -m trl_rpg train")
    *parsed, config_remaining, cli_remaining = parser.parse_args_and_config(
        ["--config", path, *argv], return_remaining_strings=True, separate_remaining_strings=True)
    check_recipe_keys(config_remaining, _parser_flags(parser), path)  # launcher keys pass, unknown ones raise
    assert not cli_remaining, cli_remaining
    return parsed, config_remaining


@pytest.fixture
def gpu_settings_on_cpu(monkeypatch):
    """bf16=True parses on this CPU machine (transformers refuses it without a GPU that has bf16)."""
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)


def test_the_recipes_ship_as_yaml():
    assert {p.stem for p in RECIPES.glob("*.yaml")} == {"toy_cpu", *GPU_RECIPES}
    assert {p.stem for p in RECIPES.glob("*.sh")} == set(GPU_RECIPES)  # each GPU recipe for rpg_math.py too


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_recipe_launches_with_its_accelerate_config(name, gpu_settings_on_cpu, monkeypatch):
    monkeypatch.chdir(ROOT)
    launched = []
    monkeypatch.setattr(launcher, "run_accelerate_launch", lambda args: launched.append(args) or 0)
    monkeypatch.setattr(launcher, "train_in_this_process", lambda args, prog: launched.append(args) or 0)
    recipe = f"examples/recipes/{name}.yaml"
    assert cli.main(["train", "--config", recipe]) == 0
    (args,) = launched
    assert args.training_script == "trl_rpg" and args.training_script_args == ["train", "--config", recipe]
    expected = {"rpg_math_8gpu": ("deepspeed_zero3.yaml", 8), "rpg_math_1gpu_lora": ("single_process.yaml", None)}
    config, processes = expected[name]
    assert os.path.basename(args.config_file) == config and args.num_processes == processes


def _shell_recipe_flags(name: str) -> list[str]:
    """The flags the shell recipe gives examples/rpg_math.py (its DRY_RUN command), without the evaluation's own."""
    proc = subprocess.run(["bash", str(RECIPES / f"{name}.sh")], env={**os.environ, "DRY_RUN": "1"},
                          capture_output=True, text=True, timeout=60, check=True)
    argv = shlex.split(proc.stdout)
    flags = argv[argv.index("examples/rpg_math.py") + 1:]
    kept, i = [], 0
    while i < len(flags):
        j = i + 1
        while j < len(flags) and not flags[j].startswith("--"):
            j += 1
        if not flags[i].startswith("--eval_"):  # rpg_math.py's evaluation: `trl-rpg train` evaluates nothing
            kept += flags[i:j]
        i = j
    return kept


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_recipe_has_the_settings_of_its_shell_recipe(name, gpu_settings_on_cpu, monkeypatch):
    """Parsed by the training parser, the YAML recipe and the shell recipe's flags give the same arguments (but the
    reward, named in the YAML and built into rpg_math.py, and the output folder); the batch layout is the paper's:
    16 completions per prompt, 16 optimizer steps per generation batch."""
    monkeypatch.chdir(ROOT)
    (yaml_script, yaml_args, yaml_model, _), launcher_keys = parse_recipe(f"examples/recipes/{name}.yaml")
    (sh_script, sh_args, sh_model, _), _ = parse_recipe(f"examples/recipes/{name}.yaml", *_shell_recipe_flags(name))
    assert asdict(yaml_model) == asdict(sh_model)
    differ = {k for k, v in asdict(yaml_args).items() if asdict(sh_args)[k] != v}
    assert differ <= {"output_dir", "logging_dir"}, {k: (asdict(yaml_args)[k], asdict(sh_args)[k]) for k in differ}
    assert yaml_script.reward_funcs == ["paper_math_reward", "soft_overlong_punishment"]  # rpg_math.py's rewards
    assert yaml_script.soft_punish_cache == sh_script.soft_punish_cache == 1024
    assert yaml_args.num_generations == 16
    assert yaml_args.steps_per_generation // yaml_args.gradient_accumulation_steps == 16
    processes = int(launcher_keys[launcher_keys.index("--num_processes") + 1]) if "--num_processes" in \
        launcher_keys else 1
    completions_per_step = yaml_args.per_device_train_batch_size * yaml_args.gradient_accumulation_steps * processes
    assert completions_per_step == (32 if name == "rpg_math_8gpu" else 4) * 16  # prompts per optimizer step x 16


def test_toy_recipe_parses_as_a_cpu_run():
    (script, args, model, _), launcher_keys = parse_recipe(str(RECIPES / "toy_cpu.yaml"))
    assert not launcher_keys and args.use_cpu and not args.bf16  # one process on CPU, float32
    assert script.reward_funcs == ["toy_reward"] and model.model_name_or_path == "./toy-model"
    assert args.logging_steps < args.max_steps  # its picture has something to show
