"""The survivors of an outside mutation pass (issue 46), each killed by a test named for the behaviour: an optimizer
setting refused, 1-D parameters checked for NaN, the Hub manifest sent to `hub_revision`, the final upload wait
bounded in all, TRL's `use_adapter` put back, and SmolLM2's preparation (float32 dequantisation, the GGUF's rope
theta, a failed rename, a folder holding the `.gguf`)."""

import hashlib

import numpy as np
import pytest
import torch
from _tiny import cpu_args
from transformers import TrainerControl

from trl_rpg import RPGConfig, _compat
from trl_rpg.run.hub_uploads import HubUploads, Upload, upload_checkpoint
from trl_rpg.run.parameter_guard import NonFiniteParameters, ParameterGuard, local_parameters
from trl_rpg.smollm2 import prepare as prep

# ---------------------------------------------------------------------------------------------------------------------
# Optimizer settings and the parameter guard
# ---------------------------------------------------------------------------------------------------------------------


def test_adam_beta1_of_one_is_refused_naming_the_field(tmp_path):
    """beta1 = 1: Adam's first moment never moves from 0 and its bias correction divides by 1 - 1 = 0."""
    with pytest.raises(ValueError, match=r"RPGConfig: `adam_beta1`=1\.0 is not allowed; it must be a number in "
                                         r"\[0, 1\)"):
        RPGConfig(**cpu_args(tmp_path, adam_beta1=1.0))


def test_a_nan_in_a_bias_or_norm_stops_the_run_naming_it():
    """1-D parameters (biases, norm weights) are checked as 2-D ones are."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    assert {name for name, _ in local_parameters(model)} == {"0.weight", "0.bias", "1.weight", "1.bias"}
    guard = ParameterGuard(reduce=lambda flag: flag)
    args, state = RPGConfig.__new__(RPGConfig), type("State", (), {"global_step": 3, "max_steps": 3})()
    args.learning_rate, args.weight_decay, args.adam_epsilon, args.optim = 1e-3, 0.0, 1e-8, "adamw_torch"
    guard.on_step_end(args, state, TrainerControl(), model=model)  # finite: nothing
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    with pytest.raises(NonFiniteParameters, match=r"after optimizer step 3 `1\.bias` is not finite"):
        guard.on_step_end(args, state, TrainerControl(), model=model)


# ---------------------------------------------------------------------------------------------------------------------
# Hub uploads
# ---------------------------------------------------------------------------------------------------------------------


class RecordingApi:
    def __init__(self):
        self.calls = []

    def upload_folder(self, **kwargs):
        self.calls.append(("folder", kwargs))

    def upload_file(self, **kwargs):
        self.calls.append(("file", kwargs))


def test_the_hub_manifest_commit_goes_to_hub_revision_with_the_files(tmp_path):
    api = RecordingApi()
    upload_checkpoint(api, folder_path=str(tmp_path), path_in_repo="last-checkpoint", repo_id="me/rpg",
                      commit_message="step 2", revision="experiment", token="t", repo_type="model")
    (_, files), (_, manifest) = api.calls
    assert files["revision"] == manifest["revision"] == "experiment"
    assert manifest["token"] == "t" and manifest["repo_type"] == "model"


class SlowFuture:
    """An upload that finishes `takes` seconds of the fake clock after it is waited on."""

    def __init__(self, clock, takes):
        self.clock, self.takes, self.finished = clock, takes, False

    def done(self):
        return self.finished

    def exception(self, timeout=None):
        if self.finished:
            return None
        if timeout is not None and timeout < self.takes:
            self.clock[0] += timeout
            raise TimeoutError
        self.clock[0] += self.takes
        self.finished = True
        return None


def test_the_final_upload_wait_is_bounded_in_all_not_per_upload(monkeypatch):
    """Three uploads of 6 s each, a bound of 10 s: the wait ends at 10 s (one done, one cut short), not at 18 s."""
    clock = [0.0]
    monkeypatch.setattr("trl_rpg.run.hub_uploads.time.monotonic", lambda: clock[0])
    uploads = HubUploads(active=False, timeout=10.0)
    uploads.uploads = [Upload(f"checkpoint-{i}", i, "me/rpg", SlowFuture(clock, 6.0)) for i in (1, 2, 3)]
    uploads.finish(push=lambda folder: None)
    assert clock[0] == 10.0
    assert [u.future.done() for u in uploads.uploads] == [True, False, False]


# ---------------------------------------------------------------------------------------------------------------------
# TRL's use_adapter
# ---------------------------------------------------------------------------------------------------------------------


def test_trls_use_adapter_is_put_back_after_the_reference_pass():
    """A plain GRPOTrainer in the same process, after (or beside a failed) RPG run, uses TRL's own `use_adapter`."""
    import trl.trainer.grpo_trainer as grpo

    original, entered = grpo.use_adapter, []
    with _compat.around_trl_reference_pass(lambda model: _entering(entered, model)):
        assert grpo.use_adapter is not original
    assert grpo.use_adapter is original
    with pytest.raises(RuntimeError), _compat.around_trl_reference_pass(lambda model: _entering(entered, model)):
        raise RuntimeError("the run failed")
    assert grpo.use_adapter is original


def _entering(entered, model):
    import contextlib

    entered.append(model)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------------------------------
# SmolLM2's preparation, on a tiny Llama GGUF file written here
# ---------------------------------------------------------------------------------------------------------------------

#: float32 values float16 cannot hold (a third, below its smallest normal, above its largest).
EXACT = np.array([[1 / 3, 1e-6, 70000.5, -2.1], [0.1, 3e-5, -1 / 7, 1234.567]], dtype=np.float32)


def tiny_gguf(path, rope_theta=100000.0):
    """A one-layer Llama GGUF file (float32 tensors) with the metadata prepare reads."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"attention.head_count": 2, "embedding_length": 4, "vocab_size": 2, "feed_forward_length": 8,
                       "block_count": 1, "attention.head_count_kv": 1, "context_length": 16}.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32("llama.rope.freq_base", rope_theta)
    for key, value in {"bos_token_id": 0, "eos_token_id": 1, "padding_token_id": 1}.items():
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    writer.add_tensor("token_embd.weight", EXACT)
    writer.add_tensor("blk.0.attn_norm.weight", EXACT[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(str(path))


def test_smollm2_is_dequantised_to_float32_not_through_float16(tmp_path):
    reader = tiny_gguf(tmp_path / "tiny.gguf")
    config = prep._llama_config(reader, tied=True)
    state = prep.gguf_state_dict(reader, config)
    assert state["model.embed_tokens.weight"].dtype == torch.float32
    assert torch.equal(state["model.embed_tokens.weight"], torch.from_numpy(EXACT))
    assert torch.equal(state["model.layers.0.input_layernorm.weight"], torch.from_numpy(EXACT[0]))


def test_smollm2s_rope_theta_is_read_from_the_gguf_not_llamas_default(tmp_path):
    config = prep._llama_config(tiny_gguf(tmp_path / "tiny.gguf", rope_theta=100000.0), tied=True)
    assert config.rope_parameters["rope_theta"] == 100000.0  # SmolLM2's; Llama's default is 10000


def fake_gguf(tmp_path, monkeypatch, content=b"not really a gguf file"):
    path = tmp_path / "src" / prep.SMOLLM2_GGUF
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    monkeypatch.setattr(prep, "SMOLLM2_GGUF_SHA256", hashlib.sha256(content).hexdigest())
    monkeypatch.setattr(prep.importlib.util, "find_spec", lambda name, *a: object())  # "gguf is installed"
    monkeypatch.setattr(prep, "_convert", lambda gguf_path, out: (out.mkdir(), (out / "config.json").write_text("{}")))
    return path


def test_a_source_folder_holding_the_gguf_itself_is_accepted(tmp_path, monkeypatch):
    source = fake_gguf(tmp_path, monkeypatch)
    path = prep.prepare_smollm2(tmp_path / "cache", source=source.parent, log=None)
    assert prep.is_prepared(path)


def test_a_failed_rename_never_returns_a_folder_that_is_not_a_prepared_model(tmp_path, monkeypatch):
    source = fake_gguf(tmp_path, monkeypatch)

    def rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prep.os, "rename", rename)
    with pytest.raises(prep.SmolLM2Unavailable, match="No space left on device"):
        prep.prepare_smollm2(tmp_path / "cache", source=source, log=None)
    assert not prep.smollm2_path(tmp_path / "cache").exists()
