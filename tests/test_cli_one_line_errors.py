"""`trl-rpg train` ends a mistake with one `error:` line naming the module, flag or key, never a traceback (issue 35
section 3): a reward module that does not parse, raises or exits while imported, or parses the command line when
imported (it must not read trl-rpg's arguments and answer as if it were trl-rpg); `--per_device_train_batch_size 0`;
a recipe value of the wrong type (`reward_funcs: 5`). Nothing is launched (the launcher's checks run in this process,
as the console script runs them); each module has a name of its own (Python caches imports)."""

import sys
import textwrap

import pytest

from trl_rpg import cli
from trl_rpg.cli import launcher

_BASE = ["train", "--model_name_or_path", "m", "--output_dir", "o", "--use_cpu", "True", "--bf16", "False"]


@pytest.fixture
def launched(monkeypatch):
    from accelerate.commands import launch

    seen = []
    monkeypatch.setattr(launch, "launch_command", seen.append)
    monkeypatch.setattr(launcher, "run_train", lambda argv, prog: seen.append(argv) or 0)
    return seen


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write reward modules into a working directory of their own; forget them afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    written = []

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return f"{name}.reward"

    yield write
    for name in written:
        sys.modules.pop(name, None)


def _last_line(capsys) -> tuple[str, str]:
    err = capsys.readouterr().err
    return err.strip().splitlines()[-1], err


def test_a_reward_module_that_does_not_import_is_one_line_naming_it(launched, modules, capsys):
    cases = {
        modules("guard_syntax", "def reward(completions, **kwargs)\n    return [0.0] * len(completions)\n"):
            "module 'guard_syntax' does not parse: expected ':' (",
        modules("guard_raises", "raise RuntimeError('reward server config missing')\n"):
            "module 'guard_raises' raised RuntimeError while it was imported: reward server config missing (",
        modules("guard_exits", "import sys\nsys.exit(0)\n"):
            "module 'guard_exits' exited while it was imported (SystemExit(0))",
    }
    for reward, said in cases.items():
        assert cli.main(_BASE + ["--reward_funcs", reward]) == 2, reward
        last, err = _last_line(capsys)
        assert last.startswith(f"trl-rpg train: error: --reward_funcs '{reward}': ") and said in last, last
        assert "Traceback" not in err
    assert not launched


def test_a_reward_module_that_parses_the_command_line_does_not_read_trl_rpgs(launched, modules, capsys):
    """A module that calls `argparse` when imported saw `train --model_name_or_path ...` and printed `trl-rpg: error:
    unrecognized arguments`, which reads as the CLI's own. It sees only its own name: with optional arguments it
    imports; with a required one it stops, and the last line names the module."""
    parse = """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--threshold", type=float, {})
        args = parser.parse_args()
        def reward(completions, **kwargs):
            return [float(args.threshold)] * len(completions)
        """
    argv = list(sys.argv)
    assert cli.main(_BASE + ["--reward_funcs", modules("guard_optional", parse.format("default=0.5"))]) == 0
    assert len(launched) == 1 and sys.argv == argv and sys.modules["guard_optional"].args.threshold == 0.5
    assert cli.main(_BASE + ["--reward_funcs", modules("guard_required", parse.format("required=True"))]) == 2
    last, err = _last_line(capsys)
    assert "trl-rpg: error" not in err and "guard_required: error: the following arguments are required" in err
    assert last.startswith("trl-rpg train: error: --reward_funcs 'guard_required.reward': module 'guard_required' "
                           "exited while it was imported (SystemExit(2))"), last
    assert len(launched) == 1


def test_a_batch_size_of_zero_is_one_line_naming_the_flag(launched, capsys):
    assert cli.main(_BASE + ["--per_device_train_batch_size", "0"]) == 2
    last, err = _last_line(capsys)
    assert last == ("trl-rpg train: error: RPGConfig: `per_device_train_batch_size`=0 is not allowed; it must be an "
                    "integer >= 1."), last
    assert "ZeroDivisionError" not in err and not launched


@pytest.mark.parametrize(("line", "said"), [
    ("reward_funcs: 5", "the value of key reward_funcs, 5, is not one reward_funcs takes: a list of strings or null"),
    ("reward_funcs: math_reward", "the value of key reward_funcs, 'math_reward', is not one reward_funcs takes"),
    ("learning_rate: [0.1]", "the value of key learning_rate, [0.1], is not one learning_rate takes: a number"),
    ("save_strategy: no", "YAML reads an unquoted no / yes / off / on as false / true: quote it"),
], ids=["a_number_for_a_list", "a_name_for_a_list", "a_list_for_a_number", "yaml_no"])
def test_a_recipe_value_of_the_wrong_type_is_one_line_naming_the_file_and_key(launched, tmp_path, capsys, line, said):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model_name_or_path: m\noutput_dir: o\nuse_cpu: true\nbf16: false\n{line}\n")
    for kwargs in ({}, {"launch": False, "prog": "python -m trl_rpg"}):  # the launcher, then a training process
        assert cli.main(["train", "--config", str(recipe)], **kwargs) == 2
        last, err = _last_line(capsys)
        assert f"error: {recipe}: " in last and said in last, last
        assert "Traceback" not in err
    assert not launched
    recipe.write_text("model_name_or_path: m\noutput_dir: o\nuse_cpu: true\nbf16: false\nreward_funcs: [math_reward]\n"
                      "learning_rate: 1.0e-5\nsave_strategy: 'no'\nmax_grad_norm: 1\n")
    assert cli.main(["train", "--config", str(recipe)]) == 0 and len(launched) == 1


@pytest.mark.parametrize(("text", "said"), [
    ("model_name_or_path: m\nreward_funcs: [math_reward\nmax_steps: 3\n",
     "line 3, column 10: not valid YAML (expected ',' or ']', but got ':', while parsing a flow sequence started at "
     "line 2, column 15)."),
    ("model_name_or_path: m\n\toutput_dir: o\n", "line 2, column 1: not valid YAML (found character '\\t' that "
                                                "cannot start any token, while scanning for the next token)."),
], ids=["unclosed_list", "tab"])
def test_a_recipe_that_is_not_yaml_is_one_line_naming_the_file_line_and_column(launched, tmp_path, capsys, text, said):
    """PyYAML's parser error was a 42-line traceback; now one line, the file and the place where the parser stopped."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    for kwargs in ({}, {"launch": False, "prog": "python -m trl_rpg"}):  # the launcher, then a training process
        assert cli.main(["train", "--config", str(recipe)], **kwargs) == 2
        last, err = _last_line(capsys)
        assert last.endswith(f"train: error: {recipe}, {said}"), last
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not launched
