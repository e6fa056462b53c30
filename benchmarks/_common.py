"""Helpers shared by the benchmarks: machine description, markdown tables, statistics."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
CACHE_DIR = os.environ.get("TRL_RPG_BENCH_CACHE", os.path.join(HERE, ".cache"))


def machine_info() -> dict:
    """Date, host, CPU model, core count, memory, load, git commit, library versions."""
    info: dict = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "nproc": os.cpu_count(),
        "command": " ".join(["python", "-m", _module_name()] + sys.argv[1:]),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["mem_total_gib"] = round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        info["loadavg_start"] = list(os.getloadavg())
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                            cwd=HERE, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=HERE,
                               timeout=10).stdout.strip()
        info["git_dirty"] = bool(dirty)
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = "unknown"
    try:
        import torch
        import transformers
        import trl

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
        info["trl"] = trl.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover
        pass
    return info


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None and spec.name else os.path.basename(sys.argv[0])


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def mean_std(xs) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(obj), f, indent=1, sort_keys=False, default=str, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def _clean(o):
    """NaN/inf -> None (strict JSON), tuples -> lists, recursively."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o
