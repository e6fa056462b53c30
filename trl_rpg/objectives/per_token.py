"""RPG objectives: per-token surrogate losses whose gradient is exactly that of a KL-regularised objective.

Torch only; nothing here imports TRL. The formulas are those of ``docs/math.md`` (sections 2 and 3), which restates
Zhang et al., "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning" (ICLR 2026,
arXiv:2505.17508), Tables 1, 2 and 4, Proposition 4.1, Appendix F and Algorithms 1-2, with the sampling policy
``mu`` and the reference ``pi_ref`` decoupled.

Notation (per completion token)::

    log w   = logp - logmu            importance ratio of the current policy to the sampler
    log rho = logref - logmu          exactly 0 when the reference IS the sampling policy
    log r   = logp - logref = log w - log rho
    A       = baselined reward advantage

Every objective ``J = E_pi[A] - beta * D`` has an off-policy gradient of the form ``E_mu[Weight * grad logp]``
with ``Weight = w * A + beta * kl_weight``. The objectives are data: one :class:`Divergence` row per divergence (its
value and its ``kl_weight``) in :data:`DIVERGENCE_TABLE`, and one body per estimator in :data:`ESTIMATOR_BODIES`;
:data:`OBJECTIVES` holds every (divergence, estimator) pair derived from them, so adding a divergence is one row.
:func:`rpg_per_token_loss` validates the inputs, handles masking, non-finite values and numerics, and dispatches.

Numerics: all arithmetic runs in at least float32 (bfloat16/float16 inputs are upcast). Only the arguments of ``exp``
are bounded, and above only, at ``LOG_RATIO_BOUND`` (= 20, so ``w, rho <= 4.9e8``; float32 ``exp`` overflows near
+88.7): beyond it the ratio saturates and, for the fully differentiable estimators, its gradient through ``w`` is
zero. Below, ``exp`` underflows to 0 exactly, so no lower bound is applied (one at -20 made FKL's ``beta * rho`` and
UFKL's ``beta * (rho - w)`` 2.2e4 times too large, relatively, at ``log rho = -30``). ``log r = logp - logref`` is
formed from the unclamped log-probs (docs/math.md section 3): the weights that read it (RKL, URKL) are exact however
far the reference is from the sampler. Products such as ``w * log r`` stay below ``4.9e8 * |log r|``, far from
overflow for finite log-probs.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

__all__ = ["DIVERGENCES", "DIVERGENCE_TABLE", "ESTIMATORS", "ESTIMATOR_BODIES", "LOG_RATIO_BOUND", "OBJECTIVES",
           "Divergence", "ObjectiveInputs", "divergence_value", "get_divergence", "register_divergence",
           "rpg_per_token_loss"]

#: The arguments of exp (log w, log rho) are bounded above by LOG_RATIO_BOUND (not below: exp underflows to 0
#: exactly); log r itself is not bounded.
LOG_RATIO_BOUND = 20.0

Tensor = torch.Tensor


@dataclass(frozen=True)
class Divergence:
    """One row of the objective table (docs/math.md section 2).

    ``value(w, log_r, rho)`` is a per-token quantity whose mean under mu estimates D; written so that, with the
    gradient flowing through ``w`` and ``log r``, ``beta * value`` is also the fully differentiable KL surrogate
    (Table 4 / Appendix F: constant terms do not change the gradient). ``kl_weight(w, log_r, rho)`` is the
    REINFORCE weight's KL part divided by beta: ``Weight = w * A + beta * kl_weight`` (Tables 1-2, Eqs. F.1-F.5).
    """

    name: str
    title: str
    value: Callable[[Tensor, Tensor, Tensor], Tensor]
    kl_weight: Callable[[Tensor, Tensor, Tensor], Tensor]
    value_formula: str
    weight_formula: str


#: The four divergences. With rho = 1, UFKL's value is k3 = w - log w - 1 (why the paper calls k3 the
#: unnormalised KL).
DIVERGENCE_TABLE: tuple[Divergence, ...] = (
    Divergence("fkl", "KL(pi_ref || pi_theta)",
               value=lambda w, log_r, rho: -rho * log_r,
               kl_weight=lambda w, log_r, rho: rho,
               value_formula="-rho*log r", weight_formula="w*A + beta*rho"),
    Divergence("ufkl", "UKL(pi_ref || pi_theta)",
               value=lambda w, log_r, rho: -rho * log_r + w - rho,
               kl_weight=lambda w, log_r, rho: rho - w,
               value_formula="-rho*log r + w - rho", weight_formula="w*A - beta*(w - rho)"),
    Divergence("rkl", "KL(pi_theta || pi_ref)",
               value=lambda w, log_r, rho: w * log_r,
               kl_weight=lambda w, log_r, rho: -w * (log_r + 1.0),
               value_formula="w*log r", weight_formula="w*(A - beta*(log r + 1))"),
    Divergence("urkl", "UKL(pi_theta || pi_ref)",
               value=lambda w, log_r, rho: w * log_r + rho - w,
               kl_weight=lambda w, log_r, rho: -w * log_r,
               value_formula="w*log r + rho - w", weight_formula="w*(A - beta*log r)"),
)

# --------------------------------------------------------------------------------------------------------------
# The registry: name -> Divergence. The built-ins are registered below exactly as a user's divergence would be.
# --------------------------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Divergence] = {}
#: Read-only view of the registry, name -> :class:`Divergence` (live: a later registration shows up here).
DIVERGENCES: Mapping[str, Divergence] = types.MappingProxyType(_REGISTRY)
_TEXT_FIELDS = ("name", "title", "value_formula", "weight_formula")


def register_divergence(divergence: Divergence) -> Divergence:
    """Add ``divergence`` under ``divergence.name`` (docs/objectives.md, "Adding a divergence").

    The row must be a :class:`Divergence` with non-empty text fields and callable ``value`` / ``kl_weight``; a name
    already registered (a built-in included) is refused: no entry is ever replaced. Returns the row."""
    if not isinstance(divergence, Divergence):
        raise TypeError(f"register_divergence takes a Divergence, got {type(divergence).__name__}.")
    for field in _TEXT_FIELDS:
        value = getattr(divergence, field)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"Divergence.{field} must be a non-empty string, got {value!r}.")
    for field in ("value", "kl_weight"):
        if not callable(getattr(divergence, field)):
            raise ValueError(f"Divergence.{field} must be a callable f(w, log_r, rho) -> Tensor, got "
                             f"{getattr(divergence, field)!r}.")
    if divergence.name in _REGISTRY:
        raise ValueError(f"A divergence named {divergence.name!r} is already registered (registered: "
                         f"{list(_REGISTRY)}); choose another name.")
    _REGISTRY[divergence.name] = divergence
    return divergence


def get_divergence(name: str) -> Divergence:
    """The registered :class:`Divergence` called ``name``; a clear error listing the registered names otherwise."""
    if name not in _REGISTRY:
        raise ValueError(f"`divergence` must be one of {list(_REGISTRY)}, got {name!r}.")
    return _REGISTRY[name]


for _row in DIVERGENCE_TABLE:
    register_divergence(_row)


@dataclass
class ObjectiveInputs:
    """Per-token quantities handed to an estimator body. All tensors are (B, T) in the compute dtype.

    ``logp``, ``log_w``, ``log_r``, ``w`` and ``reward_w`` carry the gradient; ``log_rho``, ``rho`` and ``adv`` are
    constants. ``log_r = logp - logref`` is exact (from the unclamped log-probs); ``log_w`` and ``log_rho`` are the
    arguments of ``w`` and ``rho``, bounded above by ``LOG_RATIO_BOUND``. ``w`` is the per-token ratio the KL term
    uses; ``reward_w`` the ratio that weighs the reward term (``w`` itself at token level, the sequence's ratio under
    GSPO, ``sequence_level=True``: docs/math.md section 4b). ``clip`` is None (no clipping) or ``(eps_low, eps_high,
    dual_clip_c)`` with ``dual_clip_c`` possibly None.
    """

    logp: Tensor
    log_w: Tensor
    w: Tensor
    log_rho: Tensor
    rho: Tensor
    adv: Tensor
    beta: float
    clip: tuple[float, float, float | None] | None
    reward_w: Tensor
    log_r: Tensor
    sequence_level: bool = False


def divergence_value(divergence: str, w: Tensor, log_r: Tensor, rho: Tensor) -> Tensor:
    """Per-token estimate of the divergence D (its mean under mu estimates D); docs/math.md section 2."""
    return get_divergence(divergence).value(w, log_r, rho)


# --------------------------------------------------------------------------------------------------------------
# The two estimator bodies. Each returns (per-token loss, clip regions): the regions are boolean (B, T) masks
# {"high", "low", "dual"} of tokens in a zero-gradient region of the clip table (None when clipping is off).
# --------------------------------------------------------------------------------------------------------------


def _clipped_kl_arguments(x: ObjectiveInputs) -> tuple[Tensor, Tensor, Tensor]:
    """The arguments ``(w_bar, log r_bar, rho_bar)`` of the clipped KL part ``C_bar = beta * kl_weight(...)``.

    Every KL part is ``beta * w * h(r)`` (docs/math.md section 3). Inside the trust region, ``1 - eps_low < w <
    1 + eps_high`` (the clip table's own strict comparisons, on the same ``w``), the arguments are exact:
    ``(w, log r, rho)``. Outside it both ratios are clipped to ``[1 - eps_low, 1 + eps_high]``: ``(w_bar, log r_bar,
    w_bar / r_bar)``, so ``C_bar`` is bounded and, for UFKL and URKL, 0 where pi = pi_ref and of the exact sign. With
    rho = 1, r = w and this is Remark F.2 (w -> w_bar and log w -> log w_bar).
    """
    eps_low, eps_high, _ = x.clip
    lower, upper = math.log(1.0 - eps_low) if eps_low < 1.0 else -math.inf, math.log1p(eps_high)
    w, log_r = x.w.detach(), x.log_r.detach()
    inside = (w > 1.0 - eps_low) & (w < 1.0 + eps_high)
    w_bar = w.clamp(min=1.0 - eps_low, max=1.0 + eps_high)  # w itself inside
    log_w_bar = w_bar.log()
    log_r_bar = torch.where(inside, log_r, log_r.clamp(min=lower, max=upper))
    rho_bar = torch.where(inside, x.rho, (log_w_bar - log_r_bar).exp())
    return w_bar, log_r_bar, rho_bar


def _zero_cells(ratio: Tensor, effective_adv: Tensor, clip: tuple) -> dict[str, Tensor]:
    """The three zero-gradient cells of the clip table (docs/math.md section 3), boolean (B, T): ``high`` (``A' >= 0,
    ratio >= 1 + eps_high``), ``low`` (``A' < 0, ratio <= 1 - eps_low``), ``dual`` (``A' < 0, ratio >= c``)."""
    eps_low, eps_high, c = clip
    positive = effective_adv >= 0
    dual = ~positive & (ratio >= c) if c is not None else torch.zeros_like(positive)
    return {"high": positive & (ratio >= 1.0 + eps_high), "low": ~positive & (ratio <= 1.0 - eps_low), "dual": dual}


def _dropped(cells: dict[str, Tensor]) -> Tensor:
    return cells["high"] | cells["low"] | cells["dual"]


def reinforce(x: ObjectiveInputs, divergence: Divergence) -> tuple[Tensor, dict | None]:
    """REINFORCE-style surrogate ``-SG(g) * logp`` (Proposition 4.1, Eq. F.2; with clip: Algorithm 2).

    Unclipped, ``g = Weight = w * A + beta * kl_weight(w, log r, rho)``. With RPG-Style Clip (docs/math.md
    section 3) the KL part ``C_bar`` is exact inside the trust region and, outside it, evaluated at the clipped pair
    ``w_bar = clip(w, 1 - eps_low, 1 + eps_high)``, ``r_bar = clip(r, 1 - eps_low, 1 + eps_high)``
    (:func:`_clipped_kl_arguments`; with rho = 1 this is Remark F.2); the branch is on the sign of the effective
    advantage ``A' = A + C_bar / w``, and three cells get ``g = 0`` (:func:`_zero_cells`): ``A' >= 0, w >= 1 +
    eps_high``; ``A' < 0, w <= 1 - eps_low``; ``A' < 0, w >= c``. The other two cells outside the trust region keep
    ``g = w * A + C_bar`` (``A' >= 0, w <= 1 - eps_low`` and ``A' < 0, 1 + eps_high <= w < c``).
    Under GSPO (docs/math.md section 4b) the two terms are clipped apart: the reward term ``s * A`` by the table on
    the sequence ratio ``s`` (``reward_w``) with ``A' = A``; the KL part ``C_bar`` by the table for a token with
    ``A = 0`` on its own ``w`` (``A' = C_bar / w``), so a sequence whose ``s`` leaves the trust region keeps the KL
    part of its tokens.
    """
    w = x.w.detach()
    if x.clip is None:
        g = x.reward_w.detach() * x.adv + x.beta * divergence.kl_weight(w, x.log_r.detach(), x.rho)
        return -g * x.logp, None

    c_bar = x.beta * divergence.kl_weight(*_clipped_kl_arguments(x))
    if not x.sequence_level:  # one table on A' = A + C_bar / w
        effective_adv = x.adv + c_bar / w
        cells = _zero_cells(w, effective_adv, x.clip)
        g = torch.where(_dropped(cells), torch.zeros_like(w), w * x.adv + c_bar)
    else:
        s, effective_adv = x.reward_w.detach(), x.adv
        cells = _zero_cells(s, effective_adv, x.clip)
        kl_live = ~_dropped(_zero_cells(w, c_bar / w, x.clip))
        g = torch.where(_dropped(cells), torch.zeros_like(w), s * x.adv) + torch.where(kl_live, c_bar, 0.0)
    # A' = 0 gives g = 0 in every branch; the regions (for the logged clip fractions) hold tokens with A' != 0 only
    nonzero = effective_adv != 0
    return -g * x.logp, {"high": cells["high"] & nonzero, "low": cells["low"], "dual": cells["dual"]}


def differentiable(x: ObjectiveInputs, divergence: Divergence) -> tuple[Tensor, dict | None]:
    """Fully differentiable surrogate ``-w * A + beta * D_hat(w, log r)`` (Table 4, Appendix F).

    With clip (Algorithm 1, the paper's "RPG" runs): dual-clip PPO on the reward term, ``max(-w A, -clip(w) A)``
    and for ``A < 0`` additionally ``min(., -c A)``; the KL term stays unclipped. The reward term's ratio is
    ``reward_w`` (the sequence ratio under GSPO); the KL term always uses the per-token ``w``.
    """
    kl = x.beta * divergence.value(x.w, x.log_r, x.rho)
    if x.clip is None:
        return -x.reward_w * x.adv + kl, None

    eps_low, eps_high, c = x.clip
    w_clipped = torch.clamp(x.reward_w, min=1.0 - eps_low, max=1.0 + eps_high)
    pg = torch.maximum(-x.reward_w * x.adv, -w_clipped * x.adv)
    w = x.reward_w.detach()
    negative = x.adv < 0
    if c is not None:
        pg = torch.where(negative, torch.minimum(pg, -c * x.adv), pg)
        dual = negative & (w > c)
    else:
        dual = torch.zeros_like(negative)
    high = (x.adv > 0) & (w > 1.0 + eps_high)
    low = negative & (w < 1.0 - eps_low)
    return pg + kl, {"high": high, "low": low, "dual": dual}


#: Estimator name -> body(inputs, divergence row).
ESTIMATOR_BODIES: dict[str, Callable[[ObjectiveInputs, Divergence], tuple[Tensor, dict | None]]] = {
    "reinforce": reinforce,
    "differentiable": differentiable,
}
ESTIMATORS = tuple(ESTIMATOR_BODIES)


def _objective(divergence: Divergence, estimator: str) -> Callable[[ObjectiveInputs], tuple[Tensor, dict | None]]:
    body = functools.partial(ESTIMATOR_BODIES[estimator], divergence=divergence)
    surrogate = ("-SG(Weight) * logp" if estimator == "reinforce"
                 else f"-w*A + beta*({divergence.value_formula})")
    body.__doc__ = (f"{divergence.title} ({divergence.name}), {estimator}: loss {surrogate} with Weight = "
                    f"{divergence.weight_formula} (docs/math.md section 2).")
    return body


#: (divergence, estimator) -> fn(ObjectiveInputs) -> (per-token loss, clip regions), derived from the table.
OBJECTIVES: dict[tuple[str, str], Callable] = {
    (row.name, estimator): _objective(row, estimator) for row in DIVERGENCE_TABLE for estimator in ESTIMATORS
}


def objective_for(divergence: str, estimator: str) -> Callable[[ObjectiveInputs], tuple[Tensor, dict | None]]:
    """The per-token objective of a (divergence, estimator) pair: the prebuilt one for a built-in, else derived from
    the registered row (so a divergence registered after import is used exactly like the built-ins)."""
    built_in = OBJECTIVES.get((divergence, estimator))
    return built_in if built_in is not None else _objective(get_divergence(divergence), estimator)


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
    # A zero clip width would put w = 1 itself on the clip boundary (no gradient on-policy): widths must be > 0.
    if eps_lo is not None:
        _check_number("epsilon_low", eps_lo, 0.0, strict=True)
    if eps_hi is not None:
        if eps_lo is None:
            raise ValueError("`epsilon_high` requires `epsilon_low` (clipping is on only when `epsilon_low` is set).")
        _check_number("epsilon_high", eps_hi, 0.0, strict=True)
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


def _clip_statistics(regions: dict | None, valid: Tensor, dtype: torch.dtype) -> dict[str, Tensor]:
    """Fractions of valid tokens in each zero-gradient region, over the batch and per sequence (for TRL's
    `clip_ratio/low_min` and `clip_ratio/high_max`: sequences without valid tokens are left out, NaN if none)."""
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    if regions is None:
        return {"clip_frac_high": zero, "clip_frac_low": zero, "clip_frac_dual": zero,
                "clip_frac_low_seq_min": zero, "clip_frac_high_seq_max": zero}
    validf = valid.to(dtype)
    tokens = validf.sum().clamp(min=1.0)
    per_seq_tokens = validf.sum(-1)
    has_tokens = per_seq_tokens > 0

    def seq_fraction(region):
        return (region & valid).to(dtype).sum(-1) / per_seq_tokens.clamp(min=1.0)

    nan = torch.full((), math.nan, dtype=dtype, device=valid.device)
    low_seq, high_seq = seq_fraction(regions["low"]), seq_fraction(regions["high"])
    return {
        **{f"clip_frac_{k}": (regions[k] & valid).to(dtype).sum() / tokens for k in ("high", "low", "dual")},
        "clip_frac_low_seq_min": low_seq[has_tokens].min() if has_tokens.any() else nan,
        "clip_frac_high_seq_max": high_seq[has_tokens].max() if has_tokens.any() else nan,
    }


#: Quantiles of the valid tokens' ratios w reported in `stats` (as `w_p01`, `w_p99`): how far off-policy a batch is.
RATIO_QUANTILES = {"w_p01": 0.01, "w_p99": 0.99}


def _ratio_quantiles(w: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """The `RATIO_QUANTILES` of `w` over the valid tokens (nearest rank; NaN without valid tokens)."""
    values = torch.sort(w[valid]).values
    if values.numel() == 0:
        return {name: torch.full((), math.nan, dtype=w.dtype, device=w.device) for name in RATIO_QUANTILES}
    last = values.numel() - 1
    return {name: values[min(last, max(0, round(q * last)))] for name, q in RATIO_QUANTILES.items()}


def rpg_per_token_loss(
    logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logps: torch.Tensor | None = None,
    reward_logps: torch.Tensor | None = None,
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
        advantages: (B,), (B, 1) or (B, T) baselined advantages A. A token that carries no reward signal (TRL's
            entropy and off-policy masks) has A = 0: it still carries the KL term (docs/math.md section 4b).
        mask: (B, T) floating-point mask, used as an indicator: tokens where it is 0 get loss exactly 0.
        ref_logps: (B, T) reference log-probs; None means the reference is the sampling policy (rho = 1).
        reward_logps: (B, T) log-probs whose ratio to the sampler weighs the reward term and is tested by the clip;
            carries the gradient. None: ``logps`` (token level). GSPO passes the sequence-level log-probs
            (``loss.sequence_level_logps``); the KL term always uses ``logps`` (docs/math.md section 4b).
        divergence: "fkl" | "rkl" | "ufkl" | "urkl" (docs/math.md section 2), or a name added with
            :func:`register_divergence`.
        estimator: "reinforce" (stop-gradient surrogate) | "differentiable" (gradient through w).
        beta: KL coefficient, >= 0.
        epsilon_low: None disables clipping; else RPG-Style Clip with trust region [1 - eps_low, 1 + eps_high]
            (> 0: with a zero width, w = 1 would lie on the clip boundary and on-policy tokens would get no gradient).
        epsilon_high: upper clip width (> 0); defaults to ``epsilon_low`` when clipping is on.
        dual_clip_c: dual-clip bound c > 1 for negative (effective) advantages; None for no bound.

    Returns:
        ``(per_token_loss, stats)``: the (B, T) loss in the compute dtype (>= float32), zero outside the valid
        tokens; aggregation (token-mean, sequence-mean...) is the caller's. ``stats`` holds detached scalars:
        ``divergence`` (masked mean of the divergence estimate), ``w_mean``, ``w_max``, ``w_p01`` / ``w_p99`` (1% and
        99% quantiles of w over the valid tokens, NaN without any), ``clip_frac_high``,
        ``clip_frac_low``, ``clip_frac_dual`` (fractions of valid tokens in each zero-gradient region),
        ``clip_frac_low_seq_min`` / ``clip_frac_high_seq_max`` (the smallest / largest per-sequence fraction),
        ``valid_tokens`` and ``excluded_tokens`` (masked tokens dropped because a sampling/reference log-prob or
        an advantage was NaN or infinite).
    """
    _validate(logps, sampling_logps, advantages, mask, ref_logps, divergence, estimator, beta, epsilon_low,
              epsilon_high, dual_clip_c)
    if reward_logps is not None:
        _check_tensor("reward_logps", reward_logps, logps.shape)
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
    reward_logp = logp if reward_logps is None else reward_logps.to(dtype)
    finite = torch.isfinite(logmu) & torch.isfinite(adv) & torch.isfinite(logp.detach())
    if reward_logps is not None:
        finite &= torch.isfinite(reward_logp.detach())
    if logref is not None:
        finite &= torch.isfinite(logref)
    valid = in_mask & finite
    zeros = torch.zeros_like(logp.detach())
    logp_safe = torch.where(valid, logp, zeros)
    logmu = torch.where(valid, logmu, zeros)
    adv = torch.where(valid, adv, zeros)

    log_w = (logp_safe - logmu).clamp(max=LOG_RATIO_BOUND)
    w = log_w.exp()
    if reward_logps is None:
        reward_w = w
    else:
        reward_w = (torch.where(valid, reward_logp, zeros) - logmu).clamp(max=LOG_RATIO_BOUND).exp()
    # log r from the unclamped log-probs; only the arguments of exp are bounded, above (docs/math.md section 3)
    logref = logmu if logref is None else torch.where(valid, logref, zeros)
    log_rho = (logref - logmu).clamp(max=LOG_RATIO_BOUND)
    inputs = ObjectiveInputs(
        logp=logp_safe, log_w=log_w, w=w, log_rho=log_rho, rho=log_rho.exp(), adv=adv, beta=float(beta),
        clip=clip, reward_w=reward_w, log_r=logp_safe - logref, sequence_level=reward_logps is not None,
    )
    loss, regions = objective_for(divergence, estimator)(inputs)
    per_token_loss = torch.where(valid, loss, zeros)

    with torch.no_grad():
        n_valid = valid.sum()
        denom = n_valid.clamp(min=1).to(dtype)
        validf = valid.to(dtype)
        w = inputs.reward_w.detach()  # the ratio the clip tests
        divergence_estimate = divergence_value(divergence, inputs.w.detach(), inputs.log_r.detach(), inputs.rho)
        stats = {
            "divergence": (divergence_estimate * validf).sum() / denom,
            "w_mean": (w * validf).sum() / denom,
            "w_max": torch.where(valid, w, zeros).amax() if w.numel() else zeros.sum(),
            **_ratio_quantiles(w, valid),
            **_clip_statistics(regions, valid, dtype),
            "valid_tokens": n_valid.to(dtype),
            "excluded_tokens": (in_mask & ~finite).sum().to(dtype),
        }
    return per_token_loss, stats
