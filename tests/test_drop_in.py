"""RPGTrainer is a drop-in replacement for GRPOTrainer: swap the import and a GRPO script runs."""

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from trl import GRPOConfig, GRPOTrainer

from trl_rpg import RPGConfig, RPGTrainer

SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from _tiny import cpu_args, length_reward, tiny_dataset
    from trl import GRPOConfig, GRPOTrainer
    {import_line}

    args = GRPOConfig(**cpu_args({out!r}, beta=0.01, steps_per_generation=2))
    trainer = GRPOTrainer(model={model!r}, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    print("RESULT", json.dumps({{"trainer": type(trainer).__name__, "config": type(trainer.args).__name__,
                                "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}}))
""")


@pytest.mark.parametrize("swap", [False, True])
def test_grpo_script_runs_with_only_the_import_swapped(tmp_path, swap):
    import json
    import os

    model = save_tiny_model(str(tmp_path / "model"))
    tests = os.path.dirname(__file__)
    import_line = "from trl_rpg import RPGConfig as GRPOConfig, RPGTrainer as GRPOTrainer" if swap else ""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(tests=tests, import_line=import_line, out=str(tmp_path / "out"), model=model))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["trainer"] == ("RPGTrainer" if swap else "GRPOTrainer")
    assert result["config"] == ("RPGConfig" if swap else "GRPOConfig")
    assert len(result["losses"]) == 4 and all(math.isfinite(x) for x in result["losses"])


def test_grpo_config_is_upgraded_keeping_grpo_fields(tmp_path):
    model = save_tiny_model(str(tmp_path / "model"))
    args = GRPOConfig(**cpu_args(tmp_path / "out", beta=0.02, epsilon=0.1, scale_rewards="group",
                                 steps_per_generation=2, max_steps=1))
    trainer = RPGTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    assert isinstance(trainer.args, RPGConfig)
    # GRPO fields keep the script's values...
    assert (trainer.args.beta, trainer.args.epsilon, trainer.args.scale_rewards) == (0.02, 0.1, "group")
    assert trainer.args.epsilon_high == 0.1  # GRPO's epsilon_high=None: symmetric, as GRPOTrainer would train
    assert trainer.args.steps_per_generation == 2
    # ...and RPG fields get RPG defaults, except the reference: GRPO's beta > 0 is a KL to the initial model
    assert (trainer.args.rpg_divergence, trainer.args.rpg_estimator, trainer.args.rpg_reference) == (
        "urkl", "reinforce", "initial")
    trainer.train()


def test_rpg_defaults_follow_the_paper(tmp_path):
    args = RPGConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", gradient_accumulation_steps=2)
    assert args.beta == 1e-4
    assert (args.epsilon, args.epsilon_high, args.rpg_dual_clip_c) == (0.2, 0.28, 10.0)
    assert args.scale_rewards == "none" and args.loss_type == "dapo"
    assert args.rpg_reference == "sampling"
    # each generation batch is reused for several optimizer steps
    assert args.steps_per_generation == 4 * args.gradient_accumulation_steps


def test_batch_reuse_is_4_unless_the_layout_is_set_or_num_iterations_is_above_1(tmp_path):
    """The rule the README and the field's help state: `num_iterations=1` (GRPO's default, even set explicitly)
    keeps the reuse of 4; `num_iterations > 1`, `steps_per_generation` or `generation_batch_size` replaces it."""

    def steps_per_generation(**settings):
        return RPGConfig(**cpu_args(tmp_path, gradient_accumulation_steps=2, **settings)).steps_per_generation

    assert steps_per_generation() == steps_per_generation(num_iterations=1) == 4 * 2
    assert steps_per_generation(num_iterations=3) == 2  # TRL's default layout, each batch iterated 3 times
    assert steps_per_generation(steps_per_generation=2) == 2
    assert steps_per_generation(generation_batch_size=32) == 32 // 8  # per_device_train_batch_size 8
    help_text = RPGConfig.__dataclass_fields__["rpg_generation_reuse"].metadata["help"]
    assert "num_iterations is 1" in help_text
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert "is set or `num_iterations > 1` (`num_iterations=1`, GRPO's default, keeps the reuse of 4)" in readme


def test_grpo_trainer_subclass_relationship():
    assert issubclass(RPGTrainer, GRPOTrainer) and issubclass(RPGConfig, GRPOConfig)
