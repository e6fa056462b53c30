"""RPG-Style Clip under GSPO's sequence ratio with the REINFORCE estimator (docs/math.md section 4b; issue 34
section 3).

The two terms are clipped apart: the reward term by the clip table on the sequence ratio s with A' = A (what beta = 0
gives), the KL part by the table for a token with A = 0 on its own w and r (A' = C_bar / w). Before, the KL part went
through the table on s with A' = A + C_bar / s, so a sequence whose s sat in a zero cell lost the KL part of every
token, including tokens whose own w is inside the trust region. Written here from the spec, per token:

    g = [s*A if the reward cell (s, A) is live] + [C_bar if the KL cell (w, C_bar / w) is live]
"""

import pytest
import torch

from trl_rpg.objectives.loss import sequence_level_logps
from trl_rpg.objectives.per_token import DIVERGENCES, rpg_per_token_loss

EPS_LOW, EPS_HIGH, C, BETA = 0.2, 0.28, 3.0, 0.5
H = {"fkl": lambda r: 1 / r, "ufkl": lambda r: 1 / r - 1, "rkl": lambda r: -(r.log() + 1), "urkl": lambda r: -r.log()}


def live(ratio, effective_adv):
    """The clip table of section 3: False in its three zero cells."""
    positive = effective_adv >= 0
    return ~((positive & (ratio >= 1 + EPS_HIGH)) | (~positive & (ratio <= 1 - EPS_LOW))
             | (~positive & (ratio >= C)))


def spec_coefficient(logp, logmu, logref, adv, mask, divergence):
    w, r = (logp - logmu).exp(), (logp - logref).exp()
    s = (((logp - logmu) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).exp().expand_as(w)
    box = lambda x: x.clamp(1 - EPS_LOW, 1 + EPS_HIGH)  # noqa: E731
    inside = (w > 1 - EPS_LOW) & (w < 1 + EPS_HIGH)
    c_bar = torch.where(inside, BETA * w * H[divergence](r), BETA * box(w) * H[divergence](box(r)))
    adv = adv.unsqueeze(1).expand_as(w)
    return torch.where(live(s, adv), s * adv, 0.0) + torch.where(live(w, c_bar / w), c_bar, 0.0)


def library_coefficient(logp0, logmu, logref, adv, mask, divergence, sequence=True):
    logp = logp0.clone().requires_grad_(True)
    reward_logps = sequence_level_logps(logp, logmu, mask) if sequence else None
    loss, stats = rpg_per_token_loss(logp, logmu, adv, mask, ref_logps=logref, reward_logps=reward_logps,
                                     divergence=divergence, beta=BETA, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                                     dual_clip_c=C)
    logp.grad = None
    (grad,) = torch.autograd.grad((loss * mask).sum(), logp)
    return -grad, stats


def rows(seed):
    """16 sequences of 6 tokens: a shared per-row offset puts s on both sides of the trust region (and beyond c),
    per-token noise keeps many tokens' own w inside it; the reference is far on both sides."""
    gen = torch.Generator().manual_seed(seed)
    logmu = -1.0 - torch.rand(16, 6, generator=gen, dtype=torch.float64)
    offset = torch.linspace(-0.9, 1.3, 16, dtype=torch.float64).unsqueeze(1)
    logp = logmu + offset + 0.35 * torch.randn(16, 6, generator=gen, dtype=torch.float64)
    logref = logp - 0.8 * torch.randn(16, 6, generator=gen, dtype=torch.float64)
    mask = torch.ones(16, 6, dtype=torch.float64)
    mask[3, 4:] = mask[9, 2:] = 0
    return logp, logmu, logref, mask


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_with_no_advantage_sequence_level_and_token_level_give_the_same_gradient(divergence):
    """A = 0 everywhere: the reward term is 0 and the KL part is clipped on each token's own w, at either level."""
    logp, logmu, logref, mask = rows(0)
    zero = torch.zeros(16, dtype=torch.float64)
    w = (logp - logmu).exp()
    s = (((logp - logmu) * mask).sum(-1) / mask.sum(-1)).exp()
    inside = (w > 1 - EPS_LOW) & (w < 1 + EPS_HIGH) & (mask > 0)
    # sequences outside the trust region holding tokens inside it: the case the old rule got wrong
    assert (inside & ((s >= 1 + EPS_HIGH) | (s <= 1 - EPS_LOW)).unsqueeze(1)).sum() > 5
    sequence, _ = library_coefficient(logp, logmu, logref, zero, mask, divergence, sequence=True)
    token, _ = library_coefficient(logp, logmu, logref, zero, mask, divergence, sequence=False)
    assert token.abs().max() > 1e-2
    torch.testing.assert_close(sequence, token, rtol=0, atol=1e-12)


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("seed", [1, 2])
def test_reward_term_clipped_on_the_sequence_ratio_and_kl_part_on_each_token(divergence, seed):
    logp, logmu, logref, mask = rows(seed)
    adv = torch.linspace(-1.5, 1.5, 16, dtype=torch.float64)[torch.randperm(16, generator=torch.Generator()
                                                                              .manual_seed(seed))]
    got, stats = library_coefficient(logp, logmu, logref, adv, mask, divergence)
    want = spec_coefficient(logp, logmu, logref, adv, mask, divergence) * mask
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # the logged clip fractions are the reward term's (cells on s with A' = A), as at beta = 0
    _, at_beta_zero = rpg_per_token_loss(logp, logmu, adv, mask, ref_logps=logref,
                                         reward_logps=sequence_level_logps(logp, logmu, mask), beta=0.0,
                                         epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, dual_clip_c=C)
    for key in ("clip_frac_high", "clip_frac_low", "clip_frac_dual"):
        assert stats[key] == at_beta_zero[key]
    assert stats["clip_frac_high"] > 0 and stats["clip_frac_low"] > 0
