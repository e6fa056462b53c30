"""SmolLM2-135M-Instruct, a real pretrained language model reachable on every machine through the package registry:
its preparation as a local folder (`trl_rpg.smollm2.prepare`), not part of the training API."""

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
