"""What trl-rpg installs on and reports (issue 36 s.1-2): the Python floor is true, the pin admits TRL 1.x while CI
tests the reviewed versions, and `trl-rpg env` prints what a bug report needs."""

import re
from importlib.metadata import metadata, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from test_readme_commands import first_bash_block

from trl_rpg import cli
from trl_rpg.upgrade import guard as upgrade_guard

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> str:
    return (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def _dependencies() -> list[Requirement]:
    block = re.search(r"^dependencies = \[(.*?)^\]", _pyproject(), re.S | re.M).group(1)
    return [Requirement(r) for r in re.findall(r'^\s*"([^"]+)"', block, re.M)]


def test_the_python_floor_is_the_floor_of_what_trl_rpg_installs_and_the_readme_says_it():
    """Every Python version `requires-python` admits is admitted by each dependency as installed (TRL 1.16 needs
    3.11: a floor of 3.10 would promise an install that cannot resolve)."""
    ours = SpecifierSet(re.search(r'^requires-python = "([^"]+)"', _pyproject(), re.M).group(1))
    assert version("trl").startswith("1.")  # TRL 1.16 requires 3.11 (pyproject.toml admits TRL 1.x from 1.16)
    for requirement in _dependencies():
        theirs = SpecifierSet(metadata(requirement.name).get("Requires-Python") or "")
        for minor in range(6, 16):
            if f"3.{minor}.0" in ours:
                assert f"3.{minor}.0" in theirs, f"Python 3.{minor}: {requirement.name} requires {theirs}"
    floor = min(f"3.{minor}" for minor in range(6, 16) if f"3.{minor}.0" in ours)
    assert floor == "3.11"
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"Python >= {floor}" in readme and "Python >= 3.10" not in readme


def test_users_get_any_trl_1x_while_ci_installs_the_reviewed_versions():
    """The pin admits the next TRL releases (the upgrade self-check decides on each), not TRL 2; the README's test
    command (what .ci/run runs) installs with the constraints file, which pins exactly the reviewed versions."""
    [trl] = [r for r in _dependencies() if r.name == "trl"]
    assert "1.16.0" in trl.specifier and "1.17.0" in trl.specifier and "1.99.0" in trl.specifier
    assert "1.15.0" not in trl.specifier and "2.0.0" not in trl.specifier
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(encoding="utf-8"), re.M))
    assert pins == upgrade_guard.REVIEWED_VERSIONS
    assert '-e ".[test]" -c constraints.txt &&' in first_bash_block()[1]


def test_the_oldest_set_ci_tests_is_the_floors_pyproject_admits():
    """constraints-oldest.txt (CI's smoke subset on the oldest admitted versions, .ci/run) pins each floor, and the
    transformers floor admits the transformers vllm 0.31 requires (< 5.18: the newest vllm TRL 1.16's `vllm` extra
    admits), so trl-rpg installs beside `trl[vllm]`."""
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)$", (ROOT / "constraints-oldest.txt").read_text(encoding="utf-8"),
                           re.M))
    floors = {r.name: Version(s.version) for r in _dependencies() for s in r.specifier if s.operator == ">="}
    assert {name: Version(pin) for name, pin in pins.items()} == {name: floors[name] for name in pins}
    assert set(pins) == {"trl", "transformers", "accelerate", "peft", "datasets"}
    [transformers] = [r for r in _dependencies() if r.name == "transformers"]
    assert "5.17.0" in transformers.specifier and "5.25.0" in transformers.specifier
    assert "constraints-oldest.txt" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_trl_rpg_env_prints_what_a_bug_report_needs(capsys, monkeypatch, tmp_path):
    import accelerate.commands.config as accelerate_config

    config = tmp_path / "default_config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\n"
                      "num_processes: 2\nnum_machines: 1\n", encoding="utf-8")
    monkeypatch.setattr(accelerate_config, "default_config_file", str(config))
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.lstrip().startswith("Copy-paste the following information when reporting an issue:")
    lines = dict(re.findall(r"^- ([^:]+): (.*)$", out, re.M))
    assert lines["trl-rpg version"] == version("trl-rpg")
    for label, name in (("PyTorch", "torch"), ("TRL", "trl"), ("Transformers", "transformers"),
                        ("Accelerate", "accelerate"), ("PEFT", "peft"), ("DeepSpeed", "deepspeed")):
        assert lines[f"{label} version"] == version(name), label
    assert lines["vLLM version"] == "not installed" and lines["accelerator(s)"] == "cpu"
    assert lines["Platform"] and re.fullmatch(r"3\.\d+\.\d+", lines["Python version"])
    shown = (f"{config}\n  - compute_environment: LOCAL_MACHINE\n  - distributed_type: MULTI_GPU\n"
             "  - mixed_precision: bf16")
    assert shown in out
    assert lines["Reviewed against"] == "trl 1.16.0, transformers 5.24.0"
    if all(version(name) == v for name, v in upgrade_guard.REVIEWED_VERSIONS.items()):
        assert lines["Upgrade check"] == "the reviewed code (no self-check needed)"
    else:  # another admitted version (CI's smoke subsets): the self-check's verdict, naming what changed
        assert lines["Upgrade check"].startswith("self-check passed (transformers' Trainer."), lines["Upgrade check"]
    monkeypatch.setattr(upgrade_guard, "status", lambda: "self-check FAILED, RPGTrainer refuses to train: x")
    assert cli.main(["env"]) == 0 and "- Upgrade check: self-check FAILED, RPGTrainer refuses to train: x" in \
        capsys.readouterr().out
    assert cli.main(["env", "--verbose"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("trl-rpg env: error: unrecognized arguments: "
                                                                "--verbose (env takes none)")


def test_the_readme_points_bug_reports_to_trl_rpg_env():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Reporting an issue", 1)[1].split("\n## ", 1)[0]
    assert "`trl-rpg env`" in section
