"""scripts/gpu_check.sh says at once that it needs DeepSpeed, --dry-run included, before making its model (the demo's
environment lacks it; issue 36 s.3)."""

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_without_deepspeed_says_how_to_install_it(tmp_path):
    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")  # a Python without DeepSpeed (nor anything else)
    python = tmp_path / "bare" / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], env={"PYTHON": str(python),
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("[gpu_check] needs DeepSpeed")
    assert 'pip install -e ".[deepspeed]"' in proc.stderr and "[gpu_check] --dry-run" not in proc.stdout


def test_gpu_check_async_does_not_ask_for_deepspeed(tmp_path):
    """The asynchronous check runs TRL's asynchronous trainer, which DeepSpeed has no part in (issue 47): without
    DeepSpeed, `--dry-run --async` goes on (here to making its model, which a bare Python cannot)."""
    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")
    python = tmp_path / "bare" / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--async"],
                          env={"PYTHON": str(python), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=120)
    assert "needs DeepSpeed" not in proc.stderr, proc.stderr
    assert "[gpu_check] --dry-run" in proc.stdout
