"""Nothing is unpickled on resume under DeepSpeed either: DeepSpeed's checkpoint loader calls
`torch.load(weights_only=False)`, so while it loads a resumed checkpoint every `torch.load` is made weights-only
(torch's `TORCH_FORCE_WEIGHTS_ONLY_LOAD`) with the DeepSpeed classes its files hold allowed
(`_compat.DEEPSPEED_CHECKPOINT_TYPES`, through torch's `safe_globals`). A file holding anything else (a pickled
payload) is refused before anything in it runs."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ... import _compat
from .layout import CheckpointError

FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
USER_NO_WEIGHTS_ONLY = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextmanager
def deepspeed_loads_weights_only(checkpoint: str) -> Iterator[None]:
    """Within the block (DeepSpeed loading `checkpoint`), `torch.load` is weights-only, DeepSpeed's checkpoint types
    allowed; a file that needs more raises `CheckpointError` naming what it holds. The environment is restored
    after (`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`, which torch refuses together with it, is lifted within the block)."""
    saved = os.environ.get(FORCE_WEIGHTS_ONLY)
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    user_choice = os.environ.pop(USER_NO_WEIGHTS_ONLY, None)  # torch refuses both set at once
    try:
        with torch.serialization.safe_globals(_compat.deepspeed_checkpoint_types()):
            yield
    except pickle.UnpicklingError as error:
        found = str(error).split("WeightsUnpickler error:", 1)[-1].split(" Please use", 1)[0].strip()[:300]
        raise CheckpointError(
            f"{checkpoint}: a DeepSpeed file of this checkpoint holds more than tensors and plain data ({found}). "
            "Nothing of a checkpoint is unpickled (unpickling can run any code), so it is refused. If this is a "
            "checkpoint you wrote with another DeepSpeed version and you trust it, allow the class named with "
            "torch.serialization.add_safe_globals([...]) before train().") from error
    finally:
        if saved is None:
            os.environ.pop(FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[FORCE_WEIGHTS_ONLY] = saved
        if user_choice is not None:
            os.environ[USER_NO_WEIGHTS_ONLY] = user_choice


__all__ = ["deepspeed_loads_weights_only"]
