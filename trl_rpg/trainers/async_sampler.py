"""The sampler settings `AsyncRPGTrainer`'s exact weight relies on, checked when the trainer is built, as `RPGTrainer`
checks them for its engine log-probs (`sampler_logps.engine_obstacles`, `server_obstacle`).

The asynchronous trainer always trains with the sampler's own log-probs (`old_log_probs`, mu): there is no
recompute to fall back on. `w = pi_theta/mu` is the exact importance weight when mu is the distribution the server
sampled from, over the whole vocabulary. The verdicts:

- **exact**: no setting cuts the sampler's support, and the vLLM server reports `logprobs_mode="processed_logprobs"`
  (or the worker is not TRL's, whose log-probs are its own: the sample checks, `worker_samples`, still refuse a
  positive one);
- **warned**: `top_p < 1`, `top_k > 0`, `min_p > 0`, or a generation kwarg that cuts or reweights the sampler
  (`SUPPORT_KWARGS`): the sampler never proposes the tokens it cuts, which the policy still gives probability, so
  `w` (renormalised over the kept tokens) misses the cut mass and the KL term never sees those tokens (docs/math.md
  section 4c); also a server that does not say its logprobs mode;
- **refused**: a server that reports another logprobs mode (vLLM's default `raw_logprobs`: the log-probs before
  temperature, so `w` is 0.88-1.17 at staleness 0 and temperature 0.7 instead of 1): restart it with
  `--logprobs-mode processed_logprobs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from .sampler_logps import SAMPLER_SETTINGS, server_obstacle, truncated_sampling

#: Generation kwargs that cut or reweight what the server samples: the synchronous trainer's table
#: (`sampler_logps.SAMPLER_SETTINGS`: `min_tokens`, `bad_words`, `allowed_token_ids`, guided decoding, `logit_bias`,
#: logits processors, the penalties), each named when set to a value that is not neutral.
SUPPORT_KWARGS = tuple(SAMPLER_SETTINGS)


class SamplerRefused(ValueError):
    """The sampler's log-probs are not the distribution it samples from: w would be wrong at every token."""


@dataclass(frozen=True)
class SamplerVerdict:
    """`kind` is "exact", "warned" or "refused"; `message` says why (None when exact)."""

    kind: str
    message: str | None = None


def support_cuts(args) -> list[str]:
    """The settings, as `name=value`, that cut the sampler's support (`sampler_logps.truncated_sampling`, on the
    fields an
    `AsyncGRPOConfig` has, and the support-restricting generation kwargs if a `generation_kwargs` field exists)."""
    kwargs = getattr(args, "generation_kwargs", None) or {}
    view = SimpleNamespace(generation_kwargs=kwargs, top_p=getattr(args, "top_p", 1.0),
                           top_k=getattr(args, "top_k", 0), min_p=getattr(args, "min_p", None))
    return truncated_sampling(view) + [f"{name}={kwargs[name]!r}" for name in SUPPORT_KWARGS
                                       if name in kwargs and not SAMPLER_SETTINGS[name][1](kwargs[name])]


def sampler_verdict(args, logprobs_mode: str | None = None, server: str | None = None) -> SamplerVerdict:
    """The verdict on `args` and, when `server` is given (TRL's worker samples from it), the `logprobs_mode` it
    reported (None: it did not say)."""
    if server is not None and logprobs_mode is not None:
        obstacle = server_obstacle(logprobs_mode, server)
        if obstacle:
            return SamplerVerdict("refused", (
                f"AsyncRPGTrainer: {obstacle}. The asynchronous trainer trains with the server's log-probs as the "
                "sampler's (mu, no recompute), so w = pi_theta/mu would be wrong at every token (about 0.88-1.17 at "
                "staleness 0 and temperature 0.7 with raw log-probs, instead of 1)."))
    reasons = []
    cuts = support_cuts(args)
    if cuts:
        reasons.append(
            f"{', '.join(cuts)} truncates sampling: the sampler never proposes the tokens it cuts, which the policy "
            "still gives probability, so w = pi_theta/mu (mu renormalised over the kept tokens) misses the cut mass "
            "and the KL term towards the sampler never sees those tokens (docs/math.md section 4c). Train with "
            "top_p=1.0, "
            "top_k=0 and min_p=None (truncate at evaluation only)")
    if server is not None and logprobs_mode is None:
        reasons.append(f"the vLLM server at {server} did not report its logprobs mode, so it is not known that its "
                       "log-probs are those of the distribution it samples from (start it with `--logprobs-mode "
                       "processed_logprobs`, as `trl vllm-serve` does)")
    if reasons:
        return SamplerVerdict("warned", "AsyncRPGTrainer: " + "; and ".join(reasons) + ".")
    return SamplerVerdict("exact")


def asked_logprobs_mode(client) -> str | None:
    """The logprobs mode a vLLM server reports (`/server_info`, as `RPGTrainer` reads it), None if it does not say."""
    client.wait_for_server_ready()
    info = client.get_server_info() or {}
    return (info.get("model_config") or {}).get("logprobs_mode")


__all__ = ["SUPPORT_KWARGS", "SamplerRefused", "SamplerVerdict", "asked_logprobs_mode", "sampler_verdict",
           "support_cuts"]
