"""TRL changed the way open TRL pull requests would change it, to show the upgrade self-check refuses them.

- `PR_5413` (huggingface/trl#5413, "Skip redundant forward pass for on-policy vLLM importance sampling"): on an
  aligned layout `_generate_and_score_completions` no longer scores `old_per_token_logps` under vLLM's correction,
  so the batch carries neither them nor `importance_sampling_ratio`; `_compute_loss` computes both inline (here a
  token-level truncation stands in for the PR's copy of the whole block).
- `PR_7188` (huggingface/trl#7188, "Multiply the KL term by the per-token importance sampling ratio"): the KL term's
  bias correction uses the per-token ratio whatever `importance_sampling_level` says.

A patch is `{method: [(old, new), ...]}` on `GRPOTrainer`'s source in `trl/trainer/grpo_trainer.py`; each `old`
occurs exactly once in its method. `patched_class` applies it in this process (a subclass whose methods are the
patched source), `patched_copy` to a copy of the installed TRL package (with a dist-info of another version), for a
subprocess that puts the copy first on `sys.path`.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap
from pathlib import Path

import trl
from trl import GRPOTrainer

_VLLM = "self.use_vllm and self.vllm_importance_sampling_correction"
_OLD = ("        old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else "
        "old_per_token_logps\n")
_RATIO = "\n            output[\"importance_sampling_ratio\"]"

PR_5413 = {
    "_generate_and_score_completions": [
        (f"if self.args.gradient_accumulation_steps % generate_every != 0 or (\n                {_VLLM}\n"
         "            ):", "if self.args.gradient_accumulation_steps % generate_every != 0:"),
        (f"            if {_VLLM}:\n                mask = completion_mask",
         f"            if {_VLLM} and old_per_token_logps is not None:\n                mask = completion_mask"),
        (f"        if {_VLLM}:\n            delta = torch.abs(",
         f"        if {_VLLM} and old_per_token_logps is not None:\n            delta = torch.abs("),
        (f"        if {_VLLM}:{_RATIO}", f"        if {_VLLM} and old_per_token_logps is not None:{_RATIO}"),
    ],
    "_compute_loss": [
        (_OLD, _OLD + f"        if {_VLLM} and \"importance_sampling_ratio\" not in inputs:\n"
         "            diff = old_per_token_logps - inputs[\"sampling_per_token_logps\"]\n"
         "            diff = torch.nan_to_num(diff * mask, nan=0.0)\n"
         "            inputs[\"old_per_token_logps\"] = old_per_token_logps\n"
         "            inputs[\"importance_sampling_ratio\"] = torch.exp(diff).clamp(\n"
         "                min=self.vllm_importance_sampling_clip_min, max=self.vllm_importance_sampling_clip_max)\n"),
    ],
}

PR_7188 = {
    "_compute_loss": [("                per_token_kl = per_token_kl * coef_1\n",
                       "                per_token_kl = per_token_kl * torch.exp(log_ratio)\n")],
}

#: The file of `GRPOTrainer` inside the TRL package.
GRPO_FILE = Path("trainer") / "grpo_trainer.py"


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    assert count == 1, f"{where}: the patch's text occurs {count} times (TRL changed?): {old!r}"
    return text.replace(old, new)


def patched_method_source(name: str, edits) -> str:
    """`GRPOTrainer.<name>`'s source, dedented to module level, with `edits` applied."""
    source = textwrap.dedent(inspect.getsource(getattr(GRPOTrainer, name)))
    for old, new in edits:
        source = _replace_once(source, _dedent(old), _dedent(new), f"GRPOTrainer.{name}")
    return source


def _dedent(text: str) -> str:
    """`text` (indented as in the file) as it reads in a method's dedented source: 4 spaces less on each line."""
    return "\n".join(line[4:] if line.startswith("    ") else line for line in text.split("\n"))


def patched_class(patch: dict) -> type:
    """A `GRPOTrainer` subclass whose patched methods are compiled from the patched source (zero-argument `super()`
    inside them resolves to `GRPOTrainer`, as in TRL)."""
    import trl.trainer.grpo_trainer as module

    body = "".join(textwrap.indent(patched_method_source(name, edits), "    ") for name, edits in patch.items())
    namespace = dict(vars(module))
    exec(compile(f"class PatchedGRPOTrainer(GRPOTrainer):\n{body}", module.__file__, "exec"), namespace)
    return namespace["PatchedGRPOTrainer"]


def patched_copy(destination: Path, patch: dict, version: str, extra_edits=()) -> Path:
    """A copy of the installed TRL under `destination/trl`, `patch` applied to its `grpo_trainer.py` (and
    `extra_edits`: `(relative file, old, new)`), with a `trl-<version>.dist-info` next to it: put `destination` first
    on `sys.path` and `import trl` is the patched copy, `importlib.metadata.version("trl")` the given version."""
    source = Path(trl.__file__).parent
    target = destination / "trl"
    shutil.copytree(source, target)  # with __pycache__: only the patched file recompiles
    path = target / GRPO_FILE
    text = path.read_text(encoding="utf-8")
    for name, edits in patch.items():
        for old, new in edits:
            text = _replace_once(text, old, new, f"grpo_trainer.py ({name})")
    path.write_text(text, encoding="utf-8")
    for relative, old, new in extra_edits:
        file = target / relative
        file.write_text(_replace_once(file.read_text(encoding="utf-8"), old, new, relative), encoding="utf-8")
    info = destination / f"trl-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: trl\nVersion: {version}\n", encoding="utf-8")
    (info / "top_level.txt").write_text("trl\n", encoding="utf-8")
    return destination
