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
