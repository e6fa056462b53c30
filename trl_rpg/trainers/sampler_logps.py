"""The sampler's log-probs mu (`rpg_sampler_logps`): the vLLM engine's own, or recomputed by the trainer.

Notation (docs/math.md sections 1 and 4b): mu is the policy that sampled a batch, pi_old the trained policy when the
batch was generated, w = pi_theta / mu.

- `"engine"`: mu is what the engine returns for the sampled tokens (vLLM with `logprobs_mode="processed_logprobs"`:
  after temperature, the distribution sampled from). TRL's no-grad forward pass for `old_per_token_logps` does not
  run (`_compat.trl_skips_old_logps`), and TRL's correction pi_old / mu is not applied: w = pi_theta / mu is the exact
  weight against the true sampler, and RPG-Style Clip bounds it.
- `"recompute"`: mu is pi_old, recomputed by the trainer (TRL 1.16's pass); vLLM's correction pi_old / mu, when on,
  weighs every term (docs/math.md section 4b).
- `"auto"` (the default): `"engine"` exactly where it is exact (no `engine_obstacles`: no truncated sampling and no
  other generation setting that cuts or reweights the sampler, `SAMPLER_SETTINGS`; a server that reports processed
  log-probs), `"recompute"` elsewhere.

Which mu a batch trains with is recorded in the batch (`ENGINE_KEY`: present in an engine batch, holding the
optimizer step it was generated at), so a batch restored from a checkpoint keeps its own whatever the resuming run's
mode, and the loss knows when pi_theta = pi_old (`at_sampling_policy`): there log w is the train/inference mismatch
itself, logged at no cost (`mismatch_metrics`). The engine's output is checked as it arrives (`checked_output`): a
malformed one is a `MalformedEngineOutput` naming the engine; a log-prob that is not one (not finite, or above 0 by
more than `LOGPROB_ROUNDING`: a server that returns logits, say) becomes TRL's "missing" (NaN), warned about once per
run, and every such token is excluded from the loss and counted (`rpg/excluded_tokens`) wherever the loss uses the
engine's log-probs (`mu`); a run all of whose tokens were excluded trained on nothing (`trained_tokens`, read by the
learning-signal verdict).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)

MODES = ("auto", "engine", "recompute")
#: Key of a generation batch whose mu is the engine's; its 0-dim value is the optimizer step it was generated at.
ENGINE_KEY = "rpg_engine_logps_step"
PROCESSED = "processed_logprobs"
#: Generation settings, besides truncated sampling (`truncated_sampling`), that make the sampler differ
#: from the policy: each cuts the tokens vLLM may sample (`CUTS`) or reweights them (`REWEIGHTS`) unless its value is
#: neutral. A `generation_kwargs` entry (passed to vLLM's `SamplingParams`) overrides the config field of the same
#: name, as in TRL. docs/math.md section 4c lists them with their verdict; `engine_obstacles` names each one set.
CUTS, REWEIGHTS = "cuts the sampler's support", "reweights the sampler's distribution"


def truncated_sampling(args) -> list[str]:
    """The sampling settings, as `name=value`, that truncate the sampler's support: `top_p < 1`, `top_k > 0`,
    `min_p > 0` (a `generation_kwargs` entry overrides the field, as it does in TRL)."""
    kwargs = args.generation_kwargs or {}
    top_p, top_k, min_p = (kwargs.get(name, getattr(args, name)) for name in ("top_p", "top_k", "min_p"))
    cuts = (("top_p", top_p, top_p is not None and top_p < 1), ("top_k", top_k, top_k is not None and top_k > 0),
            ("min_p", min_p, bool(min_p)))
    return [f"{name}={value}" for name, value, cut in cuts if cut]


def _off(value) -> bool:
    return not value


def _no_bias(value) -> bool:
    return not value or (isinstance(value, dict) and not any(value.values()))


SAMPLER_SETTINGS: dict[str, tuple[str, object]] = {
    "min_tokens": (CUTS, _off),  # EOS and the stop tokens masked until the minimum length
    "bad_words": (CUTS, _off),  # each word's last token masked after its prefix
    "allowed_token_ids": (CUTS, _off),  # only the listed tokens
    "structured_outputs": (CUTS, lambda value: value is None),  # guided decoding: the grammar's tokens only
    "guided_decoding": (CUTS, lambda value: value is None),  # older vLLM's name for the same
    "logit_bias": (REWEIGHTS, _no_bias),  # a bias of -100 cuts
    "logits_processors": (REWEIGHTS, _off),  # whatever the processors do
    "repetition_penalty": (REWEIGHTS, lambda value: value is None or value == 1),  # GRPOConfig field, default 1.0
    "presence_penalty": (REWEIGHTS, _off),
    "frequency_penalty": (REWEIGHTS, _off),
}


def sampler_settings(args) -> dict[str, list[str]]:
    """The `SAMPLER_SETTINGS` set to a non-neutral value, as `name=value`, by effect (`CUTS`, `REWEIGHTS`):
    `vllm_structured_outputs_regex` counts as `structured_outputs`."""
    kwargs = args.generation_kwargs or {}
    found: dict[str, list[str]] = {CUTS: [], REWEIGHTS: []}
    if getattr(args, "vllm_structured_outputs_regex", None):
        found[CUTS].append(f"vllm_structured_outputs_regex={args.vllm_structured_outputs_regex!r}")
    for name, (effect, neutral) in SAMPLER_SETTINGS.items():
        value = kwargs.get(name, getattr(args, name, None))
        if not neutral(value):
            found[effect].append(f"{name}={value!r}")
    return found


#: How far above 0 an engine log-prob may be and still count as one (float rounding of a near-certain token's
#: log-softmax, a few 1e-7 in float32; 1e-4 is a probability of 1.0001, harmless in w = pi_theta/mu). Anything above
#: is not a log-prob (logits, say: `w` ~ 0.001, or TRL's correction rejecting every sequence) and is excluded.
LOGPROB_ROUNDING = 1e-4


class MalformedEngineOutput(RuntimeError):
    """The vLLM engine returned completions without one log-prob per token (or no token at all)."""


# ---------------------------------------------------------------------------------------------------------------------
# Which mu: the mode
# ---------------------------------------------------------------------------------------------------------------------


def engine_obstacles(args) -> list[str]:
    """Why, from the config alone, the engine's log-probs are not mu exactly (empty: they are, provided the engine
    reports processed log-probs, which `SamplerLogps.for_trainer` asks a server)."""
    if not args.use_vllm:
        return ["use_vllm=False: the trainer's own generation returns no log-probs"]
    reasons = []
    if args.rpg_reference != "sampling":
        reasons.append(f"rpg_reference={args.rpg_reference!r}: the reference is not the sampler, so its log-probs "
                       "still need the trainer's reference pass; 'engine' is RPG's sampler-as-reference mode")
    settings = sampler_settings(args)
    cuts = truncated_sampling(args) + settings[CUTS]
    if cuts:
        reasons.append(f"{', '.join(cuts)}: the sampler's support is not the policy's (the engine's log-probs are "
                       "renormalised over the tokens it may sample), so pi_theta/mu misses the cut probability mass "
                       "(docs/math.md section 4c)")
    if settings[REWEIGHTS]:
        reasons.append(f"{', '.join(settings[REWEIGHTS])}: the sampler's distribution is the policy's reweighted (by "
                       "the tokens already generated, or a bias), so the engine's log-probs are not the policy's at "
                       "any step: w = pi_theta/mu would count the reweighting as a policy change, and the KL term "
                       "towards the sampler would pull towards the reweighted distribution (docs/math.md section 4c)")
    return reasons


def _refusal(reasons: list[str]) -> str:
    return (f"RPGConfig: `rpg_sampler_logps`='engine' is not allowed here; it needs mu to be exactly the engine's "
            f"log-probs, and {'; and '.join(reasons)}. Use rpg_sampler_logps='recompute' (or 'auto', which picks "
            "'engine' only where it is exact).")


def check_config(args) -> None:
    """Refuse an unknown `rpg_sampler_logps`, and `"engine"` where the config alone shows it would not be exact."""
    if args.rpg_sampler_logps not in MODES:
        raise ValueError(f"RPGConfig: `rpg_sampler_logps`={args.rpg_sampler_logps!r} is not allowed; choose one of "
                         f"{list(MODES)}.")
    if args.rpg_sampler_logps == "engine" and engine_obstacles(args):
        raise ValueError(_refusal(engine_obstacles(args)))


def server_obstacle(logprobs_mode: str | None, url: str) -> str | None:
    """Why a vLLM server's log-probs are not mu (None: they are, it runs with processed log-probs). A server that
    does not report its mode (None) is taken as raw: nothing says its log-probs are the sampler's."""
    if logprobs_mode == PROCESSED:
        return None
    reported = (f"reports logprobs_mode={logprobs_mode!r}, not {PROCESSED!r}" if logprobs_mode is not None else
                "does not report its logprobs_mode (taken as raw)")
    return (f"the vLLM server at {url} {reported}: its log-probs are not known to be those of the distribution it "
            "samples from (restart it with `--logprobs-mode processed_logprobs`, as `trl vllm-serve` does)")


def server_url(args) -> str:
    """The address TRL reaches a vLLM server at (`vllm_mode="server"`)."""
    return args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"


def engine_name(args) -> str:
    """The engine in words, for errors: the colocated one, or the server's address."""
    if args.vllm_mode == "server":
        return f"the vLLM server at {server_url(args)} (vllm_mode='server')"
    return "the colocated vLLM engine (vllm_mode='colocate')"


@dataclass(frozen=True)
class SamplerLogps:
    """The resolved mode: `mode` is `"engine"` or `"recompute"`; `reason` says why `"auto"` picked `"recompute"`
    where vLLM generates (None otherwise); `engine` names the engine (None without vLLM). `warned` holds the kinds of
    bad engine log-prob already warned about in this run (`checked_output`: one warning per kind and run)."""

    mode: str
    reason: str | None = None
    engine: str | None = None
    warned: set = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def resolve(cls, args, obstacles: list[str]) -> SamplerLogps:
        """The mode of `args` given every obstacle known (`engine_obstacles` and those found at run time); an
        explicit `"engine"` with an obstacle is refused."""
        engine = engine_name(args) if args.use_vllm else None
        if args.rpg_sampler_logps == "recompute" or (args.rpg_sampler_logps == "auto" and not args.use_vllm):
            return cls("recompute", None, engine)
        if not obstacles:
            return cls("engine", None, engine)
        if args.rpg_sampler_logps == "engine":
            raise ValueError(_refusal(obstacles))
        return cls("recompute", "; ".join(obstacles), engine)

    @classmethod
    def for_trainer(cls, trainer) -> SamplerLogps:
        """The mode of a built trainer: the config's obstacles, a custom `rollout_func` (its log-probs are its
        own), and a server's logprobs mode (asked by the main process, which holds the client; one answer for all)."""
        args = trainer.args
        obstacles = engine_obstacles(args) if args.rpg_sampler_logps != "recompute" else []
        if args.use_vllm and args.rpg_sampler_logps != "recompute" and not obstacles:
            if trainer.rollout_func is not None:
                obstacles.append("a rollout_func is given: the log-probs it returns are its own, not necessarily "
                                 "the sampler's")
            elif args.vllm_mode == "server":
                from accelerate.utils import broadcast_object_list

                mode = [None]
                if trainer.accelerator.is_main_process:
                    info = trainer.vllm_generation.vllm_client.get_server_info()
                    mode = [((info or {}).get("model_config") or {}).get("logprobs_mode")]
                if trainer.accelerator.num_processes > 1:
                    broadcast_object_list(mode, from_process=0)
                obstacle = server_obstacle(mode[0], server_url(args))
                obstacles += [obstacle] if obstacle else []
        return cls.resolve(args, obstacles)

    @contextmanager
    def generating(self, trainer) -> Iterator[None]:
        """Around TRL's generation and scoring: the engine's output checked as it arrives (`checked_output`) and,
        in engine mode, no old-log-prob pass and no correction (`_compat.trl_skips_old_logps`)."""
        from .. import _compat  # TRL's trainer utilities: not loaded by `RPGConfig`, which imports this module

        with ExitStack() as stack:
            if trainer.use_vllm:
                stack.enter_context(_compat.returning_through(
                    trainer.vllm_generation, "generate", lambda output: checked_output(output, self.engine,
                                                                                      self.warned)))
            if self.mode == "engine":
                stack.enter_context(_compat.trl_skips_old_logps(trainer))
            yield

    def tag(self, batch: dict, step: int) -> dict:
        """Record in a generation batch that its mu is the engine's (engine mode), and the step it was generated at."""
        if self.mode == "engine":
            batch[ENGINE_KEY] = torch.tensor(step)
        return batch


# ---------------------------------------------------------------------------------------------------------------------
# The engine's output
# ---------------------------------------------------------------------------------------------------------------------


def checked_output(output: tuple, engine: str | None, warned: set | None = None) -> tuple:
    """`VLLMGeneration.generate`'s `(prompt_ids, completion_ids, logprobs, logprob_token_ids)`, checked: every
    completion has at least one token and one non-empty list of log-probs per token (the sampled token's first), else
    `MalformedEngineOutput` naming the engine. A sampled token's log-prob that is not finite, or above 0 by more than
    `LOGPROB_ROUNDING`, becomes None, TRL's "missing" (NaN in its tensor: no correction from it, and excluded from the
    loss by `mu`), with a warning the first time each kind is met (`warned` holds the kinds warned about: one warning
    per run; None: every time)."""
    prompt_ids, completion_ids, logprobs, token_ids = output

    def malformed(detail: str) -> MalformedEngineOutput:
        return MalformedEngineOutput(
            f"RPGTrainer: the output of {engine or 'the vLLM engine'} is malformed: {detail}. Each completion must "
            "hold at least one token and one log-prob per token (TRL asks vLLM for logprobs=0: the sampled token's), "
            "or no token can be paired with the probability it was sampled with; check the engine's vLLM version "
            "against TRL's (`trl vllm-serve`) and that nothing rewrites its response.")

    if logprobs is None:
        raise malformed(f"it returned {len(completion_ids)} completions and no log-probs")
    if len(logprobs) != len(completion_ids):
        raise malformed(f"it returned {len(completion_ids)} completions and {len(logprobs)} lists of log-probs")
    fixed, bad = list(logprobs), {"non-finite": 0, "above 0": 0}
    for i, (ids, values) in enumerate(zip(completion_ids, logprobs)):
        if len(ids) == 0:
            raise malformed(f"completion {i} of {len(completion_ids)} is empty (no token)")
        if len(values) != len(ids):
            raise malformed(f"completion {i} of {len(completion_ids)} has {len(ids)} tokens and {len(values)} "
                            "log-probs")
        if not all(values):
            raise malformed(f"completion {i} of {len(completion_ids)} has a token without a log-prob")
        try:
            kinds = [_kind(None if top[0] is None else float(top[0])) for top in values]
        except (TypeError, ValueError) as error:
            raise malformed(f"completion {i} of {len(completion_ids)} has a log-prob that is not a number "
                            f"({error})") from None
        if any(kinds):
            for kind in filter(None, kinds):
                bad[kind] += 1
            fixed[i] = [[None, *top[1:]] if kind else top for kind, top in zip(kinds, values)]
    for kind, count in bad.items():
        if count and (warned is None or kind not in warned):
            logger.warning(_BAD_LOGPROBS[kind], engine or "the vLLM engine", count)
            if warned is not None:
                warned.add(kind)
    return prompt_ids, completion_ids, fixed, token_ids


def _kind(value: float | None) -> str | None:
    """What is wrong with a sampled token's engine log-prob (None: nothing, or already missing)."""
    if value is None:
        return None
    if not math.isfinite(value):
        return "non-finite"
    return "above 0" if value > LOGPROB_ROUNDING else None


_EXCLUDED = ("those tokens are excluded from the loss wherever it uses the engine's log-probs (engine mode, or TRL's "
             "correction pi_old/mu) and counted in rpg/excluded_tokens; a run all of whose tokens are excluded trains "
             "on nothing (rpg/trained_on_nothing). Warned once per run.")
_BAD_LOGPROBS = {
    "non-finite": "RPGTrainer: %s returned %d non-finite log-prob(s) of sampled tokens in this batch; " + _EXCLUDED,
    "above 0": ("RPGTrainer: %s returned %d log-prob(s) of sampled tokens above 0 (by more than "
                f"{LOGPROB_ROUNDING}) in this batch: not log-probs (a server that returns logits or raw scores?); "
                + _EXCLUDED),
}


def trained_tokens(batch: dict, mask: torch.Tensor) -> torch.Tensor:
    """The (B, T) loss `mask` of a generation batch less the tokens the loss will exclude for their engine log-prob
    (missing: NaN), where the loss uses it (`mu`: an engine batch, or TRL's correction on); what the learning-signal
    verdict counts as trained on."""
    engine = batch.get("sampling_per_token_logps")
    if engine is None or not (ENGINE_KEY in batch or "importance_sampling_ratio" in batch):
        return mask
    return mask * torch.isfinite(engine).to(mask.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# The loss: mu, and the mismatch where pi_theta = pi_old
# ---------------------------------------------------------------------------------------------------------------------


def mu(inputs: dict, recomputed: torch.Tensor) -> torch.Tensor:
    """The (B, T) sampler log-probs a micro-batch trains with: the engine's in an engine batch; else `recomputed`
    (pi_old, or the current log-probs on-policy), NaN where TRL's correction read no finite engine log-prob. A NaN
    token is excluded from the loss and counted by the objective (`rpg_per_token_loss`)."""
    engine = inputs.get("sampling_per_token_logps")
    if ENGINE_KEY in inputs:
        return engine
    if engine is not None and "importance_sampling_ratio" in inputs:
        return recomputed.masked_fill(~torch.isfinite(engine), math.nan)
    return recomputed


def at_sampling_policy(inputs: dict, global_step: int) -> bool:
    """True for an engine batch trained at the optimizer step it was generated at: pi_theta = pi_old there."""
    return ENGINE_KEY in inputs and int(inputs[ENGINE_KEY]) == global_step


#: The mismatch metrics, and TRL's names for the same quantity (logged by TRL's correction in recompute mode).
MISMATCH_METRICS = ("rpg/sampler_mismatch_mean", "rpg/sampler_mismatch_max", "rpg/sampler_mismatch_kl")


def mismatch_metrics(logps: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, gather) -> dict[str, float]:
    """Where pi_theta = pi_old, over every process's valid tokens (one `gather`): `rpg/sampler_mismatch_mean` and
    `_max`, the mean and largest |log pi_old - log mu| per token (also under TRL's `sampling/sampling_logp_difference/
    mean` and `/max`), and `_kl`, KL(mu || pi_old) per token (the k3 estimate w - 1 - log w, unbiased under mu).
    Empty when no process has a valid token."""
    log_w = logps.detach().float() - sampler.detach().float()
    valid = (mask != 0) & torch.isfinite(log_w)
    log_w = torch.where(valid, log_w, torch.zeros_like(log_w))
    bounded = log_w.clamp(max=20.0)  # exp bounded above only (docs/math.md section 3, numerics)
    local = torch.stack([log_w.abs().sum(), (bounded.exp() - 1 - bounded).sum(), valid.sum().float(),
                         log_w.abs().amax() if log_w.numel() else log_w.new_zeros(())])
    totals = gather(local.unsqueeze(0)).reshape(-1, local.numel())
    tokens = float(totals[:, 2].sum())
    if tokens == 0:
        return {}
    mean, largest = float(totals[:, 0].sum()) / tokens, float(totals[:, 3].max())
    return {"rpg/sampler_mismatch_mean": mean, "rpg/sampler_mismatch_max": largest,
            "rpg/sampler_mismatch_kl": float(totals[:, 1].sum()) / tokens,
            "sampling/sampling_logp_difference/mean": mean, "sampling/sampling_logp_difference/max": largest}


__all__ = ["CUTS", "ENGINE_KEY", "LOGPROB_ROUNDING", "MISMATCH_METRICS", "MODES", "REWEIGHTS", "SAMPLER_SETTINGS",
           "MalformedEngineOutput", "SamplerLogps", "at_sampling_policy", "check_config", "checked_output",
           "engine_name", "engine_obstacles", "mismatch_metrics", "mu", "sampler_settings", "server_obstacle",
           "server_url", "trained_tokens", "truncated_sampling"]
