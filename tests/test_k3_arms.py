"""benchmarks/k3_arms.py: AsyncGRPO plus GRPO's k3 term towards the sampler, unweighted and IS-weighted.

The trainer's `compute_loss` (TRL's `AsyncGRPOTrainer.compute_loss` run as it is, on a stand-in model whose packed
log-probs come from a leaf tensor of logits) is differentiated with respect to the logits; the arm's gradient minus
AsyncGRPO's (the same call at beta 0) must be, per trained token t of the micro-batch's M,

    (beta / M) * k3'(w_t) * (onehot(o_t) - softmax(logits_t)),   k3'(w) = 1 - 1/w (unweighted), w log w (IS-weighted)

GRPO's closed form (TRL 1.16 `GRPOTrainer._compute_loss`: beta * k3, or beta * k3 * coef_1 under
`use_bias_correction_kl`; docs/math.md section 2) at w = pi/mu. Dropping the weight, flipping the log-ratio's sign,
detaching the ratio or another normaliser each breaks it.
"""

import os
import sys
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

pytest.importorskip("requests")  # TRL's async trainer module builds a vLLM client at import

from benchmarks import k3_arms  # noqa: E402

LENGTH, VOCAB = 7, 5
TRAINED = [1, 2, 3, 5]  # packed positions whose predictions are trained tokens
W = torch.tensor([0.5, 0.9, 1.3, 2.0], dtype=torch.float64)  # pi/mu at those tokens
ADVANTAGES = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=torch.float64)


class Accelerator:
    num_processes = 1

    @staticmethod
    def reduce(t, reduction="sum"):
        return t

    @staticmethod
    def gather(t):
        return t.reshape(-1)


def stand_in_trainer(beta: float, weighted: bool):
    """An `AsyncGRPOWithK3Trainer` with only what `compute_loss` reads (no model, worker or data)."""
    trainer = object.__new__(k3_arms.AsyncGRPOWithK3Trainer)
    trainer.args = SimpleNamespace(beta=beta, use_bias_correction_kl=weighted)
    trainer.state = SimpleNamespace(global_step=0)
    trainer.accelerator = Accelerator()
    trainer.current_gradient_accumulation_steps = 1
    trainer.epsilon_low, trainer.epsilon_high = 0.2, 0.2
    trainer.aux_loss_enabled, trainer.router_aux_loss_coef = False, 0.0
    trainer._metrics = {"train": defaultdict(list)}
    for name in ("_step_forward_tokens", "_step_trained_tokens", "_step_seq_len_weighted", "_step_samples",
                 "_step_forward_s"):
        setattr(trainer, name, 0.0)
    return trainer


def packed_case():
    """Logits (a leaf), labels, and one packed row of TRL's inputs whose sampler log-probs give the ratios W."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(LENGTH, VOCAB, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, VOCAB, (LENGTH,), generator=gen)
    with torch.no_grad():
        logps = torch.log_softmax(logits, -1)[torch.arange(LENGTH), labels]
    pad = torch.full((LENGTH,), -1)
    token_index = pad.clone()
    token_index[: len(TRAINED)] = torch.tensor(TRAINED)
    old = torch.zeros(LENGTH, dtype=torch.float64)
    old[: len(TRAINED)] = logps[TRAINED] - W.log()
    adv = torch.zeros(LENGTH, dtype=torch.float64)
    adv[: len(TRAINED)] = ADVANTAGES
    seg = torch.zeros(LENGTH, dtype=torch.long)
    inputs = {"attention_mask": torch.ones(1, LENGTH, dtype=torch.long), "input_ids": torch.zeros(1, LENGTH),
              "position_ids": torch.arange(LENGTH)[None], "shift_labels": labels[None],
              "token_index": token_index[None],
              "old_log_probs": old[None], "advantages": adv[None], "segment_id": seg[None],
              "tree_kv_index": torch.zeros(1, 1, dtype=torch.long), "tree_cu_seqlens_q": torch.zeros(1, 1),
              "tree_cu_seqlens_k": torch.zeros(1, 1), "tree_max_seqlens": torch.tensor([[LENGTH, LENGTH]]),
              "global_n_tokens": torch.tensor([float(len(TRAINED))]),
              "global_n_forward_tokens": torch.tensor([float(LENGTH)]), "mean_seq_len": torch.tensor([float(LENGTH)])}
    return logits, labels, inputs


def loss_gradient(beta: float, weighted: bool) -> torch.Tensor:
    logits, labels, inputs = packed_case()

    def model(**kwargs):
        logps = torch.log_softmax(logits, -1)[torch.arange(LENGTH), labels]
        return SimpleNamespace(log_probs=logps[None], entropy=torch.zeros(1, LENGTH, dtype=torch.float64))

    loss = stand_in_trainer(beta, weighted).compute_loss(model, inputs)
    (grad,) = torch.autograd.grad(loss, logits)
    return grad


def closed_form(beta: float, weighted: bool) -> torch.Tensor:
    logits, labels, _ = packed_case()
    probs = torch.softmax(logits.detach(), -1)
    onehot = torch.nn.functional.one_hot(labels, VOCAB).to(probs.dtype)
    coefficient = torch.zeros(LENGTH, dtype=torch.float64)
    coefficient[TRAINED] = beta / len(TRAINED) * k3_arms.k3_gradient(W, weighted)
    return coefficient[:, None] * (onehot - probs)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "IS-weighted"])
def test_the_k3_gradient_is_grpos_closed_form(weighted):
    beta = 0.7
    got = loss_gradient(beta, weighted) - loss_gradient(0.0, weighted)  # the k3 term's part of TRL's loss gradient
    want = closed_form(beta, weighted)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    other = closed_form(beta, not weighted)
    assert (other - want).abs().max() > 1e-2  # the two forms differ at these ratios: the check tells them apart


def test_the_closed_forms_are_the_derivatives_of_trls_k3():
    """k3_gradient against autograd of k3_per_token (and the IS-weighted one is URKL's KL weight w log w, the
    unweighted one not the detached-ratio UFKL weight w - 1)."""
    logps = torch.log(torch.tensor([0.2, 0.5, 0.05], dtype=torch.float64)).requires_grad_()
    sampling = torch.log(torch.tensor([0.3, 0.25, 0.2], dtype=torch.float64))
    w = (logps.detach() - sampling).exp()
    for weighted in (False, True):
        (grad,) = torch.autograd.grad(k3_arms.k3_per_token(logps, sampling, weighted).sum(), logps)
        torch.testing.assert_close(grad, k3_arms.k3_gradient(w, weighted))
    assert not torch.allclose(k3_arms.k3_gradient(w, True), w - 1)


def test_beta_zero_is_async_grpos_loss_and_bad_fields_are_named():
    assert loss_gradient(0.0, True).abs().sum() > 0  # TRL's PPO term alone
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        k3_arms.AsyncGRPOWithK3Config(output_dir="/tmp/unused", beta=-1.0)
    with pytest.raises(ValueError, match="use_bias_correction_kl must be True or False"):
        k3_arms.AsyncGRPOWithK3Config(output_dir="/tmp/unused", beta=0.1, use_bias_correction_kl="yes")


def test_a_non_finite_loss_stops_before_the_optimizer():
    logits, labels, inputs = packed_case()
    inputs["old_log_probs"][0, 0] = 1e4  # exp(log mu - log pi) overflows

    def model(**kwargs):
        logps = torch.log_softmax(logits, -1)[torch.arange(LENGTH), labels]
        return SimpleNamespace(log_probs=logps[None], entropy=torch.zeros(1, LENGTH, dtype=torch.float64))

    with pytest.raises(FloatingPointError, match="beta=0.5"):
        stand_in_trainer(0.5, False).compute_loss(model, inputs)


def test_the_synchronous_benchmarks_run_grpos_unweighted_k3_as_an_arm(tmp_path):
    """GRPO with `use_bias_correction_kl=False` is a GRPOConfig setting: benchmarks/learning.py and offpolicy.py
    build it as a method (TRL's default, True, for their GRPO arm)."""
    from benchmarks import learning, offpolicy

    s = learning.FULL
    kind, config = learning._config(s, "GRPO k3 unweighted", 0, str(tmp_path))
    assert kind == "grpo" and config.use_bias_correction_kl is False and config.beta == learning.KL_BETA
    assert learning._config(s, "GRPO", 0, str(tmp_path))[1].use_bias_correction_kl is True
    assert offpolicy.METHODS["GRPO k3 unweighted"]["use_bias_correction_kl"] is False
    assert offpolicy.METHODS["GRPO"].get("use_bias_correction_kl", True) is True
