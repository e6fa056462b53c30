"""The precision a run trains in, said to the user: the start-up line's clause and the warning for a clash.

What the arguments ask for (`bf16`, `fp16`) is not always what a run uses. transformers' `TrainingArguments` take
the accelerator's mixed precision from `ACCELERATE_MIXED_PRECISION` (which `accelerate launch` sets from its config's
`mixed_precision` or its `--mixed_precision`) when the arguments ask for neither: a script launched with
`accelerate_configs/multi_gpu.yaml` (mixed_precision: bf16) and `bf16=False` trains in bf16 autocast. `trl-rpg train`
refuses that launch (`cli.launcher.check_mixed_precision`); from Python, `RPGTrainer` warns (`clash_warning`) and the
start-up line states the precision the run really uses (`precision_clause`).

Pure functions of plain values (the arguments' flags, the accelerator's `mixed_precision`, the trained parameters'
dtypes, the environment variable's value): nothing here imports torch, TRL or accelerate.
"""

from __future__ import annotations

#: The environment variable through which `accelerate launch` hands its mixed precision to the script it runs.
MIXED_PRECISION_ENV = "ACCELERATE_MIXED_PRECISION"

_ASKED = {"no": "float32 (bf16=False, fp16=False)", "bf16": "bf16 (bf16=True)", "fp16": "fp16 (fp16=True)"}


def requested(bf16: bool, fp16: bool) -> str:
    """The mixed precision the arguments ask for: `"bf16"`, `"fp16"` or `"no"` (transformers' order: fp16 first)."""
    return "fp16" if fp16 else "bf16" if bf16 else "no"


def _launcher_precision(launcher: str | None) -> str | None:
    """The launcher's mixed precision when it asks for one (`"bf16"`, `"fp16"`, ...), else None."""
    return launcher if launcher not in (None, "", "no") else None


def clash_warning(bf16: bool, fp16: bool, used: str, launcher: str | None) -> str | None:
    """The warning for a launcher whose mixed precision (`launcher`: `ACCELERATE_MIXED_PRECISION`) is not what the
    arguments ask for, saying which one the run uses (`used`: the accelerator's `mixed_precision`); else None."""
    asked, launcher = requested(bf16, fp16), _launcher_precision(launcher)
    if launcher is None or launcher == asked:
        return None
    winner = ("the launcher's, since the arguments ask for no mixed precision" if asked == "no" else
              "the arguments'")
    fix = (f"set {launcher}=True to train in {launcher} knowingly, or launch with mixed precision 'no' "
           "(`accelerate launch --mixed_precision no`, or mixed_precision: no in the config) for float32"
           if asked == "no" else f"launch with --mixed_precision {asked} (or mixed_precision: {asked} in the config)")
    return (f"RPGTrainer: the launcher asks for mixed precision {launcher} ({MIXED_PRECISION_ENV}={launcher}, from "
            f"an accelerate config's mixed_precision or `accelerate launch --mixed_precision`), the arguments for "
            f"{_ASKED[asked]}: this run trains in {used}, {winner}. To make them agree, {fix} (`trl-rpg train` "
            "refuses such a launch).")


def precision_clause(bf16: bool, fp16: bool, used: str, parameter_dtypes, launcher: str | None) -> str:
    """The start-up line's precision: the autocast the run uses (`used`), over which trained parameters
    (`parameter_dtypes`: names such as `"float32"`), and where a launcher's setting, not the arguments, decided."""
    dtypes = ", ".join(sorted({str(d).removeprefix("torch.") for d in parameter_dtypes})) or "no"
    text = (f"{used} autocast over {dtypes} trained parameters" if used not in ("no", None) else
            f"{dtypes} trained parameters, no mixed precision")
    asked = requested(bf16, fp16)
    if (used or "no") != asked:
        launcher = _launcher_precision(launcher)
        source = f"{MIXED_PRECISION_ENV}={launcher}" if launcher else "a setting outside the arguments"
        text += f" ({used} from {source}; the arguments ask for {_ASKED[asked]})"
    return text


__all__ = ["MIXED_PRECISION_ENV", "clash_warning", "precision_clause", "requested"]
