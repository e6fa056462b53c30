"""A fake vLLM for trl-rpg's tests: the names TRL imports, over a CPU engine that is a transformers model.

Not vLLM. It exists so that TRL's real vLLM code path (`trl.generation.vllm_generation.VLLMGeneration`: engine
construction, `generate`, `sync_weights` with the PEFT merge, `extract_logprobs`, and GRPOTrainer's importance-sampling
correction built on the returned log-probs) runs on CPU in the default test suite. It is importable only where a test
puts `tests/vllm_stub` on `sys.path` (tests/_fake_vllm.py, or `PYTHONPATH` for a launched run); the
`vllm-<version>.dist-info` next to this package makes `importlib.metadata` see it as installed vLLM, as TRL checks.

What it does as vLLM does:

- `LLM(model=path, seed=...)` loads its own copy of the model from `path` (float32, CPU). Its weights change only
  through `llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name, tensor), ...])`
  (Hugging Face parameter names; an unknown name or a wrong shape is an error), which is how TRL syncs them.
- `LLM.generate(prompts, sampling_params)` samples `n` completions per prompt autoregressively from its own weights
  (each sequence positioned from 0, as vLLM runs it unpadded), stops at the tokenizer's / generation config's EOS
  (kept in `token_ids`, `finish_reason="stop"`) or at `max_tokens` (`"length"`), and returns `RequestOutput`s.
- Sampling order and log-probs: greedy at `temperature < 1e-5`; otherwise logits / temperature, then min-p (drop
  tokens whose probability is below `min_p` x the largest), then top-k, then top-p (keep the most probable tokens
  until their mass reaches `top_p`; the most probable is always kept), renormalised. With
  `logprobs_mode="processed_logprobs"` (what TRL asks for) the returned log-probs are those of this final
  distribution, the one sampled from; with `"raw_logprobs"` (vLLM's default) the log-softmax of the unprocessed
  logits. `logprobs=N` returns the sampled token and the N most probable, each with its 1-based rank.
- A per-request `SamplingParams.seed` gives that request its own random stream; otherwise the engine's (`seed`).

Test hooks (not in vLLM):

- `FAKE_VLLM_KERNEL_MISMATCH` (environment, read when the engine is built): the sampler adds `scale x` a fixed
  pseudo-random table (position x token) to the logits before processing, so the sampler mu differs from the
  trained policy as a different kernel's numerics would; it samples from, and reports the log-probs of, that mu.
- `llm.syncs`: one `Sync` per weight sync (closed by `reset_prefix_cache`, which TRL calls after loading): the
  `(name, tensor copy)` pairs received, in order. `llm.requests`: one `Request` per prompt served, with the
  completions, the log-probs returned (mu's) and the policy's own processed log-probs of the same tokens (no
  mismatch). `llm.generate_calls`: the `(number of prompts, sampling params)` of each `generate` call.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

from .sampling_params import SamplingParams, StructuredOutputsParams

__version__ = "0.28.0+fake"
__all__ = ["LLM", "CompletionOutput", "Logprob", "RequestOutput", "SamplingParams", "StructuredOutputsParams"]

#: Environment variable: scale of the sampler's fixed logit perturbation (0: the sampler is the policy).
KERNEL_MISMATCH_ENV = "FAKE_VLLM_KERNEL_MISMATCH"
_GREEDY_BELOW = 1e-5  # vLLM's sampling epsilon: a lower temperature decodes greedily
_MISMATCH_POSITIONS = 64


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class Sync:
    """One weight sync as the engine received it."""

    weights: list = field(default_factory=list)  # [(name, tensor copy), ...] in the order received

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.weights]


@dataclass
class Request:
    """One prompt served: its completions, the log-probs returned, and the policy's own (no kernel mismatch)."""

    prompt_token_ids: list[int]
    params: SamplingParams
    completions: list[list[int]]
    logprobs: list[list[float]]  # of the sampled tokens, as returned (the sampler mu's)
    policy_logprobs: list[list[float]]  # the same tokens under the engine's weights, processed, without mismatch
    sync_count: int  # how many syncs the engine had received when it served the request


class _ModelRunnerModel:
    """What TRL reaches as `llm.llm_engine.model_executor.driver_worker.model_runner.model`."""

    def __init__(self, llm: LLM):
        self._llm = llm

    def load_weights(self, weights):
        return self._llm._load_weights(weights)


class _Namespace:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


class LLM:
    def __init__(self, model, *, seed: int = 0, logprobs_mode: str = "raw_logprobs", max_model_len: int | None = None,
                 tensor_parallel_size: int = 1, enable_sleep_mode: bool = False, **engine_args):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if tensor_parallel_size != 1 or enable_sleep_mode:
            raise NotImplementedError("fake vLLM: tensor_parallel_size > 1 and enable_sleep_mode are not implemented")
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise NotImplementedError(f"fake vLLM: logprobs_mode={logprobs_mode!r} is not implemented")
        self.model_path = str(model)
        with _outside_deepspeed():
            self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.logprobs_mode = logprobs_mode
        self.seed = seed
        self.engine_args = {"seed": seed, "logprobs_mode": logprobs_mode, "max_model_len": max_model_len,
                            **engine_args}
        config = self.model.config
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.eos_token_ids = self._eos_ids()
        self.generator = torch.Generator().manual_seed(seed)
        self.kernel_mismatch = float(os.environ.get(KERNEL_MISMATCH_ENV, "0") or 0)
        self._mismatch = torch.randn(_MISMATCH_POSITIONS, config.vocab_size,
                                     generator=torch.Generator().manual_seed(1234))
        self.syncs: list[Sync] = []
        self.requests: list[Request] = []
        self.generate_calls: list[tuple[int, list[SamplingParams]]] = []
        self._receiving = Sync()
        runner = _Namespace(model=_ModelRunnerModel(self))
        self.llm_engine = _Namespace(model_executor=_Namespace(driver_worker=_Namespace(model_runner=runner)),
                                     model_config=_Namespace(max_model_len=self.max_model_len))

    # -- weights ----------------------------------------------------------------------------------------------------

    def _load_weights(self, weights) -> set[str]:
        import torch

        params = dict(self.model.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"fake vLLM: the model at {self.model_path} has no parameter {name!r}")
            target = params[name]
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"fake vLLM: {name} has shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
            with torch.no_grad():
                target.copy_(tensor.detach().to(target.dtype))
            self._receiving.weights.append((name, tensor.detach().to("cpu", copy=True)))
            loaded.add(name)
        return loaded

    def reset_prefix_cache(self) -> bool:
        self.syncs.append(self._receiving)
        self._receiving = Sync()
        return True

    def sleep(self, level: int = 1):
        raise NotImplementedError("fake vLLM: sleep mode is not implemented")

    def wake_up(self, tags=None):
        raise NotImplementedError("fake vLLM: sleep mode is not implemented")

    # -- generation -------------------------------------------------------------------------------------------------

    def _eos_ids(self) -> set[int]:
        ids = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if source is not None:
                ids.update(source if isinstance(source, (list, tuple, set)) else [source])
        return {int(i) for i in ids}

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, dict):
            if "multi_modal_data" in prompt:
                raise NotImplementedError("fake vLLM: multimodal prompts are not implemented")
            return list(prompt["prompt_token_ids"])
        return self.tokenizer(prompt)["input_ids"]

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True, **kwargs) -> list[RequestOutput]:
        import torch

        if kwargs.get("lora_request") is not None:
            raise NotImplementedError("fake vLLM: LoRA requests are not implemented")
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"fake vLLM: {len(params)} sampling params for {len(prompts)} prompts")
        for p in params:
            if p.unsupported():
                raise NotImplementedError(f"fake vLLM: SamplingParams.{p.unsupported()[0]} is not implemented")
        self.generate_calls.append((len(prompts), params))
        prompt_ids = [self._prompt_ids(p) for p in prompts]
        generators = [self.generator if p.seed is None else torch.Generator().manual_seed(p.seed) for p in params]
        rows = [(i, j) for i, p in enumerate(params) for j in range(p.n)]
        sampled = [_new_row(prompt_ids[i]) for i, _ in rows]
        self._run(prompt_ids, params, generators, rows, sampled)
        outputs = []
        for i, prompt in enumerate(prompts):
            mine = [(j, sampled[r]) for r, (k, j) in enumerate(rows) if k == i]
            completions = [self._completion(j, row, params[i]) for j, row in mine]
            outputs.append(RequestOutput(str(len(self.requests)), prompt if isinstance(prompt, str) else None,
                                         prompt_ids[i], None, completions))
            self.requests.append(Request(prompt_ids[i], params[i], [row["tokens"] for _, row in mine],
                                         [row["logprobs"] for _, row in mine],
                                         [row["policy_logprobs"] for _, row in mine], len(self.syncs)))
        return outputs

    def _run(self, prompt_ids, params, generators, rows, sampled) -> None:
        """Autoregressive sampling of every row, batched: left-padded, positions counted from each row's start."""
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        while True:
            active = [r for r, row in enumerate(sampled) if row["finish_reason"] is None]
            if not active:
                return
            sequences = [sampled[r]["prompt"] + sampled[r]["tokens"] for r in active]
            width = max(len(s) for s in sequences)
            input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences])
            attention_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences])
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids).logits[:, -1, :].float()
            groups: dict[tuple, list[int]] = {}  # rows sampled together: same settings and random stream
            for k, r in enumerate(active):
                i = rows[r][0]
                groups.setdefault(("request", i) if params[i].seed is not None else ("shared", id(params[i])),
                                  []).append(k)
            for members in groups.values():
                i = rows[active[members[0]]][0]
                self._step([sampled[active[k]] for k in members], logits[members], params[i], generators[i])

    def _step(self, batch_rows, logits, params, generator) -> None:
        """One token for each row of `batch_rows` (same settings): sample, record, decide whether it stopped."""
        import torch

        positions = torch.tensor([len(row["tokens"]) % _MISMATCH_POSITIONS for row in batch_rows])
        sampler_logits = logits + self.kernel_mismatch * self._mismatch[positions]
        if params.temperature < _GREEDY_BELOW:
            distribution, policy = torch.log_softmax(sampler_logits, -1), torch.log_softmax(logits, -1)
            tokens = distribution.argmax(-1)
        else:
            distribution, policy = processed_logprobs(sampler_logits, params), processed_logprobs(logits, params)
            tokens = torch.multinomial(distribution.exp(), 1, generator=generator).squeeze(-1)
        reported = distribution if self.logprobs_mode == "processed_logprobs" else torch.log_softmax(sampler_logits,
                                                                                                     -1)
        chosen = reported.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        policy_chosen = policy.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        stops = (set() if params.ignore_eos else self.eos_token_ids) | set(params.stop_token_ids)
        for b, row in enumerate(batch_rows):
            token = int(tokens[b])
            row["tokens"].append(token)
            row["logprobs"].append(float(chosen[b]))
            row["policy_logprobs"].append(float(policy_chosen[b]))
            if params.logprobs is not None:
                top = torch.topk(reported[b], min(params.logprobs, reported.size(-1))).indices.tolist()
                row["top"].append({t: Logprob(float(reported[b, t]), 1 + int((reported[b] > reported[b, t]).sum()))
                                   for t in [token, *top]})
            if token in stops:
                row["finish_reason"] = "stop"
            elif (params.max_tokens is not None and len(row["tokens"]) >= params.max_tokens) or (
                    len(row["prompt"]) + len(row["tokens"]) >= self.max_model_len):
                row["finish_reason"] = "length"

    def _completion(self, index: int, row: dict, params: SamplingParams) -> CompletionOutput:
        logprobs = row["top"] if params.logprobs is not None else None
        text = self.tokenizer.decode(row["tokens"], skip_special_tokens=params.skip_special_tokens)
        return CompletionOutput(index, text, list(row["tokens"]), math.fsum(row["logprobs"]), logprobs,
                                row["finish_reason"])


@contextmanager
def _outside_deepspeed():
    """The engine loads its own whole model, as vLLM does, even in a process whose trainer runs under DeepSpeed
    ZeRO-3 (where transformers would build it partitioned)."""
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


def _new_row(prompt_ids) -> dict:
    return {"prompt": list(prompt_ids), "tokens": [], "logprobs": [], "policy_logprobs": [], "top": [],
            "finish_reason": None}


def processed_logprobs(logits, params: SamplingParams):
    """Log-probs of the distribution sampled from, per row of `logits` (..., V): temperature, then min-p, top-k and
    top-p, renormalised."""
    import torch

    logits = logits / params.temperature
    if params.min_p > 0:
        probs = torch.softmax(logits, -1)
        logits = logits.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), -math.inf)
    if params.top_k not in (0, -1) and params.top_k < logits.size(-1):
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if params.top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, -1)
        dropped = (probs.cumsum(-1) - probs) >= params.top_p  # the kept mass had reached top_p before this token
        logits = logits.masked_fill(dropped.scatter(-1, order, dropped), -math.inf)
    return torch.log_softmax(logits, -1)
