"""`trl-rpg train`: mistakes that are known before anything is launched are refused there, each as one `error:` line
naming what to fix (status 2), instead of minutes later in the training process. The launcher's checks are called in
this process, as the console script calls them (`trl_rpg.cli.main`); nothing is launched (accelerate's
`launch_command` is replaced by a recorder that fails the test if a refused run reaches it)."""

import pandas as pd
import pytest

from trl_rpg import cli


def _prompts(n):
    return [[{"role": "user", "content": f"{i % 10}+{(3 * i) % 10}"}] for i in range(n)]


@pytest.fixture
def launched(monkeypatch):
    """Every `accelerate launch` the launcher starts (none must start for a refused run), and no in-process
    training either."""
    from accelerate.commands import launch

    from trl_rpg.cli import launcher

    seen = []
    monkeypatch.setattr(launch, "launch_command", seen.append)
    monkeypatch.setattr(launcher, "run_train", lambda argv, prog: seen.append(argv) or 0)
    return seen


def _main(*args, base=True):
    argv = ["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", "--bf16", "False"]
    return cli.main((argv if base else ["train"]) + list(args))


def _refused(capsys, launched, *args, base=True):
    assert _main(*args, base=base) == 2
    assert not launched, "a refused run was launched"
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("trl-rpg train: error: "), lines[-3:]
    assert not any("Traceback" in line for line in lines)
    return lines[-1]


# ----------------------------------------------------------------------------------------------------------------
# Precision: the accelerate config's mixed_precision against the training's bf16 / fp16
# ----------------------------------------------------------------------------------------------------------------


def test_deepspeed_config_in_bf16_with_the_cpu_flags_is_refused_naming_mixed_precision_no(capsys, launched):
    """The shipped DeepSpeed configs say `mixed_precision: bf16`; with `--bf16 False` DeepSpeed refuses the mismatch
    after the model has loaded (minutes later). Refused at launch, naming the flag that aligns them."""
    last = _refused(capsys, launched, "--accelerate_config", "deepspeed_zero3", "--num_processes", "2")
    assert "mixed_precision: bf16" in last and "deepspeed_zero3.yaml" in last
    assert "--bf16 False" in last and "--mixed_precision no" in last
    # an explicit launcher value that disagrees is refused alike; one that agrees is launched
    last = _refused(capsys, launched, "--num_processes", "2", "--mixed_precision", "bf16")
    assert "--mixed_precision bf16" in last and "--mixed_precision no" in last
    assert _main("--accelerate_config", "deepspeed_zero3", "--num_processes", "2", "--mixed_precision", "no") == 0
    assert launched[-1].mixed_precision == "no" and launched[-1].num_processes == 2


def test_data_parallel_config_in_bf16_with_bf16_false_is_refused_not_run_in_bf16(capsys, launched):
    """Without DeepSpeed nothing fails: transformers takes `ACCELERATE_MIXED_PRECISION=bf16` from the config when
    `--bf16 False`, so the run would silently train in bf16 autocast."""
    last = _refused(capsys, launched, "--accelerate_config", "multi_gpu", "--num_processes", "2")
    assert "mixed_precision: bf16" in last and "--mixed_precision no" in last
    last = _refused(capsys, launched, "--accelerate_config", "multi_gpu", "--num_processes", "2", "--bf16", "False",
                    "--fp16", "True")
    assert "--mixed_precision fp16" in last  # the value that matches the training's precision


# ----------------------------------------------------------------------------------------------------------------
# Abbreviated and unknown flags, on the command line and in a YAML recipe
# ----------------------------------------------------------------------------------------------------------------


def test_an_abbreviated_flag_is_refused_not_taken_for_the_full_name(capsys, launched):
    """argparse's prefix matching took `--max_step 2` as `--max_steps 2`; the README says a misspelled flag is
    refused."""
    last = _refused(capsys, launched, "--max_step", "2")
    assert "unknown argument --max_step (did you mean --max_steps?)" in last
    # `python -m trl_rpg train` (each training process) refuses it too
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", "--bf16",
                     "False", "--max_step", "2"], launch=False, prog="python -m trl_rpg") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("python -m trl_rpg train: error: unknown argument --max_step (did you mean --max_steps?)")


def test_every_parser_refuses_abbreviations():
    """TRL's parser (`TrlParser`, an `argparse.ArgumentParser` through `HfArgumentParser`) for `trl-rpg train` and
    `python -m trl_rpg train`, the demo's and the plot command's parsers and examples/rpg_math.py's."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "rpg_math_example", Path(__file__).resolve().parents[1] / "examples" / "rpg_math.py")
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # dataclasses need the module registered
    spec.loader.exec_module(example)
    from trl_rpg.cli.plot import make_plot_parser

    for parser in (cli.make_train_parser(), cli.make_train_parser("python -m trl_rpg train"), cli.make_demo_parser(),
                   make_plot_parser(), example.make_parser()):
        assert parser.allow_abbrev is False, parser.prog


def test_a_recipe_key_that_is_no_argument_is_refused_naming_the_file_and_the_key(capsys, launched, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: m\noutput_dir: o\nuse_cpu: true\nbf16: false\nmax_step: 2\n")
    last = _refused(capsys, launched, "--config", str(recipe), base=False)
    assert f"{recipe}: unknown key max_step (did you mean max_steps?)" in last, last
    # in the training process too
    assert cli.main(["train", "--config", str(recipe)], launch=False, prog="python -m trl_rpg") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{recipe}: unknown key max_step (did you mean max_steps?)" in last, last
    # launcher options are keys of a recipe too: accepted there, given to accelerate launch
    recipe.write_text("model_name_or_path: m\noutput_dir: o\nuse_cpu: true\nbf16: false\nnum_processes: 2\n")
    assert _main("--config", str(recipe), base=False) == 0
    assert launched[-1].num_processes == 2


# ----------------------------------------------------------------------------------------------------------------
# Data too small for one generation batch; a resume with nothing to resume
# ----------------------------------------------------------------------------------------------------------------


def test_a_data_set_too_small_for_one_generation_batch_is_refused_at_launch(capsys, launched, tmp_path):
    data = tmp_path / "small.parquet"
    pd.DataFrame({"prompt": _prompts(8), "answer": ["1"] * 8}).to_parquet(data)
    # 8 per device x 4 (rpg_generation_reuse) x 2 processes = 64 completions = 16 prompts x 4 generations
    last = _refused(capsys, launched, "--dataset_name", str(data), "--per_device_train_batch_size", "8",
                    "--num_generations", "4", "--num_processes", "2")
    assert "`train_dataset` has 8 prompts, but one generation batch needs 16 distinct prompts" in last
    assert "processes (2)" in last
    # the same data on one process: one generation batch needs 8 prompts, which it has
    assert _main("--dataset_name", str(data), "--per_device_train_batch_size", "8", "--num_generations", "4",
                 "--num_processes", "1") == 0
    # a global generation_batch_size does not grow with the processes
    assert _main("--dataset_name", str(data), "--per_device_train_batch_size", "8", "--num_generations", "4",
                 "--num_processes", "2", "--generation_batch_size", "32") == 0


def test_resume_true_with_no_checkpoint_is_refused_at_launch(capsys, launched, tmp_path):
    """`--resume_from_checkpoint True` where `--output_dir` holds no complete checkpoint: refused at launch, like a
    path that does not exist (the training process found it after the model loaded, with a traceback)."""
    out = tmp_path / "out"
    last = _refused(capsys, launched, "--output_dir", str(out), "--resume_from_checkpoint", "True")
    assert f"--resume_from_checkpoint True: --output_dir {str(out)!r} holds no complete checkpoint" in last, last
    (out / "checkpoint-3").mkdir(parents=True)  # an interrupted save: no manifest
    last = _refused(capsys, launched, "--output_dir", str(out), "--resume_from_checkpoint", "latest")
    assert "checkpoint-3" in last and "incomplete" in last, last
    # in the training process too, before the model is loaded (`m` is no model)
    assert cli.main(["train", "--model_name_or_path", "m", "--output_dir", str(out), "--use_cpu", "True", "--bf16",
                     "False", "--resume_from_checkpoint", "True", "--dataset_name", "org/data"], launch=False,
                    prog="python -m trl_rpg") == 2
    assert "holds no complete checkpoint" in capsys.readouterr().err.strip().splitlines()[-1]
