"""The sampler settings `AsyncRPGTrainer`'s exact weight relies on (`trl_rpg.trainers.async_sampler`), with the
synchronous
trainer's verdicts: exact (full support, a server at processed log-probs), warned (truncated sampling, a server that
does not say its mode), refused (a server at raw log-probs: there is no recompute to fall back on). The server is a
stub of TRL's `VLLMClient`; TRL's own rollout worker is built (never started)."""

import warnings
from types import SimpleNamespace

import pytest
from _tiny import length_reward, save_tiny_model
from datasets import Dataset
from transformers import AutoTokenizer

pytest.importorskip("requests")  # TRL's async trainer builds a vLLM client

from trl.experimental.async_grpo import async_rollout_worker  # noqa: E402
from trl.experimental.async_grpo.vllm_client import VLLMClient  # noqa: E402

from trl_rpg import AsyncRPGConfig, AsyncRPGTrainer  # noqa: E402
from trl_rpg._compat import async_trainer_on_cpu  # noqa: E402
from trl_rpg.toy.async_rollouts import StaleRolloutWorker, VarlenAttention  # noqa: E402
from trl_rpg.trainers import async_runtime  # noqa: E402
from trl_rpg.trainers.async_sampler import SamplerRefused, sampler_verdict, support_cuts  # noqa: E402

URL = "http://stub-server:8000"


def config(**fields):
    return SimpleNamespace(**{"top_p": 1.0, "top_k": 0, "min_p": None, **fields})


@pytest.mark.parametrize("fields,cuts", [
    ({}, []),
    (dict(top_p=0.9, top_k=20), ["top_p=0.9", "top_k=20"]),
    (dict(min_p=0.05), ["min_p=0.05"]),
    (dict(top_k=-1), []),  # vLLM's "no top-k"
    (dict(generation_kwargs={"logit_bias": {"5": -100}, "min_tokens": 4, "seed": 1}),
     ["min_tokens=4", "logit_bias={'5': -100}"]),
    (dict(generation_kwargs={"repetition_penalty": 1.0, "presence_penalty": 0.5}), ["presence_penalty=0.5"]),
    (dict(generation_kwargs={"allowed_token_ids": [1, 2]}), ["allowed_token_ids=[1, 2]"]),
])
def test_settings_that_cut_the_support_are_named(fields, cuts):
    assert support_cuts(config(**fields)) == cuts


def test_the_verdicts():
    assert sampler_verdict(config(), "processed_logprobs", URL).kind == "exact"
    assert sampler_verdict(config()).kind == "exact"  # a worker of its own: its log-probs are its own
    truncated = sampler_verdict(config(top_p=0.9, top_k=20), "processed_logprobs", URL)
    assert truncated.kind == "warned" and "top_p=0.9, top_k=20 truncates sampling" in truncated.message
    silent = sampler_verdict(config(), None, URL)
    assert silent.kind == "warned" and f"the vLLM server at {URL} did not report its logprobs mode" in silent.message
    raw = sampler_verdict(config(top_p=0.9), "raw_logprobs", URL)
    assert raw.kind == "refused"
    assert raw.message.startswith(f"AsyncRPGTrainer: the vLLM server at {URL} reports logprobs_mode='raw_logprobs', "
                                  "not 'processed_logprobs'")
    assert "--logprobs-mode processed_logprobs" in raw.message


# ---------------------------------------------------------------------------------------------------------------------
# In the trainer: TRL's worker asks the server; the stand-in is not asked
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("sampler") / "model"))


def prompts() -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+{i}"}] for i in range(4)]})


def build(model_path, tmp_path, monkeypatch, mode, trl_worker=True, **fields):
    """The trainer with TRL's rollout worker (vLLM and aiohttp said present: it is built, never started) and a server
    stub reporting `mode`; or with the CPU stand-in worker."""
    asked = []

    def server_info(self):
        asked.append(self.server_url)
        return {"model_config": {} if mode is None else {"logprobs_mode": mode}}

    monkeypatch.setattr(VLLMClient, "wait_for_server_ready", lambda self, *a, **k: None)
    monkeypatch.setattr(VLLMClient, "get_server_info", server_info)
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    monkeypatch.setattr(async_rollout_worker, "is_aiohttp_available", lambda: True)
    # TRL's own worker on a machine without CUDA: the runtime check (tests/test_async_runtime.py) would refuse it
    # before the sampler verdict this file tests; the worker is built, never started.
    monkeypatch.setattr(async_runtime, "check_async_runtime", lambda positional, kwargs: None)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    stand_in = StaleRolloutWorker(model_path, prompts(), length_reward, tokenizer, num_generations=2,
                                  max_completion_length=4)
    args = AsyncRPGConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2,
                          max_completion_length=4, use_cpu=True, report_to="none", vllm_server_base_url=URL, **fields)
    with async_trainer_on_cpu(VarlenAttention):
        trainer = AsyncRPGTrainer(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts(),
                                  processing_class=tokenizer, rollout_worker=None if trl_worker else stand_in,
                                  weight_transfer=stand_in)
    return trainer, asked


def test_a_server_at_raw_logprobs_is_refused(model_path, tmp_path, monkeypatch):
    with pytest.raises(SamplerRefused, match=r"the vLLM server at http://stub-server:8000 reports "
                                             r"logprobs_mode='raw_logprobs'"):
        build(model_path, tmp_path, monkeypatch, "raw_logprobs")


def test_a_server_at_processed_logprobs_is_exact(model_path, tmp_path, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", "AsyncRPGConfig: beta=.* too small to act")  # the default beta's own
        trainer, asked = build(model_path, tmp_path, monkeypatch, "processed_logprobs")
    assert asked == [URL] and trainer.sampler_verdict.kind == "exact"


def test_truncated_sampling_and_a_silent_server_warn(model_path, tmp_path, monkeypatch):
    with pytest.warns(UserWarning, match=r"top_p=0.9, top_k=20 truncates sampling.*did not report its logprobs mode"):
        trainer, _ = build(model_path, tmp_path, monkeypatch, None, top_p=0.9, top_k=20)
    assert trainer.sampler_verdict.kind == "warned"


def test_a_worker_of_its_own_is_not_asked(model_path, tmp_path, monkeypatch):
    trainer, asked = build(model_path, tmp_path, monkeypatch, "raw_logprobs", trl_worker=False)
    assert asked == [] and trainer.sampler_verdict.kind == "exact"
