"""`trl-rpg env`: what a bug report needs, as `trl env` prints it, plus what only trl-rpg knows: its version, the TRL
and transformers versions it was reviewed against, and the upgrade check's verdict on the installed TRL.

Versions are read from the installed packages' metadata (vLLM and DeepSpeed are not imported); torch is imported
to name the accelerators. On a TRL other than the reviewed one the verdict may run the upgrade self-check (seconds,
once per installed version: `trl_rpg.upgrade.verdict`).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

#: The packages reported, as `(label, distribution name)`.
PACKAGES = (("PyTorch", "torch"), ("TRL", "trl"), ("Transformers", "transformers"), ("Accelerate", "accelerate"),
            ("PEFT", "peft"), ("DeepSpeed", "deepspeed"), ("vLLM", "vllm"), ("Datasets", "datasets"),
            ("HF Hub", "huggingface_hub"), ("math-verify", "math-verify"))


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def accelerators() -> str:
    import torch

    if torch.cuda.is_available():
        return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    if torch.backends.mps.is_available():
        return "MPS"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return ", ".join(torch.xpu.get_device_name(i) for i in range(torch.xpu.device_count()))
    return "cpu"


def accelerate_config() -> str:
    """accelerate's default config (what `accelerate launch` and `trl-rpg train` use without --config_file)."""
    try:
        from accelerate.commands.config import default_config_file, load_config_from_file
    except ImportError as error:
        return f"unknown ({error})"
    if not os.path.isfile(default_config_file):
        return f"not found ({default_config_file})"
    try:
        settings = load_config_from_file(default_config_file).to_dict()
    except Exception as error:  # noqa: BLE001 (a broken config file is worth reporting, not a crash)
        return f"unreadable {default_config_file}: {type(error).__name__}: {error}"
    return f"{default_config_file}" + "".join(f"\n  - {key}: {value}" for key, value in settings.items())


def environment() -> dict[str, str]:
    """The report's lines, in order."""
    from .. import __version__
    from ..upgrade.guard import REVIEWED_VERSIONS, status

    info = {"Platform": platform.platform(), "Python version": platform.python_version(),
            "trl-rpg version": __version__}
    for label, name in PACKAGES:
        info[f"{label} version"] = _version(name)
    info["accelerator(s)"] = accelerators()
    info["Accelerate config"] = accelerate_config()
    info["Reviewed against"] = ", ".join(f"{name} {v}" for name, v in REVIEWED_VERSIONS.items())
    try:
        info["Upgrade check"] = status()
    except Exception as error:  # noqa: BLE001 (the report must print even where the check cannot run)
        info["Upgrade check"] = f"could not run: {type(error).__name__}: {error}"
    return info


def run_env_command(argv: list[str]) -> int:
    from .arguments import USAGE_ERROR

    if argv and argv[0] in ("-h", "--help"):
        print("usage: trl-rpg env\n\nPrint the platform, the versions of trl-rpg and the libraries it runs on, "
              "accelerate's default config and the upgrade check's verdict on the installed TRL: paste it into a "
              "bug report.")
        return 0
    if argv:
        print(f"trl-rpg env: error: unrecognized arguments: {' '.join(argv)} (env takes none)", file=sys.stderr)
        return USAGE_ERROR
    lines = "\n".join(f"- {key}: {value}" for key, value in environment().items())
    print(f"\nCopy-paste the following information when reporting an issue:\n\n{lines}\n")
    return 0


__all__ = ["PACKAGES", "accelerate_config", "accelerators", "environment", "run_env_command"]
