"""SmolLM2-135M-Instruct, a real pretrained language model reachable on every machine through the package registry:
not part of the training API (docs/smollm2.md).

* :mod:`trl_rpg.smollm2.prepare` -- :func:`prepare_smollm2`: the model as a local folder (``trl-rpg prepare
  smollm2``); ``gguf`` (``pip install 'trl-rpg[smollm2]'``) is imported only there, when preparing.
* :mod:`trl_rpg.smollm2.task` -- single-digit addition through the model's chat template, its reward and held-out
  evaluation.
* :mod:`trl_rpg.cli.smollm2_demo` -- ``trl-rpg demo --model smollm2`` (imports the trainer: not imported here).

May import: `trl_rpg.evaluation`, `trl_rpg.rewards`; never a trainer.
"""

from .prepare import (
    SMOLLM2_GGUF,
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_PACKAGE,
    SMOLLM2_VERSION,
    SmolLM2Unavailable,
    cache_root,
    prepare_smollm2,
    smollm2_path,
)

__all__ = ["SMOLLM2_GGUF", "SMOLLM2_GGUF_SHA256", "SMOLLM2_PACKAGE", "SMOLLM2_VERSION", "SmolLM2Unavailable",
           "cache_root", "prepare_smollm2", "smollm2_path"]
