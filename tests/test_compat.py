"""Every TRL/transformers internal trl-rpg relies on (listed in trl_rpg/_compat.py) exists in the installed versions:
an upgrade that removes or renames one fails here, naming it, instead of somewhere inside a training run."""

import pytest
import trl
from _tiny import cpu_args, digit_reward, save_tiny_model, tiny_dataset
from trl import GRPOTrainer

from trl_rpg import RPGConfig, RPGTrainer, _compat
from trl_rpg.run.batch import KNOWN_FIELDS


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    model = save_tiny_model(str(tmp_path_factory.mktemp("model")))
    args = RPGConfig(**cpu_args(tmp_path_factory.mktemp("out"), max_steps=1, steps_per_generation=2))
    trainer = RPGTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()  # some attributes (current_gradient_accumulation_steps) exist once training has started
    return trainer


def test_trl_has_every_method_trl_rpg_overrides_or_calls():
    missing = _compat.missing_internals(GRPOTrainer)
    assert not missing, f"trl {trl.__version__} lacks what trl_rpg/_compat.py lists: {missing}"


def test_a_built_trainer_has_every_attribute_trl_rpg_reads(trainer):
    missing = _compat.missing_internals(GRPOTrainer, trainer)
    assert not missing, f"trl {trl.__version__} lacks what trl_rpg/_compat.py lists: {missing}"


def test_the_generation_batch_has_the_layout_dynamic_sampling_and_checkpoints_assume(trainer):
    trainer.model.train()
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert set(_compat.GENERATION_BATCH_FIELDS) <= set(batch), sorted(batch)
    unknown = set(batch) - set(KNOWN_FIELDS) - {"rpg_ref_version"}
    assert not unknown, f"fields trl_rpg.run.batch does not know how to regroup: {sorted(unknown)}"


def test_missing_internals_names_what_is_missing():
    class Older:
        _compute_loss = _save_checkpoint = None

    missing = _compat.missing_internals(Older)
    assert "Older._generate_and_score_completions" in missing and "Older._compute_loss" not in missing


def test_transformers_resumes_deepspeed_where_rpg_makes_its_loads_weights_only():
    """`RPGTrainer._prepare_for_training` wraps the call in which transformers has DeepSpeed load a resumed
    checkpoint; it reads `resume_from_checkpoint` by name."""
    import inspect

    from transformers import Trainer

    assert "resume_from_checkpoint" in inspect.signature(Trainer._prepare_for_training).parameters
    assert "deepspeed_load_checkpoint(" in inspect.getsource(Trainer._prepare_for_training)


def test_deepspeed_has_the_checkpoint_types_rpg_allows():
    pytest.importorskip("deepspeed")
    types = _compat.deepspeed_checkpoint_types()
    assert [f"{t.__module__}.{t.__qualname__}" for t in types] == list(_compat.DEEPSPEED_CHECKPOINT_TYPES)


def test_accelerate_and_trl_have_the_launcher_internals_trl_rpg_train_uses():
    """`trl-rpg train` (trl_rpg/cli/launcher.py) decides whether to train in its own process with accelerate's own
    completion of the launch arguments, gives that process the environment of accelerate's one-process launcher, and
    splits the arguments TRL's parser left with TRL's helper: each must exist, with the shape the launcher reads."""
    import copy

    from accelerate.commands.config.config_args import ComputeEnvironment, load_config_from_file  # noqa: F401
    from accelerate.commands.launch import _validate_launch_command, launch_command, launch_command_parser  # noqa: F401
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env
    from trl.cli.commands.training import _subtract_subsequence

    args = launch_command_parser().parse_args(["--num_processes", "1", "--cpu", "train.py"])
    completed, defaults, _ = _validate_launch_command(copy.deepcopy(args))
    assert completed.num_processes == 1 and hasattr(ComputeEnvironment, "LOCAL_MACHINE")
    assert defaults is None or hasattr(defaults, "compute_environment")
    command, env = prepare_simple_launcher_cmd_env(completed)
    assert isinstance(env, dict) and command[-1] == "train.py"
    assert _subtract_subsequence(["a", "b", "c"], ["b"]) == ["a", "c"]


def test_trl_makes_its_peft_reference_pass_inside_the_use_adapter_rpg_wraps():
    """`_compat.around_trl_reference_pass` wraps the module global `use_adapter` of TRL's GRPO trainer: TRL's only use
    of it in `_generate_and_score_completions` is the PEFT reference pass (issue 34 section 1)."""
    import inspect

    import trl.trainer.grpo_trainer as grpo

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert callable(grpo.use_adapter) and source.count("use_adapter(") == 1
    assert source.index("use_adapter(") > source.index("ref_per_token_logps")
