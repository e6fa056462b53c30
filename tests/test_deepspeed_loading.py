"""Nothing is unpickled on resume under DeepSpeed either (issue 26, section 4).

DeepSpeed's checkpoint loader calls `torch.load(weights_only=False)`; while transformers resumes under DeepSpeed
(`Trainer._prepare_for_training`), RPGTrainer makes every `torch.load` weights-only (torch's
`TORCH_FORCE_WEIGHTS_ONLY_LOAD`) with the DeepSpeed types its checkpoints hold allowed
(`_compat.DEEPSPEED_CHECKPOINT_TYPES`, found by loading real ZeRO-2 and ZeRO-3 checkpoints, fp32 and bf16, full and
LoRA). These tests go through DeepSpeed's own loader (`TorchCheckpointEngine`); tests/test_distributed.py loads the
files of real ZeRO-2 and ZeRO-3 checkpoints, resumes them exactly, and refuses a payload in a real resume.
"""

import os
from collections import OrderedDict

import pytest
import torch

from trl_rpg.run import checkpoint as ckpt

pytest.importorskip("deepspeed")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine  # noqa: E402
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler  # noqa: E402
from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: E402
from deepspeed.utils.tensor_fragment import fragment_address  # noqa: E402


class _Payload:
    """Unpickling this runs code: it creates a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def optimizer_state(scaler):
    """What a ZeRO optimizer state file holds besides tensors (DeepSpeed 0.19, `stage_1_and_2.state_dict`)."""
    return {"loss_scaler": scaler, "dynamic_loss_scale": False, "overflow": False, "clip_grad": 1.0,
            "zero_stage": ZeroStageEnum.gradients, "ds_version": "0.19.0", "partition_count": [2],
            "param_slice_mappings": [OrderedDict(weight=fragment_address(numel=4, start=0))],
            "single_partition_of_fp32_groups": [torch.arange(4.0)],
            "base_optimizer_state": {"state": {0: {"exp_avg": torch.ones(4), "step": torch.tensor(3.0)}},
                                     "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0]}]}}


@pytest.mark.parametrize("scaler", [LossScaler(1.0), DynamicLossScaler(2.0**16, 1000, 1, 2, False)],
                         ids=["static_scale", "dynamic_scale_fp16"])
def test_deepspeed_s_loader_reads_its_own_types_weights_only(tmp_path, scaler):
    engine = TorchCheckpointEngine()
    path = str(tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    engine.save(optimizer_state(scaler), path)
    with ckpt.deepspeed_loads_weights_only(str(tmp_path)):
        loaded = engine.load(path)
    assert loaded["zero_stage"] is ZeroStageEnum.gradients
    assert loaded["param_slice_mappings"][0]["weight"] == fragment_address(numel=4, start=0)
    assert type(loaded["loss_scaler"]) is type(scaler) and loaded["loss_scaler"].cur_scale == scaler.cur_scale
    assert torch.equal(loaded["base_optimizer_state"]["state"][0]["exp_avg"], torch.ones(4))


def test_a_payload_in_a_deepspeed_file_is_refused_and_never_runs(tmp_path):
    engine = TorchCheckpointEngine()
    marker = tmp_path / "code_ran"
    path = str(tmp_path / "global_step3" / "mp_rank_00_model_states.pt")
    os.makedirs(os.path.dirname(path))
    engine.save({"module": {}, "client": _Payload(str(marker))}, path)
    with pytest.raises(ckpt.CheckpointError) as error:
        with ckpt.deepspeed_loads_weights_only(str(tmp_path)):
            engine.load(path)
    assert not marker.exists()
    message = str(error.value)
    assert f"{tmp_path}: a DeepSpeed file of this checkpoint holds more than tensors and plain data" in message
    assert "Unsupported global: GLOBAL io.open" in message and "torch.serialization.add_safe_globals" in message


def test_loads_are_weights_only_inside_the_block_only(tmp_path):
    path = str(tmp_path / "payload.pt")
    torch.save({"x": _Payload(str(tmp_path / "ran"))}, path)
    with pytest.raises(ckpt.CheckpointError):
        with ckpt.deepspeed_loads_weights_only(str(tmp_path)):
            torch.load(path, weights_only=False)
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
    torch.load(path, weights_only=False)  # outside the block, the caller's choice holds
    assert (tmp_path / "ran").exists()
