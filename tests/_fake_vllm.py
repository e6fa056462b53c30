"""The fake vLLM of `tests/vllm_stub` in a test: install it for one block, serve it, and read what TRL sent it.

- `installed()`: within the block `import vllm` is the fake and TRL sees vLLM installed; afterwards nothing of it is
  left (the rest of the suite, e.g. an evaluation that picks a vLLM backend when vLLM is installed, never sees it).
- `served(model_path)`: within the block TRL's `VLLMClient` (server mode) is `FakeVLLMClient`, a client whose
  "server" is a fake `vllm.LLM` over `model_path`, as `trl vllm-serve --model model_path` would hold (with
  `logprobs_mode="raw_logprobs"`: a server started without `--logprobs-mode processed_logprobs`).
- `rewrite_outputs(engine, rewrite)`: every completion the engine returns from then on passes through `rewrite` (a
  corrupted or malformed engine output; the engine's `requests` keep what it computed).
- `record_syncs(trainer)`: after each of TRL's weight syncs, the weights the engine should hold, computed from the
  policy without PEFT's merge (base + scaling x B @ A of the "default" adapter), the reference's, and the policy
  with RPG's "ref" adapter merged too, to show the checks would see either sent instead (ZeRO-3: gathered first).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate.utils import is_peft_model

STUB = Path(__file__).resolve().parent / "vllm_stub"
#: Environment variables TRL's colocate mode sets for vLLM (restored afterwards).
_TRL_SETS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextmanager
def installed() -> Iterator[None]:
    """The fake vLLM is importable and TRL's `vllm_generation` bound its names, by re-running TRL's own guarded
    import (`if is_vllm_available(): from vllm import LLM, ...`); everything is restored after the block."""
    from trl.generation import vllm_generation

    saved_globals = dict(vars(vllm_generation))
    saved_env = {key: os.environ.get(key) for key in _TRL_SETS}
    sys.path.insert(0, str(STUB))
    importlib.invalidate_caches()
    try:
        importlib.reload(vllm_generation)
        yield
    finally:
        sys.path.remove(str(STUB))
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]
        vars(vllm_generation).clear()
        vars(vllm_generation).update(saved_globals)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        importlib.invalidate_caches()


class FakeVLLMClient:
    """What `VLLMGeneration` uses of TRL's `VLLMClient`, over an in-process "server" (`self.engine`, a fake LLM).

    `update_named_params` checks what a real server relies on: `init_communicator` came first, and the streamed
    tensors are the ones announced in `metadata`, in order, with their dtypes and shapes. Each tensor is copied as
    it arrives, as the broadcast sends it (with PEFT, TRL unmerges the adapter once the iteration ends).
    """

    def __init__(self, model: str, base_url: str | None = None, host: str = "0.0.0.0", server_port: int = 8000,
                 group_port: int = 51216, connection_timeout: float = 0.0,
                 logprobs_mode: str = "processed_logprobs"):
        from vllm import LLM

        self.engine = LLM(model=model, seed=0, logprobs_mode=logprobs_mode)
        self.base_url = base_url or f"http://{host}:{server_port}"
        self.calls: list[str] = []
        self.communicator = None

    def get_server_info(self) -> dict:
        return {"model_config": {"logprobs_mode": self.engine.logprobs_mode},
                "weight_transfer_config": {"backend": "nccl"}}

    def init_communicator(self, device=0) -> None:
        self.calls.append("init_communicator")
        self.communicator = device

    def update_named_params(self, metadata, named_params) -> None:
        if self.communicator is None:
            raise RuntimeError("update_named_params before init_communicator")
        self.calls.append("update_named_params")
        received = [(name, tensor.detach().clone()) for name, tensor in named_params]
        streamed = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in received]
        if streamed != [(name, dtype, list(shape)) for name, dtype, shape in metadata]:
            raise RuntimeError("the streamed tensors differ from the announced metadata")
        self.engine.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(received)

    def reset_prefix_cache(self) -> None:
        self.calls.append("reset_prefix_cache")
        self.engine.reset_prefix_cache()

    def generate(self, prompts, features=None, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
                 min_p=0.0, max_tokens=16, logprobs=0, structured_outputs_regex=None, generation_kwargs=None) -> dict:
        from vllm import SamplingParams, StructuredOutputsParams

        if features is not None:
            raise NotImplementedError("FakeVLLMClient: image features are not implemented")
        self.calls.append("generate")
        structured = StructuredOutputsParams(regex=structured_outputs_regex) if structured_outputs_regex else None
        params = SamplingParams(n=n, repetition_penalty=repetition_penalty, temperature=temperature, top_p=top_p,
                                top_k=top_k, min_p=min_p, max_tokens=max_tokens, logprobs=logprobs,
                                structured_outputs=structured, **(generation_kwargs or {}))
        outputs = self.engine.generate([{"prompt_token_ids": ids} for ids in prompts], params)
        choices = [c for o in outputs for c in o.outputs]  # prompt-major, as the server returns them
        ranked = None if logprobs is None else [[sorted(lp.items(), key=lambda kv: kv[1].rank) for lp in c.logprobs]
                                                for c in choices]
        return {"prompt_ids": [o.prompt_token_ids for o in outputs], "completion_ids": [c.token_ids for c in choices],
                "logprobs": None if ranked is None else [[[v.logprob for _, v in p] for p in c] for c in ranked],
                "logprob_token_ids": None if ranked is None else [[[t for t, _ in p] for p in c] for c in ranked]}

    def close_communicator(self) -> None:
        self.communicator = None


@contextmanager
def served(model_path: str, logprobs_mode: str = "processed_logprobs") -> Iterator[list[FakeVLLMClient]]:
    """TRL's server mode reaches `FakeVLLMClient`s over `model_path` (a server run with `logprobs_mode`); yields the
    clients created (inside `installed()`)."""
    from trl.generation import vllm_generation

    clients: list[FakeVLLMClient] = []

    def connect(**kwargs):
        clients.append(FakeVLLMClient(model_path, logprobs_mode=logprobs_mode, **kwargs))
        return clients[-1]

    real = vllm_generation.VLLMClient
    vllm_generation.VLLMClient = connect
    try:
        yield clients
    finally:
        vllm_generation.VLLMClient = real


def rewrite_outputs(engine, rewrite) -> None:
    """From now on every `CompletionOutput` the fake `engine` returns is `rewrite(output)` (mutated or replaced), in
    colocate and server mode alike; `engine.requests` keep what the engine computed."""
    generate = engine.generate

    def rewritten(*args, **kwargs):
        outputs = generate(*args, **kwargs)
        for output in outputs:
            output.outputs = [rewrite(completion) for completion in output.outputs]
        return outputs

    engine.generate = rewritten


def engine_of(trainer):
    """The fake engine a trainer generates with (colocate: its LLM; server: the server's)."""
    generation = trainer.vllm_generation
    return generation.llm if generation.mode == "colocate" else generation.vllm_client.engine


@contextmanager
def gathered(*modules) -> Iterator[None]:
    """Within the block, ZeRO-3-partitioned parameters of `modules` are whole (a collective call: every rank)."""
    params = [p for module in modules if module is not None for p in module.parameters() if hasattr(p, "ds_id")]
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield


def policy_weights(trainer, adapters: tuple[str, ...] = ("default",)) -> dict[str, torch.Tensor]:
    """The policy's weights under the names vLLM knows; with PEFT, the base plus `scaling x B @ A` of each of
    `adapters` (computed here, not by PEFT's merge). Under ZeRO-3, call it inside `gathered`."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not is_peft_model(model):
        return {name: p.detach().clone() for name, p in model.named_parameters()}
    weights = {name.removeprefix("base_model.model.").replace(".base_layer", ""): p.detach().clone()
               for name, p in model.named_parameters() if "lora_" not in name}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            key = name.removeprefix("base_model.model.") + ".weight"
            for a in adapters:
                weights[key] += module.scaling[a] * (module.lora_B[a].weight @ module.lora_A[a].weight)
    return weights


def reference_weights(trainer) -> dict[str, torch.Tensor] | None:
    """The reference policy's weights under the names vLLM knows: TRL's reference model, or with PEFT the base plus
    the "ref" adapter (RPG's moving reference) or the bare base (the adapter-disabled initial model)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.ref_model is not None:
        return {name: p.detach().clone() for name, p in trainer.accelerator.unwrap_model(trainer.ref_model)
                .named_parameters()}
    if is_peft_model(model):
        return policy_weights(trainer, ("ref",) if "ref" in model.peft_config else ())
    return None


def record_syncs(trainer) -> list[dict[str, dict[str, torch.Tensor]]]:
    """After each weight sync TRL makes: {"policy": what the engine should hold, "reference": the reference's
    weights (None without one), and with a PEFT "ref" adapter "with_ref": the policy with "ref" merged too}.
    Observes TRL's `sync_weights`, changes nothing."""
    generation = trainer.vllm_generation
    sync = generation.sync_weights
    model = trainer.accelerator.unwrap_model(trainer.model)
    has_ref_adapter = is_peft_model(model) and "ref" in model.peft_config
    expected: list[dict[str, dict[str, torch.Tensor]]] = []

    def observed_sync():
        sync()
        with gathered(trainer.model, trainer.ref_model):
            expected.append({"policy": policy_weights(trainer), "reference": reference_weights(trainer)})
            if has_ref_adapter:
                expected[-1]["with_ref"] = policy_weights(trainer, ("default", "ref"))

    generation.sync_weights = observed_sync
    return expected


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest elementwise difference between two sets of weights with the same names."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
    return max((a[name].float() - b[name].float()).abs().max().item() for name in a)
