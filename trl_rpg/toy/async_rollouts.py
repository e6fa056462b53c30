"""Stand-ins for the vLLM side of TRL's asynchronous trainer, so that `AsyncGRPOTrainer` / `AsyncRPGTrainer` train on
CPU: the tests and `benchmarks/asynchronous.py` use them; a real run uses TRL's rollout worker and a `vllm serve`.

* :class:`StaleRolloutWorker` -- a rollout worker *and* a weight transfer (pass it as both `rollout_worker` and
  `weight_transfer`). It keeps a copy of every policy version the trainer sends and generates each group of samples
  when the trainer asks for one, with the version ``staleness`` versions older than the current one: what TRL
  measures as the sample's staleness (`sample/staleness_*`) is exactly ``staleness`` once that many versions exist
  (before, the oldest version it holds, the initial weights). Each sample carries what the vLLM server returns: the
  sampled tokens and their processed log-probs, ``log_softmax(logits / temperature)`` of the version that sampled.
* :class:`VarlenAttention` -- the `flash_attn_varlen_func` of the FA3 kernel (`packing._flash_attn()`, GPU only) on
  CPU: torch SDPA per packed segment, each query segment attending causally to the end of its key path (the kernel's
  bottom-right causal alignment), grouped-query heads repeated, a sliding window honoured.

Use them inside :func:`trl_rpg._compat.async_trainer_on_cpu` (which puts :class:`VarlenAttention` in place of the
kernel). Sampling is temperature only (`top_p=1`, `top_k=0`), single turn, no tools; the rewards and advantages are
TRL's worker's, ``(reward - group mean) / (group std + 1e-8)`` over the scored completions, 0 for one that every
reward function left unscored (None); `tests/test_async_loss_terms.py` checks both against TRL's worker's code.

TRL's dataloader fetches one micro-batch ahead (accelerate's dispatcher), so a micro-batch is trained after at most
one more optimizer step than its measured staleness: the weight ``w = pi_theta/mu`` the loss uses is exact whatever
the lag, since mu is the version that sampled.
"""

from __future__ import annotations

import queue
import random
import time
from collections.abc import Callable

import numpy as np
import torch


class VarlenAttention:
    """`flash_attn_varlen_func` semantics on CPU (torch SDPA per segment); see the module docstring."""

    @staticmethod
    def flash_attn_varlen_func(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=None, causal=True, window_size=(-1, -1), softcap=None, **kwargs):
        if softcap:
            raise NotImplementedError("VarlenAttention: logit soft-capping is not reproduced on CPU.")
        out = []
        for s in range(len(cu_seqlens_q) - 1):
            q0, q1, k0, k1 = (int(x) for x in (cu_seqlens_q[s], cu_seqlens_q[s + 1], cu_seqlens_k[s],
                                               cu_seqlens_k[s + 1]))
            q, k, v = (x.transpose(0, 1) for x in (query[q0:q1], key[k0:k1], value[k0:k1]))  # (heads, tokens, dim)
            k, v = (x.repeat_interleave(q.shape[0] // x.shape[0], dim=0) for x in (k, v))
            rows = torch.arange(q1 - q0).unsqueeze(1) + (k1 - k0) - (q1 - q0)  # the query's position in its path
            cols = torch.arange(k1 - k0).unsqueeze(0)
            allowed = cols <= rows if causal else torch.ones_like(cols <= rows)
            if window_size[0] >= 0:
                allowed = allowed & (cols >= rows - window_size[0])
            out.append(torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, scale=softmax_scale).transpose(0, 1))
        return torch.cat(out)


class _OnDemandQueue:
    """The worker's `rollout_buffer`: `get` generates when nothing is pending (so the sample's version is decided
    when the trainer asks for it)."""

    def __init__(self, next_sample: Callable, pending: Callable):
        self._next_sample, self._pending = next_sample, pending

    def get(self, timeout=None):
        return self._next_sample()

    def qsize(self) -> int:
        return self._pending()


class StaleRolloutWorker:
    """Rollout worker and weight transfer of TRL's asynchronous trainer, generating with stale policies on CPU.

    Args:
        model_path: the model the trainer trains (a local folder); loaded once, its weights then replaced by those
            the trainer sends.
        dataset: rows with a conversational `prompt`; the other columns are passed to the reward functions.
        reward_funcs: TRL reward functions (`prompts`, `completions`, `completion_ids`, the columns), summed.
        processing_class: the tokenizer (its chat template renders the prompts).
        num_generations, max_completion_length, temperature: as the trainer's config.
        staleness: versions between the current policy and the one that samples a group: an int, or a function of
            the group's index.
        groups_per_call: groups generated together (one batch, one version) when the trainer finds none pending:
            a micro-batch's worth (`per_device_train_batch_size / num_generations`) is fastest.
        seed: seeds the prompt order and the sampling (the worker's own generator: the trainer's random state is
            untouched).
        keep_versions: how many of the newest policy versions to hold (None: every one). A fixed ``staleness`` s
            needs s + 1; fewer is refused. A real model's versions are its whole weights (0.54 GB each for a 135M
            model): hold only what sampling can use.
    """

    def __init__(self, model_path: str, dataset, reward_funcs, processing_class, *, num_generations: int,
                 max_completion_length: int, temperature: float = 1.0, staleness: int | Callable[[int], int] = 0,
                 seed: int = 0, groups_per_call: int = 1, keep_versions: int | None = None):
        from transformers import AutoModelForCausalLM

        if keep_versions is not None:
            if callable(staleness):
                raise ValueError("StaleRolloutWorker: keep_versions needs a fixed (integer) staleness; got a function")
            if not isinstance(keep_versions, int) or keep_versions < int(staleness) + 1:
                raise ValueError(f"StaleRolloutWorker: keep_versions must be None or an integer of at least staleness "
                                 f"+ 1 ({int(staleness) + 1}); got {keep_versions!r}")

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.dataset, self.tokenizer = dataset, processing_class
        self.reward_funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        self.num_generations, self.max_tokens, self.temperature = num_generations, max_completion_length, temperature
        self.groups_per_call, self.keep_versions = groups_per_call, keep_versions
        self.staleness = staleness if callable(staleness) else (lambda group, s=staleness: s)
        self.generator = torch.Generator().manual_seed(seed)
        self._order = random.Random(seed)
        self._rows: list[int] = []
        self.rollout_buffer = _OnDemandQueue(self._next_sample, lambda: len(self._pending))
        self.metrics_queue: queue.Queue = queue.Queue()
        self.version = 0
        self.versions: dict[int, dict[str, torch.Tensor]] = {}  #: the policy versions held (keep_versions), by number
        self.sampled_with: list[int] = []  #: the version that sampled each group, in order
        self._incoming: dict[str, torch.Tensor] | None = None
        self._loaded: int | None = None
        self._pending: list = []
        self._group = 0

    # ---- WeightTransferProtocol: the trainer sends each new policy, then moves the version ----
    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator) -> None:
        self._incoming = {name: tensor.detach().to("cpu", copy=True) for name, tensor in iterator}

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass

    # ---- RolloutWorkerProtocol ----
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def check_health(self, stale_after_s: float) -> None:
        pass

    def update_model_version(self, model_version: int) -> None:
        if self._incoming is not None:  # the weights just sent are this version's
            self.versions[model_version], self._incoming = self._incoming, None
        self.version = model_version
        if self.keep_versions is not None:
            for old in sorted(self.versions)[:-self.keep_versions]:
                del self.versions[old]

    # ---- generation ----
    def _next_sample(self):
        if not self._pending:
            self._pending = self._generate_groups()
        return self._pending.pop(0)

    def _load(self, version: int) -> None:
        if self._loaded != version:
            missing, unexpected = self.model.load_state_dict(self.versions[version], strict=False)
            tied = {name for name, _ in self.model.named_parameters(remove_duplicate=False)} - {
                name for name, _ in self.model.named_parameters()}
            if unexpected or set(missing) - tied:
                raise ValueError(f"StaleRolloutWorker: the weights sent do not fit the model (unexpected "
                                 f"{unexpected}, missing {sorted(set(missing) - tied)}).")
            self._loaded = version

    def _next_row(self) -> dict:
        if not self._rows:
            self._rows = list(range(len(self.dataset)))
            self._order.shuffle(self._rows)
        return self.dataset[self._rows.pop(0)]

    @torch.no_grad()
    def _sample(self, prompts: list[list[int]], copies: int = 1) -> tuple[list[list[int]], list[list[float]]]:
        """``copies`` completions of each prompt, in order (left-padded into one batch): their tokens (up to and
        including eos) and processed log-probs. Each prompt is read once and its cache repeated ``copies`` times, the
        same cache as reading every copy (`tests/test_async_loss_terms.py`) at 1/copies of the prompt's cost."""
        eos, width = self.tokenizer.eos_token_id, max(map(len, prompts))
        input_ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1, :].repeat_interleave(copies, dim=0)
        cache.batch_repeat_interleave(copies)
        mask, positions = mask.repeat_interleave(copies, dim=0), positions.repeat_interleave(copies, dim=0)
        rows = len(prompts) * copies
        tokens, logps = [[] for _ in range(rows)], [[] for _ in range(rows)]
        done = torch.zeros(rows, dtype=torch.bool)
        for _ in range(self.max_tokens):
            log_probs = torch.log_softmax(logits.float() / self.temperature, dim=-1)
            chosen = torch.multinomial(log_probs.exp(), 1, generator=self.generator).squeeze(1)
            for i in torch.nonzero(~done).flatten().tolist():
                tokens[i].append(int(chosen[i]))
                logps[i].append(float(log_probs[i, chosen[i]]))
            done |= chosen == eos
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(input_ids=chosen.unsqueeze(1), attention_mask=mask, position_ids=positions,
                             cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1, :]
        return tokens, logps

    def _generate_groups(self) -> list:
        """`groups_per_call` groups, sampled by one version (`staleness` of the first group's index)."""
        version = max(self.version - int(self.staleness(self._group)), min(self.versions))
        self._load(version)
        rows = [self._next_row() for _ in range(self.groups_per_call)]
        prompts = [list(self.tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                                           return_dict=False)) for row in rows]
        tokens, logps = self._sample(prompts, copies=self.num_generations)
        samples, n = [], self.num_generations
        for g, (row, prompt_ids) in enumerate(zip(rows, prompts)):
            self.sampled_with.append(version)
            samples += self._scored(row, prompt_ids, tokens[g * n:(g + 1) * n], logps[g * n:(g + 1) * n], version)
            self._group += 1
        return samples

    def _scored(self, row: dict, prompt_ids: list[int], tokens: list[list[int]], logps: list[list[float]],
                version: int) -> list:
        """One group's `RolloutSample`s: rewards summed over the reward functions, TRL's worker's advantages."""
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        n, prompt = self.num_generations, row["prompt"]
        completions = [[{"role": "assistant", "content": self.tokenizer.decode(t, skip_special_tokens=True)}]
                       for t in tokens]
        columns = {key: [value] * n for key, value in row.items() if key not in ("prompt", "completion",
                                                                               "completion_ids")}
        per_func = np.array([[float("nan") if r is None else r for r in func(
            prompts=[prompt] * n, completions=completions, completion_ids=tokens, **columns)]
            for func in self.reward_funcs], dtype=float)
        rewards = np.nansum(per_func, axis=0)
        rewards[np.isnan(per_func).all(axis=0)] = np.nan  # TRL's rollout worker: unscorable (every function None),
        scored = rewards[~np.isnan(rewards)]  # advantage 0, the group's mean and std taken over the scored ones
        advantages = np.zeros_like(rewards)
        if scored.size:
            advantages[~np.isnan(rewards)] = (scored - scored.mean()) / (scored.std() + 1e-8)
        reward_std = float(scored.std()) if scored.size else float("nan")
        names = [getattr(func, "__name__", type(func).__name__) for func in self.reward_funcs]
        now = time.time()
        return [RolloutSample(
            prompt=prompt, completion=completion, input_ids=np.asarray(prompt_ids + ids, dtype=np.int64),
            completion_mask=np.asarray([0] * len(prompt_ids) + [1] * len(ids), dtype=np.int64),
            old_log_probs=np.asarray([0.0] * len(prompt_ids) + lps, dtype=np.float32),
            advantage=float(advantage), model_version=version, group_id=self._group,
            metrics={"reward": float(reward), "reward_std": reward_std,
                     **{f"rewards/{name}": float(value) for name, value in zip(names, per_func[:, i])}},
            enqueued_at=now)
            for i, (completion, ids, lps, advantage, reward) in enumerate(
                zip(completions, tokens, logps, advantages, rewards))]


__all__ = ["StaleRolloutWorker", "VarlenAttention"]
