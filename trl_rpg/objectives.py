"""RPG objectives: per-token surrogate losses whose gradient is exactly that of a KL-regularised objective.

Torch only; nothing here imports TRL. The formulas follow ``rpg-math.md`` (sections 2 and 3), which restates
Zhang et al., "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning" (ICLR 2026,
arXiv:2505.17508), Tables 1, 2 and 4, Proposition 4.1, Appendix F and Algorithms 1-2, with the sampling policy
``mu`` and the reference ``pi_ref`` decoupled.

Notation (per completion token)::

    log w   = logp - logmu            importance ratio of the current policy to the sampler
    log rho = logref - logmu          exactly 0 when the reference IS the sampling policy
    log r   = logp - logref = log w - log rho
    A       = baselined reward advantage

Every objective ``J = E_pi[A] - beta * D`` has an off-policy gradient of the form ``E_mu[Weight * grad logp]``
with ``Weight = w * A + C_KL``. Each (divergence, estimator) pair is a small function registered by name in
:data:`OBJECTIVES`; :func:`rpg_per_token_loss` validates the inputs, handles masking, non-finite values and
numerics, and dispatches. A new variant is one function plus one decorator line.

Numerics: all arithmetic runs in at least float32 (bfloat16/float16 inputs are upcast). Log-ratios are clamped to
``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]`` (= +-20, so ``w <= 4.9e8``) before any ``exp``; beyond the bound the
ratio saturates and, for the fully differentiable estimators, its gradient through ``w`` is zero. With the bound,
products such as ``w * log r`` stay below ~2e10, far from float32/bfloat16 overflow, so the loss and its gradient
stay finite for any input log-ratio (tested up to |log w| = 80).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


__all__ = [
    "DIVERGENCES",
    "ESTIMATORS",
    "LOG_RATIO_BOUND",
    "OBJECTIVES",
    "ObjectiveInputs",
    "divergence_value",
    "register_objective",
    "rpg_per_token_loss",
]

DIVERGENCES = ("fkl", "rkl", "ufkl", "urkl")
ESTIMATORS = ("reinforce", "differentiable")

#: Log-ratios (log w, log rho) are clamped to +-LOG_RATIO_BOUND before exponentiation.
LOG_RATIO_BOUND = 20.0


@dataclass
class ObjectiveInputs:
    """Per-token quantities handed to a registered objective. All tensors are (B, T) in the compute dtype.

    ``logp``, ``log_w`` and ``w`` carry the gradient; ``log_rho``, ``rho`` and ``adv`` are constants.
    ``clip`` is None (no clipping) or ``(eps_low, eps_high, dual_clip_c)`` with ``dual_clip_c`` possibly None.
    """

    logp: torch.Tensor
    log_w: torch.Tensor
    w: torch.Tensor
    log_rho: torch.Tensor
    rho: torch.Tensor
    adv: torch.Tensor
    beta: float
    clip: tuple[float, float, float | None] | None

    @property
    def log_r(self) -> torch.Tensor:
        """log(pi_theta / pi_ref) = log w - log rho (carries the gradient)."""
        return self.log_w - self.log_rho


#: Registry of per-token objectives: (divergence, estimator) -> fn(ObjectiveInputs) -> (loss, clip_regions).
#: ``clip_regions`` is a dict of boolean (B, T) tensors {"high", "low", "dual"} marking tokens in each
#: zero-gradient region of the clip table, or None when clipping is off.
OBJECTIVES: dict[tuple[str, str], Callable] = {}


def register_objective(divergence: str, estimator: str):
    """Decorator registering a per-token objective under ``(divergence, estimator)`` (verl's registry style)."""

    def decorator(fn):
        OBJECTIVES[(divergence, estimator)] = fn
        return fn

    return decorator


# --------------------------------------------------------------------------------------------------------------
# Divergence values (rpg-math.md section 2, "Values of the divergence itself"). Each is a per-token quantity whose
# mean under mu estimates D; written so that, with the gradient flowing through w and log r, beta times it is also
# the fully differentiable KL surrogate (Table 4 / Appendix F; the constant terms do not change the gradient).
# --------------------------------------------------------------------------------------------------------------


def _fkl_value(w, log_r, rho):
    # KL(pi_ref || pi_theta) = E_mu[rho * log(pi_ref / pi_theta)]
    return -rho * log_r


def _ufkl_value(w, log_r, rho):
    # UKL(pi_ref || pi_theta) = E_mu[-rho * log r + w - rho]; with rho = 1 this is k3 = w - log w - 1
    return -rho * log_r + w - rho


def _rkl_value(w, log_r, rho):
    # KL(pi_theta || pi_ref) = E_mu[w * log r]
    return w * log_r


def _urkl_value(w, log_r, rho):
    # UKL(pi_theta || pi_ref) = E_mu[w * log r + rho - w]
    return w * log_r + rho - w


_DIVERGENCE_VALUES = {"fkl": _fkl_value, "ufkl": _ufkl_value, "rkl": _rkl_value, "urkl": _urkl_value}


def divergence_value(divergence: str, w: torch.Tensor, log_r: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of the divergence D (its mean under mu estimates D); rpg-math.md section 2."""
    return _DIVERGENCE_VALUES[divergence](w, log_r, rho)


# --------------------------------------------------------------------------------------------------------------
# Shared estimator bodies
# --------------------------------------------------------------------------------------------------------------


def _clip_log_w(x: ObjectiveInputs) -> torch.Tensor:
    eps_low, eps_high, _ = x.clip
    lower = math.log(1.0 - eps_low) if eps_low < 1.0 else -math.inf
    return x.log_w.detach().clamp(min=lower, max=math.log1p(eps_high))


def _reinforce(x: ObjectiveInputs, kl_weight: Callable) -> tuple[torch.Tensor, dict | None]:
    """REINFORCE-style surrogate ``-SG(g) * logp`` (Proposition 4.1, Eq. F.2; with clip: Algorithm 2).

    ``kl_weight(w, log_r)`` is the divergence's C_KL (rpg-math.md section 2, third column). Unclipped,
    ``g = w * A + C_KL``. With RPG-Style Clip (rpg-math.md section 3) ``C_bar`` uses the clipped ratio
    ``w_bar = clip(w, 1 - eps_low, 1 + eps_high)`` (Remark F.2), the branch is on the sign of the effective advantage
    ``A' = A + C_bar / w``, and tokens outside the trust region get ``g = 0``.
    """
    w = x.w.detach()
    if x.clip is None:
        g = w * x.adv + kl_weight(w, x.log_r.detach())
        return -g * x.logp, None

    eps_low, eps_high, c = x.clip
    log_w_bar = _clip_log_w(x)
    w_bar = log_w_bar.exp()
    c_bar = kl_weight(w_bar, log_w_bar - x.log_rho)
    effective_adv = x.adv + c_bar / w
    positive = effective_adv >= 0
    high = positive & (w >= 1.0 + eps_high)
    low = ~positive & (w <= 1.0 - eps_low)
    dual = ~positive & (w >= c) if c is not None else torch.zeros_like(positive)
    zero = high | low | dual
    g = torch.where(zero, torch.zeros_like(w), w * x.adv + c_bar)
    return -g * x.logp, {"high": high, "low": low, "dual": dual}


def _differentiable(x: ObjectiveInputs, divergence: str) -> tuple[torch.Tensor, dict | None]:
    """Fully differentiable surrogate ``-w * A + beta * D_hat(w, log r)`` (Table 4, Appendix F).

    With clip (Algorithm 1, "RPG"): dual-clip PPO on the reward term, ``max(-w A, -clip(w) A)`` and for ``A < 0``
    additionally ``min(., -c A)``; the KL term stays unclipped.
    """
    kl = x.beta * divergence_value(divergence, x.w, x.log_r, x.rho)
    if x.clip is None:
        return -x.w * x.adv + kl, None

    eps_low, eps_high, c = x.clip
    w_clipped = torch.clamp(x.w, min=1.0 - eps_low, max=1.0 + eps_high)
    pg = torch.maximum(-x.w * x.adv, -w_clipped * x.adv)
    w = x.w.detach()
    negative = x.adv < 0
    dual = negative & (w > c) if c is not None else torch.zeros_like(negative)
    if c is not None:
        pg = torch.where(negative, torch.minimum(pg, -c * x.adv), pg)
    high = (x.adv > 0) & (w > 1.0 + eps_high)
    low = negative & (w < 1.0 - eps_low)
    return pg + kl, {"high": high, "low": low, "dual": dual}


# --------------------------------------------------------------------------------------------------------------
# The eight registered objectives. C_KL = Weight - w*A from rpg-math.md section 2 (paper Tables 1-2, F.1-F.5).
# --------------------------------------------------------------------------------------------------------------


@register_objective("fkl", "reinforce")
def fkl_reinforce(x: ObjectiveInputs):
    """Forward KL(pi_ref || pi_theta), REINFORCE-style: Weight = w*A + beta*rho."""
    return _reinforce(x, lambda w, log_r: x.beta * x.rho)


@register_objective("ufkl", "reinforce")
def ufkl_reinforce(x: ObjectiveInputs):
    """Unnormalised forward KL, REINFORCE-style: Weight = w*A - beta*(w - rho)."""
    return _reinforce(x, lambda w, log_r: x.beta * (x.rho - w))


@register_objective("rkl", "reinforce")
def rkl_reinforce(x: ObjectiveInputs):
    """Reverse KL(pi_theta || pi_ref), REINFORCE-style: Weight = w*(A - beta*(log r + 1))."""
    return _reinforce(x, lambda w, log_r: -x.beta * w * (log_r + 1.0))


@register_objective("urkl", "reinforce")
def urkl_reinforce(x: ObjectiveInputs):
    """Unnormalised reverse KL, REINFORCE-style: Weight = w*(A - beta*log r). The paper's RPG-REINFORCE-URKL."""
    return _reinforce(x, lambda w, log_r: -x.beta * w * log_r)


@register_objective("fkl", "differentiable")
def fkl_differentiable(x: ObjectiveInputs):
    """Forward KL, fully differentiable: -w*A - beta*rho*log r (gradient of -beta*rho*logp)."""
    return _differentiable(x, "fkl")


@register_objective("ufkl", "differentiable")
def ufkl_differentiable(x: ObjectiveInputs):
    """Unnormalised forward KL, fully differentiable: -w*A + beta*(w - rho*log r - rho)."""
    return _differentiable(x, "ufkl")


@register_objective("rkl", "differentiable")
def rkl_differentiable(x: ObjectiveInputs):
    """Reverse KL, fully differentiable: w*(-A + beta*log r)."""
    return _differentiable(x, "rkl")


@register_objective("urkl", "differentiable")
def urkl_differentiable(x: ObjectiveInputs):
    """Unnormalised reverse KL, fully differentiable: -w*A + beta*(w*log r + rho - w)."""
    return _differentiable(x, "urkl")


# --------------------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------------------


def _check_tensor(name: str, value, shape: torch.Size | None = None) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}.")
    if not value.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {value.dtype}.")
    if shape is not None and value.shape != shape:
        raise ValueError(f"`{name}` must have shape {tuple(shape)} (same as `logps`), got {tuple(value.shape)}.")


def _check_number(name: str, value, minimum: float, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if value < minimum or (strict and value == minimum):
        raise ValueError(f"`{name}` must be {'>' if strict else '>='} {minimum}, got {value!r}.")


def _validate(logps, sampling_logps, advantages, mask, ref_logps, divergence, estimator, beta, eps_lo, eps_hi, c):
    if divergence not in DIVERGENCES:
        raise ValueError(f"`divergence` must be one of {list(DIVERGENCES)}, got {divergence!r}.")
    if estimator not in ESTIMATORS:
        raise ValueError(f"`estimator` must be one of {list(ESTIMATORS)}, got {estimator!r}.")
    _check_number("beta", beta, 0.0)
    if eps_lo is not None:
        _check_number("epsilon_low", eps_lo, 0.0)
    if eps_hi is not None:
        if eps_lo is None:
            raise ValueError("`epsilon_high` requires `epsilon_low` (clipping is on only when `epsilon_low` is set).")
        _check_number("epsilon_high", eps_hi, 0.0)
    if c is not None:
        if eps_lo is None:
            raise ValueError("`dual_clip_c` requires `epsilon_low`: the dual-clip bound is part of RPG-Style Clip.")
        _check_number("dual_clip_c", c, 1.0, strict=True)

    _check_tensor("logps", logps)
    if logps.dim() != 2:
        raise ValueError(f"`logps` must have shape (B, T), got {tuple(logps.shape)}.")
    _check_tensor("sampling_logps", sampling_logps, logps.shape)
    _check_tensor("mask", mask, logps.shape)
    if ref_logps is not None:
        _check_tensor("ref_logps", ref_logps, logps.shape)
    _check_tensor("advantages", advantages)
    batch = logps.shape[0]
    allowed = [(batch,), (batch, 1), tuple(logps.shape)]
    if tuple(advantages.shape) not in allowed:
        raise ValueError(f"`advantages` must have shape (B,), (B, 1) or (B, T) = one of {allowed}, got "
                         f"{tuple(advantages.shape)}.")


def rpg_per_token_loss(
    logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logps: torch.Tensor | None = None,
    divergence: str = "urkl",
    estimator: str = "reinforce",
    beta: float = 1e-4,
    epsilon_low: float | None = None,
    epsilon_high: float | None = None,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token RPG loss whose gradient is minus the off-policy gradient of ``J = E_pi[A] - beta * D``.

    Args:
        logps: (B, T) log-probs of the current policy; carries the gradient.
        sampling_logps: (B, T) log-probs of the policy that sampled the batch (treated as constants).
        advantages: (B,), (B, 1) or (B, T) baselined advantages A.
        mask: (B, T) floating-point mask, used as an indicator: tokens where it is 0 get loss exactly 0.
        ref_logps: (B, T) reference log-probs; None means the reference is the sampling policy (rho = 1).
        divergence: "fkl" | "rkl" | "ufkl" | "urkl" (rpg-math.md section 2).
        estimator: "reinforce" (stop-gradient surrogate) | "differentiable" (gradient through w).
        beta: KL coefficient, >= 0.
        epsilon_low: None disables clipping; else RPG-Style Clip with trust region [1 - eps_low, 1 + eps_high].
        epsilon_high: upper clip width; defaults to ``epsilon_low`` when clipping is on.
        dual_clip_c: dual-clip bound c > 1 for negative (effective) advantages; None for no bound.

    Returns:
        ``(per_token_loss, stats)``: the (B, T) loss in the compute dtype (>= float32), zero outside the valid
        tokens; aggregation (token-mean, sequence-mean...) is the caller's. ``stats`` holds detached scalars:
        ``divergence`` (masked mean of the divergence estimate), ``w_mean``, ``w_max``, ``clip_frac_high``,
        ``clip_frac_low``, ``clip_frac_dual`` (fractions of valid tokens in each zero-gradient region),
        ``valid_tokens`` and ``excluded_tokens`` (masked tokens dropped because a sampling/reference log-prob or
        an advantage was NaN or infinite).
    """
    _validate(logps, sampling_logps, advantages, mask, ref_logps, divergence, estimator, beta, epsilon_low,
              epsilon_high, dual_clip_c)
    clip = None
    if epsilon_low is not None:
        clip = (float(epsilon_low), float(epsilon_high if epsilon_high is not None else epsilon_low), dual_clip_c)

    dtype = torch.promote_types(logps.dtype, torch.float32)
    logp = logps.to(dtype)
    logmu = sampling_logps.detach().to(dtype)
    logref = ref_logps.detach().to(dtype) if ref_logps is not None else None
    adv = advantages.detach().to(dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(logp)

    # Tokens whose sampler/reference log-prob or advantage is not finite are excluded (and counted): their inputs
    # are replaced by harmless values *before* any arithmetic, so no NaN reaches the loss or the gradient.
    in_mask = mask.detach() != 0
    finite = torch.isfinite(logmu) & torch.isfinite(adv) & torch.isfinite(logp.detach())
    if logref is not None:
        finite &= torch.isfinite(logref)
    valid = in_mask & finite
    zeros = torch.zeros_like(logp.detach())
    logp_safe = torch.where(valid, logp, zeros)
    logmu = torch.where(valid, logmu, zeros)
    adv = torch.where(valid, adv, zeros)

    log_w = (logp_safe - logmu).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if logref is None:
        log_rho = zeros
    else:
        log_rho = torch.where(valid, logref, zeros) - logmu
        log_rho = log_rho.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    inputs = ObjectiveInputs(
        logp=logp_safe, log_w=log_w, w=log_w.exp(), log_rho=log_rho, rho=log_rho.exp(), adv=adv, beta=float(beta),
        clip=clip,
    )
    loss, regions = OBJECTIVES[(divergence, estimator)](inputs)
    per_token_loss = torch.where(valid, loss, zeros)

    with torch.no_grad():
        n_valid = valid.sum()
        denom = n_valid.clamp(min=1).to(dtype)
        validf = valid.to(dtype)
        w = inputs.w.detach()

        def frac(region):
            return (region & valid).to(dtype).sum() / denom if region is not None else zeros.sum()

        stats = {
            "divergence": (divergence_value(divergence, w, inputs.log_r.detach(), inputs.rho) * validf).sum() / denom,
            "w_mean": (w * validf).sum() / denom,
            "w_max": torch.where(valid, w, zeros).amax() if w.numel() else zeros.sum(),
            "clip_frac_high": frac(regions["high"] if regions else None),
            "clip_frac_low": frac(regions["low"] if regions else None),
            "clip_frac_dual": frac(regions["dual"] if regions else None),
            "valid_tokens": n_valid.to(dtype),
            "excluded_tokens": (in_mask & ~finite).sum().to(dtype),
        }
    return per_token_loss, stats
