"""What a resolved `RPGConfig` trains, said to the user: the batch layout TRL runs (`BatchLayout`), the start-up
line (`describe_objective`) and the construction warnings for a KL term that is inert by construction, for truncated
sampling where a term relies on the sampler's support, and for GRPOConfig fields RPG ignores set to non-defaults.

Pure functions of the config's fields (any object with `RPGConfig`'s attributes): nothing here imports TRL or
`trl_rpg.trainers.config`, which calls the warnings from `RPGConfig.__post_init__`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from torch import nn

from ..objectives.per_token import get_divergence
from ..run.reward_scale import startup_note
from ..upgrade.grpo_fields import GRPO_FIELDS
from .sampler_logps import engine_obstacles, truncated_sampling


@dataclass(frozen=True)
class BatchLayout:
    """How TRL 1.16's `GRPOTrainer` walks its generation batches (`_prepare_inputs`), over one period of the schedule.

    Micro-batch `i = 0, 1, ...` (one `training_step`) trains on slice `i % steps_per_generation` of the batch generated
    at micro-batch `G * (i // G)`, `G = steps_per_generation * num_iterations` (each batch is consumed
    `num_iterations` times), and an optimizer step closes every `gradient_accumulation_steps` micro-batches. A
    micro-batch is off-policy (`w != 1` possible) when an optimizer step closed between its batch's generation and
    itself. The pattern repeats every `lcm(G, gradient_accumulation_steps)` micro-batches.
    """

    generate_every: int  #: G, micro-batches per generation batch
    accumulation: int  #: micro-batches per optimizer step
    micro_batches: int  #: one period
    off_policy: int  #: off-policy micro-batches in one period

    @property
    def optimizer_steps_per_generation(self) -> int | None:
        """Optimizer steps each generation batch is trained on, when every batch spans whole steps (else None)."""
        return self.generate_every // self.accumulation if self.generate_every % self.accumulation == 0 else None

    def describe(self, args) -> str:
        fields = (f"steps_per_generation={args.steps_per_generation}, num_iterations={args.num_iterations}, "
                  f"gradient_accumulation_steps={args.gradient_accumulation_steps}")
        steps = self.optimizer_steps_per_generation
        if steps is not None:
            use = f"each generation batch used for {steps} optimizer step(s)"
        elif self.accumulation % self.generate_every == 0:
            use = (f"each optimizer step trains on {self.accumulation // self.generate_every} whole generation "
                   "batches")
        else:
            use = (f"a generation batch every {self.generate_every} micro-batches, an optimizer step every "
                   f"{self.accumulation}")
        if self.off_policy == 0:
            policy = "every micro-batch on-policy"
        else:
            policy = f"{self.off_policy} of every {self.micro_batches} micro-batches off-policy"
        return f"{use}, {policy} ({fields})"


def batch_layout(args) -> BatchLayout:
    """The `BatchLayout` of a resolved config (after `GRPOConfig.__post_init__`)."""
    generate_every = args.steps_per_generation * args.num_iterations
    accumulation = args.gradient_accumulation_steps
    return BatchLayout(generate_every, accumulation, math.lcm(generate_every, accumulation),
                       off_policy_micro_batches(generate_every, accumulation))


def off_policy_micro_batches(generate_every: int, accumulation: int) -> int:
    """The off-policy micro-batches in one period of `BatchLayout` (`G = generate_every`, `A = accumulation`), in
    closed form: the same for any sizes (a loop over the period, `lcm(G, A)`, never ends for co-prime large ones).

    The batch generated at micro-batch `s = kG` is on-policy until the next optimizer step closes, for
    `min(G, A - s mod A)` of its `G` micro-batches; the rest are off-policy. Over one period the offsets `s mod A`
    run once through every multiple `j * g` of `g = gcd(G, A)` below `A`, so the count is
    `sum_{j < A/g} max(0, G - A + j g)`: with `G >= A`, `n (G - A) + g n (n - 1) / 2` for `n = A / g`; with
    `G < A`, the terms with `j g > A - G`, `g n (n + 1) / 2` for `n = G / g - 1`.
    """
    g = math.gcd(generate_every, accumulation)
    if generate_every >= accumulation:
        n = accumulation // g
        return n * (generate_every - accumulation) + g * n * (n - 1) // 2
    n = generate_every // g - 1
    return g * n * (n + 1) // 2


def inert_kl_reason(args) -> str | None:
    """Why the KL term has zero expected gradient by construction (None when it can act): `beta > 0` and
    `log(pi/ref) = 0` at every token, because the reference is the sampler and every micro-batch is on-policy
    (`w = 1`), or because the reference is refreshed to the policy after every optimizer step (docs/math.md sec. 2)."""
    if args.beta <= 0:
        return None
    if args.rpg_reference == "sampling" and batch_layout(args).off_policy == 0:
        return ("With rpg_reference='sampling' the reference is the policy that sampled each batch, and no optimizer "
                f"step falls between a batch's generation and its use ({batch_layout(args).describe(args)}), so w = 1")
    if args.rpg_reference == "periodic" and args.rpg_reference_update_steps == 1:
        return ("With rpg_reference='periodic' and rpg_reference_update_steps=1 the reference is refreshed to the "
                "policy after every optimizer step, so pi = pi_ref at every micro-batch")
    return None


def kl_term_is_inert(args) -> bool:
    """True when log(pi/ref) = 0 at every token by construction (`inert_kl_reason`); what beta then does, per
    divergence and estimator, is `inert_kl_effect`."""
    return inert_kl_reason(args) is not None


#: What beta does where the layout makes log(pi/ref) = 0 at every token (`inert_kl_effect`), docs/math.md sections
#: 2 and 3: nothing (`EXACTLY_ZERO`, `ZERO_IN_EXPECTATION`), or something nobody asked for (the others).
EXACTLY_ZERO, ZERO_IN_EXPECTATION, CLIP_ONLY = "exactly zero", "zero in expectation", "through the clip only"
LENGTH_BIAS, MISMATCH, DROPOUT = "a length bias", "the train/inference mismatch", "dropout in the training forward"


def engine_is_mu(args, sampler=None) -> bool:
    """Whether mu (and, with the sampler as reference, the reference) is the vLLM engine's log-probs: the resolved
    `sampler` says (`sampler_logps.SamplerLogps`); without one, whether `rpg_sampler_logps` picks the engine from the
    config alone (a server's reported log-prob mode, known only to the trainer, may still make it recompute)."""
    if sampler is not None:
        return sampler.mode == "engine"

    return bool(args.use_vllm) and args.rpg_sampler_logps != "recompute" and not engine_obstacles(args)


def dropout_matters(args) -> bool:
    """Whether dropout in the training forward would make log(pi/ref) != 0 where the layout makes it 0: against a
    reference refreshed every step (its pass runs without dropout, `reference.without_dropout`), and against a sampler
    whose log-probs come from another pass (vLLM: TRL's recomputation or the engine). With the sampler as reference
    and no vLLM, mu is the training forward's own log-probs (TRL keeps no old log-probs on-policy): w = 1 exactly."""
    return args.rpg_reference == "periodic" or bool(args.use_vllm)


def training_dropout(model) -> list[str]:
    """Where dropout acts in `model`'s training forward: `nn.Dropout` modules with p > 0 (the model's own, the active
    LoRA adapter's `lora_dropout`: not RPG's frozen "ref" copy, which never trains) and a config `attention_dropout`
    > 0 (read from `self.training`, which TRL's `disable_dropout` leaves alone). Empty: the training forward is
    deterministic."""
    active = getattr(model, "active_adapter", "default")
    active = {active} if isinstance(active, str) else set(active)
    found = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            owner, _, adapter = name.rpartition(".")
            if owner.endswith("lora_dropout"):
                if adapter in active:
                    found.add(f"lora_dropout={module.p}")
            else:
                found.add(f"model dropout p={module.p}")
    configs = {id(c): c for c in (getattr(m, "config", None) for m in model.modules()) if c is not None}
    found |= {f"attention_dropout={c.attention_dropout}" for c in configs.values()
              if isinstance(getattr(c, "attention_dropout", None), (int, float)) and c.attention_dropout > 0}
    return sorted(found)


def inert_kl_effect(args, sampler=None, dropout: bool = False) -> str | None:
    """What beta does where the layout makes the KL term inert (`inert_kl_reason`; None where it can act anyway).

    First what makes pi_theta in the training forward differ from its reference all the same: mu (the reference) from
    the vLLM engine (`MISMATCH`: w = pi_theta/mu_engine != 1 on-policy, beta pulls towards the engine's distribution)
    and `dropout` on in the training forward where it matters (`DROPOUT`, `dropout_matters`). Else, at r = 1, every KL
    part is `beta * w * h(1)`: UFKL and URKL have h(1) = 0, `EXACTLY_ZERO`. FKL and RKL have `+-beta * w`: with the
    REINFORCE estimator on reused batches the clip keeps each token by the sign of A' = A +- beta (`CLIP_ONLY`);
    elsewhere its mean under the sampler is 0 per token, but the batch loss weighs each token by 1/N, and only a fixed
    N (`loss_type="dr_grpo"`) keeps it 0 (`ZERO_IN_EXPECTATION`): with N the completion's or the batch's token count
    the constant is `LENGTH_BIAS` (FKL shortens completions, RKL lengthens them; docs/math.md section 3)."""
    if not kl_term_is_inert(args):
        return None
    if args.rpg_reference == "sampling" and engine_is_mu(args, sampler):
        return MISMATCH
    if dropout and dropout_matters(args):
        return DROPOUT
    if args.rpg_divergence in ("ufkl", "urkl"):
        return EXACTLY_ZERO
    if args.rpg_estimator == "reinforce" and batch_layout(args).off_policy > 0:
        return CLIP_ONLY
    return ZERO_IN_EXPECTATION if args.loss_type == "dr_grpo" else LENGTH_BIAS


def _length_bias_text(args) -> str:
    way = "shorter" if args.rpg_divergence == "fkl" else "longer"
    sign = "+" if args.rpg_divergence == "fkl" else "-"
    return (f"under loss_type={args.loss_type!r} each token's loss is divided by a count that depends on the sampled "
            f"completions, so its constant {sign}beta*w per token (rpg_divergence={args.rpg_divergence!r}) is a "
            f"length bias towards {way} completions (by exact enumeration up to 61% (dapo) and 115% (grpo) of the "
            "reward term's gradient at beta=1; docs/math.md section 3, Normalisation); loss_type='dr_grpo' (a fixed "
            "normaliser) or rpg_divergence='ufkl'/'urkl' (no constant part) removes it")


_MISMATCH_TEXT = ("but mu, and with it the reference, is the vLLM engine's log-probs (rpg_sampler_logps="
                  "{mode!r}): they differ from the trainer's by the train/inference mismatch, so w = pi_theta/mu != 1 "
                  "on-policy and beta pulls the policy towards the engine's distribution (logged as "
                  "rpg/sampler_mismatch_*); rpg_sampler_logps='recompute' removes it")
_DROPOUT_TEXT = ("but dropout is on in the training forward ({where}; disable_dropout={disable}), so the policy that "
                 "trains is not its reference and beta acts; disable_dropout=True (and a model config attention_"
                 "dropout of 0, which disable_dropout does not reach) removes it")
#: Where dropout is not known yet (the config, before the model): the proviso of an inert claim.
_DROPOUT_PROVISO = (" This holds only without dropout in the training forward: with disable_dropout=False and a model "
                    "or LoRA adapter with dropout > 0 (RPGTrainer checks the model and warns), beta acts; set "
                    "disable_dropout=True.")


def inert_kl_warning(args, sampler=None, dropout: list[str] | None = None) -> str:
    """The construction warning for a KL term that the layout makes inert (`inert_kl_reason`), saying what beta does
    there (`inert_kl_effect`); `dropout` (where it acts, `training_dropout`; None: not known yet, the config's own
    warning) decides the dropout case."""
    effect = inert_kl_effect(args, sampler, bool(dropout))
    divergence = f"rpg_divergence={args.rpg_divergence!r}"
    head = f"beta={args.beta} regularises nothing here"
    if effect == CLIP_ONLY:
        head = f"beta={args.beta} regularises towards nothing here, yet changes the gradient"
        what = (f"with {divergence} the KL part of every token's gradient is +-beta*w, whose mean under the sampler "
                "is 0 only without the clip: RPG-Style Clip keeps or drops each token outside the trust region by the "
                "sign of A' = A +- beta (rpg_estimator='reinforce'), so the run trains neither as with beta=0 nor "
                "towards a reference (docs/math.md section 3)")
    elif effect in (LENGTH_BIAS, MISMATCH, DROPOUT):
        head = f"beta={args.beta} regularises towards nothing you asked for here, yet changes the training"
        what = {LENGTH_BIAS: _length_bias_text(args),
                MISMATCH: _MISMATCH_TEXT.format(mode=args.rpg_sampler_logps),
                DROPOUT: _DROPOUT_TEXT.format(where=", ".join(dropout or []), disable=args.disable_dropout)}[effect]
        what += "; the run does not train as with beta=0"
    elif effect == EXACTLY_ZERO:
        what = (f"with {divergence} the KL part of every token's gradient is 0 and the run trains exactly as with "
                "beta=0")
    else:
        what = (f"with {divergence} the KL part of every token's gradient is +-beta*w, whose mean under the sampler "
                "is 0 (every token inside the trust region, or the differentiable estimator's unclipped KL term) and "
                "loss_type='dr_grpo' divides every token by the same count, so the run trains as with beta=0 in "
                "expectation")
    proviso = (_DROPOUT_PROVISO if dropout is None and effect in (EXACTLY_ZERO, ZERO_IN_EXPECTATION)
               and dropout_matters(args) and not args.disable_dropout else "")
    return (f"RPGConfig: {head}. {inert_kl_reason(args)} and log(pi/ref) = 0 at every token of the trainer's "
            f"forward: {what}.{proviso} Reuse each batch for several optimizer steps (rpg_generation_reuse > 1, "
            "steps_per_generation > gradient_accumulation_steps or num_iterations > 1) with the sampler as reference, "
            "or regularise towards a fixed or slower-moving policy (rpg_reference='initial', 'periodic' with "
            "rpg_reference_update_steps > 1, or 'adaptive').")


def dropout_warning(args, sampler, model) -> str | None:
    """The trainer's construction warning where dropout in `model`'s training forward makes beta act although the
    layout makes the KL term inert (None elsewhere); what the config could not know."""
    where = training_dropout(model)
    if inert_kl_effect(args, sampler, bool(where)) != DROPOUT:
        return None
    return inert_kl_warning(args, sampler, where).replace("RPGConfig:", "RPGTrainer:", 1)


def truncated_sampling_warning(args) -> str | None:
    """The construction warning for truncated sampling where a term relies on the sampler's support: vLLM's
    importance-sampling correction (or TRL's off-policy mask, which reads vLLM's log-probs), or a reference other
    than the sampler (docs/math.md section 4c); None when neither applies."""
    cuts = truncated_sampling(args)
    corrected = args.use_vllm and (args.vllm_importance_sampling_correction
                                   or args.off_policy_mask_threshold is not None)
    regularised = args.beta > 0 and args.rpg_reference != "sampling"
    if not cuts or not (corrected or regularised):
        return None
    reasons = []
    if corrected:
        reasons.append("vLLM's log-probs are renormalised over the kept tokens (logprobs_mode='processed_logprobs') "
                       "while the trainer's cover the whole vocabulary, so the ratio pi_old/mu of "
                       "vllm_importance_sampling_correction (and off_policy_mask_threshold's test) carries the kept "
                       "probability mass at every token, a factor below 1 that is no policy change")
    if regularised:
        reasons.append(f"the KL term towards rpg_reference={args.rpg_reference!r} is estimated on the kept tokens "
                       "only: the divergence the policy builds on the cut tokens is never seen")
    return (f"RPGConfig: {', '.join(cuts)} truncates sampling: the sampler never proposes the tokens it cuts, which "
            "the policy still gives probability, and no importance weight can correct for a token never sampled. Here "
            f"{'; and '.join(reasons)}. Train with top_p=1.0, top_k=0 and min_p=None (truncate at evaluation only), "
            "or turn off what relies on the sampler's support (vllm_importance_sampling_correction=False, "
            "rpg_reference='sampling'); see docs/math.md section 4c.")


def ignored_fields_warning(args) -> str | None:
    """The construction warning for GRPOConfig fields RPG ignores (`grpo_fields.GRPO_FIELDS`, verdict "ignored")
    set to a value other than their default, naming each with its value and why; None when there is none."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    set_fields = [f"`{name}`={getattr(args, name)!r} ({rule.reason})" for name, rule in GRPO_FIELDS.items()
                  if rule.verdict == "ignored" and hasattr(args, name) and getattr(args, name) != defaults.get(name)]
    if not set_fields:
        return None
    return (f"RPGConfig: RPG ignores these GRPOConfig fields, set here to a value other than their default: "
            f"{'; '.join(set_fields)}. They have no effect on this run (docs/drop-in.md).")


#: Below this beta the KL term cannot act against std-normalised advantages (|A| ~ 1): on the toy task
#: (benchmarks/beta_effect.py, docs/benchmarks.md "How small a beta acts") beta = 1e-4 moved the trained parameters
#: by at most 0.04% of the beta = 0 run's movement, over 3 seeds, URKL and UFKL, both estimators, sampler and periodic
#: reference; beta = 1e-3 by 0.02-1.1%; beta = 0.1 by 2-7%, beta = 1 by 13-37%.
BETA_ACTS_FROM = 1e-3


def beta_too_small_warning(args, name: str = "RPGConfig") -> str | None:
    """The construction warning for 0 < beta < `BETA_ACTS_FROM` under std-normalised advantages (`scale_rewards`
    other than "none"/False; a config without the field, `AsyncRPGConfig`, always divides by the std); None where
    beta is 0, large enough, the advantages keep the reward's scale, or the KL term is inert by construction
    (`inert_kl_warning` says so instead; an asynchronous config has no batch layout: its samples are stale)."""
    if not 0 < args.beta < BETA_ACTS_FROM:
        return None
    if getattr(args, "scale_rewards", "group") in ("none", False):
        return None
    if hasattr(args, "steps_per_generation") and kl_term_is_inert(args):
        return None
    return (f"{name}: beta={args.beta} is below {BETA_ACTS_FROM}, too small to act: the advantages are divided by "
            "the reward std (|A| ~ 1): on the toy task beta=1e-4 moved the trained parameters by at most 0.04% of the "
            "beta=0 run's movement, 1e-3 by up to ~1% (docs/benchmarks.md section 8). This run trains, in effect, "
            "with beta=0. Set a larger beta (0.1-1 measurably acts there: 2-37%) or beta=0 to say so.")


_REFERENCE_TEXT = {
    "sampling": "the policy that sampled each batch",
    "initial": "the policy at the start of training, fixed",
    "periodic": "updated to the policy every {rpg_reference_update_steps} optimizer steps",
    "adaptive": "updated when the divergence average exceeds {rpg_reference_kl_target}",
}


_ADVANTAGE_TEXT = {"none": "reward - group mean", "group": "(reward - group mean) / group std",
                   "batch": "(reward - group mean) / batch std"}


def _scale_clause(args) -> str:
    """The start-up line's note on an advantage not divided by the std (`reward_scale.startup_note`)."""
    note = startup_note(args.scale_rewards, args.multi_objective_aggregation)
    return f": {note}" if note else ""


def objective_text(args) -> str:
    """What both trainers' start-up lines say first: the objective, its divergence, estimator and beta."""
    title = get_divergence(args.rpg_divergence).title
    return (f"optimising E[A] - beta*D with D = {title} (rpg_divergence={args.rpg_divergence!r}), "
            f"rpg_estimator={args.rpg_estimator!r}, beta={args.beta}")


def clip_text(args) -> str:
    """The trust region and the dual-clip bound, as both trainers' start-up lines say them."""
    dual = "no dual clip" if args.rpg_dual_clip_c is None else f"dual clip c={args.rpg_dual_clip_c}"
    return f"clip [1 - {args.epsilon}, 1 + {args.epsilon_high}] with {dual}"


def describe_objective(args, sampler=None, precision: str | None = None, dropout: list[str] | None = None) -> str:
    """One line saying what a run optimises: divergence, estimator, beta, reference schedule, batch reuse, clip
    widths, advantage scaling, and whether the settings make it train as `GRPOTrainer` would; with vLLM generation,
    what mu is (`sampler`, a resolved `trl_rpg.trainers.sampler_logps.SamplerLogps`: `sampler_clause`); then the
    `precision`
    it trains in, when given (`trl_rpg.trainers.precision.precision_clause`). `dropout`: where dropout acts in the
    training
    forward (`training_dropout`), which can make beta act (`inert_kl_effect`)."""
    engine = sampler is not None and sampler.mode == "engine"
    line = (f"RPGTrainer: {objective_text(args)}, reference: "
            f"{_REFERENCE_TEXT[args.rpg_reference].format(**vars(args))} (rpg_reference={args.rpg_reference!r}); "
            f"{batch_layout(args).describe(args)}; {clip_text(args)}; "
            f"advantages: {_advantage_text(args)}; loss_type={args.loss_type!r}.")
    if args.beta == 0 and args.rpg_estimator == "differentiable" and args.rpg_dual_clip_c is None:
        line += (" With beta=0, the differentiable estimator and no dual clip this trains exactly as GRPOTrainer."
                 if not engine else " With beta=0, the differentiable estimator and no dual clip this is GRPO's "
                 "objective with mu = the engine's log-probs (rpg_sampler_logps='recompute' trains exactly as "
                 "GRPOTrainer).")
    elif args.beta == 0:
        line += " beta=0: no KL regularisation."
    elif kl_term_is_inert(args):
        why = ("reference = sampler, every micro-batch on-policy" if args.rpg_reference == "sampling" else
               "reference refreshed to the policy after every optimizer step")
        effect = inert_kl_effect(args, sampler, bool(dropout))
        acts = {CLIP_ONLY: "its +-beta*w changes which tokens the clip keeps",
                LENGTH_BIAS: f"its +-beta*w is a length bias under loss_type={args.loss_type!r} "
                             f"({'FKL: shorter' if args.rpg_divergence == 'fkl' else 'RKL: longer'} completions; "
                             "loss_type='dr_grpo' removes it)",
                MISMATCH: "mu and the reference are the engine's log-probs, so the train/inference mismatch makes "
                          "w != 1 and beta pulls towards the engine's distribution (rpg_sampler_logps='recompute' "
                          "removes it)",
                DROPOUT: f"dropout is on in the training forward ({', '.join(dropout or [])}), so the policy is not "
                         "its reference (disable_dropout=True removes it)"}
        line += {EXACTLY_ZERO: f" The KL term is 0 at every token here ({why}): the run trains as with beta=0.",
                 ZERO_IN_EXPECTATION: f" The KL term has zero expected gradient here ({why}).",
                 }.get(effect, f" The KL term regularises towards nothing here ({why}), but {acts.get(effect)}: not "
                               "the same as beta=0.")
    line += sampler_clause(args, sampler)
    if precision:
        line += f" Precision: {precision}."
    return line


def describe_async_objective(args) -> str:
    """`AsyncRPGTrainer`'s start-up line: the objective, the reference (the sampler of each sample), the staleness
    allowed, the clip, the advantages and the loss, and whether the settings make it train as `AsyncGRPOTrainer`."""
    line = (f"AsyncRPGTrainer: {objective_text(args)}, reference: the policy version that sampled each sample "
            f"(rpg_reference='sampling', rho = 1; w = pi_theta/mu exact at any staleness); samples at most "
            f"max_staleness={args.max_staleness} versions old, weights synced every weight_sync_steps="
            f"{args.weight_sync_steps} optimizer step(s); {clip_text(args)}; advantages: the rollout worker's "
            "((reward - group mean) / group std); loss: token mean over each micro-batch's trained tokens (TRL's).")
    if args.beta == 0 and args.rpg_dual_clip_c is None:
        line += " With beta=0 and no dual clip this trains as AsyncGRPOTrainer (the PPO clip's gradient)."
    elif args.beta == 0:
        line += " beta=0: no KL regularisation."
    return line


def sampler_clause(args, sampler) -> str:
    """What mu is under vLLM generation (empty without vLLM): the engine's own log-probs, with the
    `vllm_importance_sampling_*` fields inert, or pi_old recomputed with TRL's correction (and why 'auto' chose it)."""
    if sampler is None or sampler.engine is None:
        return ""
    if sampler.mode == "engine":
        return (" Sampler log-probs mu: those vLLM returned for the sampled tokens (rpg_sampler_logps='engine'): no "
                "recomputation pass, one weight w = pi_theta/mu against the true sampler (bounded by the clip); "
                "vllm_importance_sampling_correction, _mode, _clip_min and _clip_max have no effect; the "
                "train/inference mismatch is logged as rpg/sampler_mismatch_*.")
    why = f" ('auto' chose it: {sampler.reason})" if sampler.reason else ""
    mode = args.vllm_importance_sampling_mode
    correction = (f"vLLM's correction pi_old/mu (vllm_importance_sampling_mode={mode!r}) weighs every term"
                  if args.vllm_importance_sampling_correction else
                  "vllm_importance_sampling_correction=False: the sampler mismatch is not corrected")
    return (f" Sampler log-probs mu: pi_old recomputed by the trainer (rpg_sampler_logps='recompute'{why}); "
            f"{correction}.")


def _advantage_text(args) -> str:
    """What the advantages are, as TRL 1.16 computes them (`GRPOTrainer._generate_and_score_completions`)."""
    if args.multi_objective_aggregation == "normalize_then_sum":
        return ("each reward function's (reward - group mean) / group std, weighted and summed, then minus the batch "
                "mean and divided by the batch std (multi_objective_aggregation='normalize_then_sum'; scale_rewards="
                f"{args.scale_rewards!r} has no effect)")
    return (f"{_ADVANTAGE_TEXT.get(args.scale_rewards, 'reward - group mean, scaled')} (scale_rewards="
            f"{args.scale_rewards!r}{_scale_clause(args)})")


__all__ = ["BETA_ACTS_FROM", "CLIP_ONLY", "DROPOUT", "EXACTLY_ZERO", "LENGTH_BIAS", "MISMATCH", "ZERO_IN_EXPECTATION",
           "BatchLayout", "batch_layout", "beta_too_small_warning", "clip_text", "describe_async_objective",
           "describe_objective", "dropout_matters",
           "dropout_warning", "engine_is_mu", "ignored_fields_warning", "inert_kl_effect", "inert_kl_reason",
           "inert_kl_warning", "kl_term_is_inert", "objective_text", "off_policy_micro_batches", "sampler_clause",
           "training_dropout", "truncated_sampling_warning"]
