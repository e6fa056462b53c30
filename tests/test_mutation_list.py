"""scripts/check_mutations.py stays runnable: every mutation it lists changes exactly one place of today's code, and
names tests that exist (the mutations themselves are run by the script, not by this suite: about 18 minutes)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_mutations.py"


def load_script():
    spec = importlib.util.spec_from_file_location("check_mutations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutation_targets_one_line_of_the_current_code():
    mutations = load_script().MUTATIONS
    assert len({m.name for m in mutations}) == len(mutations) >= 23
    for m in mutations:
        text = (ROOT / m.path).read_text()
        assert text.count(m.old) == 1, f"{m.name}: {m.old!r} occurs {text.count(m.old)} times in {m.path}"
        assert m.new != m.old
        test_file = ROOT / m.tests.split()[0]
        assert test_file.is_file(), f"{m.name}: {test_file} does not exist"
        if "-k" in m.tests.split():
            selector = m.tests.split()[m.tests.split().index("-k") + 1]
            assert selector in test_file.read_text(), f"{m.name}: no test in {test_file.name} matches {selector!r}"


def test_list_runs_without_touching_the_tree():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--list", "-k", "ddp"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "dr_grpo normaliser over all processes' rows (ddp)" in proc.stdout
    assert "log-ratio clamp removed" not in proc.stdout  # -k filters by name
