"""The README's two first commands (the demo, the test suite) are independent: each makes and uses its own
virtualenv, ignored by git, and the CI entry point (.ci/run) still finds the test command (issue 29 section 3)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = re.compile(r"python3 -m venv (\S+) && \. (\S+)/bin/activate && ")


def first_bash_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_demo_and_test_commands_each_use_their_own_virtualenv():
    demo, tests = first_bash_block()
    assert demo.endswith("trl-rpg demo") and tests.endswith("python -m pytest -q")
    envs = []
    for line in (demo, tests):
        made, activated = VENV.match(line).groups()
        assert made == activated, line  # it activates the virtualenv it made
        assert set(re.findall(r"\.venv[\w-]*", line)) == {made}, line  # and touches no other
        envs.append(made)
    assert len(set(envs)) == 2, envs
    for env in envs:
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{env}/"], cwd=ROOT)
        assert ignored.returncode == 0, f"{env}/ is not ignored by git"


def test_ci_entry_point_finds_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    extract = re.search(r"cmd=\$\((awk .*README\.md)\)", script).group(1)
    found = subprocess.run(["bash", "-c", extract], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert found.strip() == first_bash_block()[1]
