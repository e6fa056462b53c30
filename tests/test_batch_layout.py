"""The inert-KL warning and the start-up line are true for the batch layout TRL actually runs (issue 27 section 2).

TRL 1.16 generates a batch every `steps_per_generation * num_iterations` micro-batches and closes an optimizer step
every `gradient_accumulation_steps`; a micro-batch is off-policy when an optimizer step closed since its batch was
generated (`describe.BatchLayout`). Each layout below is trained for one period of that schedule and the log-ratios
the loss receives are measured per micro-batch: `log w` (policy vs sampler) and `log r` (policy vs reference). The
line's off-policy count must be the measured one, and the config warns exactly when `log r = 0` at every token of
every micro-batch (the KL term then has zero expected gradient by construction).
"""

import logging
import warnings

import pytest
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset

import trl_rpg.trainers.trainer as trainer_module
from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.trainers.describe import batch_layout, describe_objective

INERT = "regularises nothing"

# (steps_per_generation, gradient_accumulation_steps, num_iterations, reference, off-policy micro-batches / period)
LAYOUTS = [
    (1, 1, 1, "sampling", "every micro-batch on-policy"),  # GRPO's on-policy layout
    (3, 2, 1, "sampling", "3 of every 6 micro-batches off-policy"),  # spg not a multiple of gas
    (2, 4, 2, "sampling", "every micro-batch on-policy"),  # a batch consumed twice inside one optimizer step
    (2, 3, 1, "sampling", "1 of every 6 micro-batches off-policy"),  # gas not a multiple of spg
    (2, 2, 2, "sampling", "2 of every 4 micro-batches off-policy"),  # reuse through num_iterations
    (4, 2, 1, "periodic-1", "2 of every 4 micro-batches off-policy"),  # reference refreshed after every step
    (4, 2, 1, "periodic-2", "2 of every 4 micro-batches off-policy"),
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def measured_log_ratios(monkeypatch):
    """Patch the trainer's loss to record, per training micro-batch, max |log w| and max |log r| over its tokens."""
    calls = []
    loss = trainer_module.rpg_per_token_loss

    def recording(logps, sampling_logps, advantages, mask, **kwargs):
        valid = mask != 0
        ref = kwargs.get("ref_logps")
        log_w = (logps.detach() - sampling_logps).abs()[valid].max().item()
        log_r = log_w if ref is None else (logps.detach() - ref).abs()[valid].max().item()
        calls.append((log_w, log_r))
        return loss(logps, sampling_logps, advantages, mask, **kwargs)

    monkeypatch.setattr(trainer_module, "rpg_per_token_loss", recording)
    return calls


def test_inert_kl_warning_and_start_line_follow_the_measured_log_ratios(tmp_path, model_path, monkeypatch, caplog):
    calls = measured_log_ratios(monkeypatch)
    for spg, gas, iterations, reference, off_policy_text in LAYOUTS:
        schedule = {"rpg_reference": "periodic", "rpg_reference_update_steps": int(reference[-1])} \
            if reference.startswith("periodic") else {}
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            args = RPGConfig(**cpu_args(tmp_path / f"{spg}-{gas}-{iterations}-{reference}", steps_per_generation=spg,
                                        gradient_accumulation_steps=gas, num_iterations=iterations, beta=0.1,
                                        learning_rate=0.05, **schedule))
        warned = any(INERT in str(r.message) for r in record)
        layout = batch_layout(args)
        args.max_steps = layout.micro_batches // gas  # one period of the schedule
        calls.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="trl_rpg"):
            RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset()).train()
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("RPGTrainer: optimising")]
        case = (spg, gas, iterations, reference, calls)
        assert len(calls) == layout.micro_batches, case
        off_policy = sum(log_w > 1e-3 for log_w, _ in calls)
        assert all(log_w == 0.0 or log_w > 1e-3 for log_w, _ in calls), case  # on-policy: exactly w = 1
        assert off_policy == layout.off_policy and off_policy_text in line, case
        inert = all(log_r == 0.0 for _, log_r in calls)
        assert warned == inert, case
        assert ("The KL term is 0 at every token here" in line) == inert, case  # urkl: exactly 0 (test_kl_claims)


def test_the_warning_says_why_the_kl_term_is_inert(tmp_path):
    with pytest.warns(UserWarning, match=INERT) as record:
        RPGConfig(**cpu_args(tmp_path, beta=0.1, rpg_reference="periodic", rpg_reference_update_steps=1))
    [text] = [str(r.message) for r in record if INERT in str(r.message)]
    assert "rpg_reference_update_steps=1" in text and "refreshed to the policy after every optimizer step" in text
    assert "exactly as with beta=0" in text  # urkl: the KL part is 0 at every token
    with pytest.warns(UserWarning, match=INERT) as record:
        RPGConfig(**cpu_args(tmp_path, beta=0.1, rpg_divergence="fkl", steps_per_generation=2,
                             gradient_accumulation_steps=4, num_iterations=2, loss_type="dr_grpo"))
    [text] = [str(r.message) for r in record if INERT in str(r.message)]
    assert "no optimizer step falls between a batch's generation and its use" in text
    assert "mean under the sampler is 0" in text  # fkl: +-beta*w per token, zero in expectation (fixed normaliser)
    with pytest.warns(UserWarning, match="regularises towards nothing you asked for") as record:  # dapo: issue 45
        RPGConfig(**cpu_args(tmp_path, beta=0.1, rpg_divergence="fkl", steps_per_generation=2,
                             gradient_accumulation_steps=4, num_iterations=2))
    [text] = [str(r.message) for r in record if "nothing you asked for" in str(r.message)]
    assert "length bias towards shorter completions" in text and "does not train as with beta=0" in text


def test_start_line_says_what_normalize_then_sum_trains(tmp_path):
    """TRL's normalize_then_sum: each function's (r - group mean) / group std, weighted sum, then (x - batch mean) /
    batch std; scale_rewards plays no part."""
    line = describe_objective(RPGConfig(**cpu_args(tmp_path, multi_objective_aggregation="normalize_then_sum")))
    assert ("advantages: each reward function's (reward - group mean) / group std, weighted and summed, then minus "
            "the batch mean and divided by the batch std") in line
    assert "scale_rewards='none' has no effect" in line and "reward - group mean (scale_rewards" not in line
