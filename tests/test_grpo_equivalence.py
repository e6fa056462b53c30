"""RPGTrainer trains exactly like GRPOTrainer where the theory says it must (issue 11, section 1).

The reduction: with `rpg_estimator="differentiable"`, `beta=0` and `rpg_dual_clip_c=None`, RPG's per-token loss is
`max(-w A, -clip(w, 1 - eps_low, 1 + eps_high) A)` (docs/math.md section 3, Algorithm 1 without the dual bound and
without the KL term), which is GRPO/DAPO's clipped surrogate `-min(w A, clip(w) A)`; the aggregation (`loss_type`),
the masks (entropy, off-policy, truncation), the entropy bonus and the accumulation scaling are TRL's. So, on the
same data, the two trainers must end with the same parameters, and log the same loss and eval loss.

How the comparison is made exact and not flaky (see tests/_equivalence.py): completions are a fixed function of the
prompt in both trainers; both configs come from one dict and every GRPOConfig field is checked equal; the optimizer
is plain SGD with a constant learning rate and no gradient clipping, so a wrong constant factor in the loss (e.g. a
missing accumulation factor) moves the parameters by a different amount (AdamW and norm clipping are scale
invariant and would hide it). The layout is `gradient_accumulation_steps=2` with `steps_per_generation=8`: each
generation batch serves 4 optimizer steps, 3 of them off-policy (w != 1), and the learning rate is large enough
that the clip regions are entered (asserted below).

Tolerances: float32 runs must agree to PARAM_ATOL = 1e-5 in every parameter (the parameters are O(0.1-1); 1e-5
is ~100 float32 ulps, room for a different but equivalent order of float operations). Measured: 0.0 for every
differentiable configuration (the two compute the same float operations), 1.2e-7 for RPG-REINFORCE and
`importance_sampling_level="sequence"`. Every run moves some parameter by more than MIN_MOVEMENT = 1e-2 (1000 x
the tolerance; measured 0.026-0.21), so a real difference cannot hide under the tolerance. The bf16 tolerance is
explained at `test_bf16_autocast_matches_grpo`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from _equivalence import (
    FixedGRPOTrainer,
    FixedRPGTrainer,
    base_settings,
    config_pair,
    logged,
    lora_config,
    make_trainer,
    max_difference,
    parameters,
    prompts,
    three_rewards,
)
from _processes import free_port as _free_port
from _tiny import length_reward, save_tiny_model
from trl import GRPOTrainer

PARAM_ATOL = 1e-5
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-7
MIN_MOVEMENT = 1e-2
LEARNING_RATE = 0.3  # SGD; |log w| stays below ~1 (far from RPG's log-ratio clamp at 20, which GRPO does not have)
EPS_LOW, EPS_HIGH = 0.2, 0.28

ROOT = Path(__file__).resolve().parents[1]
DDP_SCRIPT = ROOT / "tests" / "distributed" / "equivalence_script.py"
#: The pairs trained under DDP: dapo's normaliser divides the all-process token count by the number of processes,
#: and the entropy quantile is taken over the tokens of all processes; bnpo's token-mean is per process; grpo and
#: dr_grpo normalise per sequence and by the configured length; the off-policy mask, sequence-level importance
#: sampling and the masking of truncated completions act on each process's rows. dr_grpo's normaliser (rows x
#: max_completion_length) makes its steps small: at lr 2.0 its clip is active, as every run here asserts.
DDP_RUNS = [
    {"name": "dapo", "settings": {"loss_type": "dapo"}},
    {"name": "bnpo", "settings": {"loss_type": "bnpo"}},
    {"name": "grpo", "settings": {"loss_type": "grpo"}},
    {"name": "dr_grpo", "settings": {"loss_type": "dr_grpo", "scale_rewards": "none", "learning_rate": 2.0}},
    {"name": "entropy", "settings": {"top_entropy_quantile": 0.5, "entropy_coef": 0.1}},
    {"name": "off_policy_mask", "settings": {"off_policy_mask_threshold": 0.02}},
    {"name": "sequence", "settings": {"importance_sampling_level": "sequence"}},
    {"name": "mask_truncated", "settings": {"mask_truncated_completions": True}},
    # the controller's entropy is the mean over all processes' tokens. The target lies between the two processes'
    # own entropies at steps 3 and 4 (measured 3.79500 / 3.79571, then 3.79605 / 3.79448), so a controller fed one
    # process's mean decides differently; the all-process means stay >= 3.4e-4 from it at every step (3.79537 and
    # 3.79522 there), far above the ~1e-7 by which GRPO's and RPG's ways of averaging can differ
    {"name": "adaptive_entropy", "settings": {"use_adaptive_entropy": True, "entropy_coef": 0.01,
                                              "entropy_target": 3.7957, "entropy_coef_delta": 0.005,
                                              "entropy_coef_min": 0.0, "entropy_coef_max": 0.05}},
    # evaluation: dapo's eval normaliser counts the eval batch's tokens over all processes
    {"name": "eval", "eval_size": 8, "settings": {"eval_strategy": "steps", "eval_steps": 4,
                                                  "per_device_eval_batch_size": 4, "entropy_coef": 0.1}},
    {"name": "bf16", "settings": {"bf16": True}},
    # RPG-REINFORCE: GRPO's gradient, a different logged loss (see the single-process test)
    {"name": "reinforce", "rpg": {"rpg_estimator": "reinforce"}},
    # rewards are scored on each process and gathered before the advantages
    {"name": "three_rewards", "three_rewards": True,
     "settings": {"reward_weights": [1.0, 0.5, -0.3], "multi_objective_aggregation": "normalize_then_sum"}},
    {"name": "lora", "peft": True, "settings": {"learning_rate": 3.0}},  # adapters start at 0: lr for an active clip
]

#: GRPO runs shared by several tests (a GRPOTrainer result depends only on its settings).
_GRPO_RUNS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("equivalence_model")))


@pytest.fixture(scope="module")
def initial(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


class MaskRecordingGRPOTrainer(FixedGRPOTrainer):
    """Records the off-policy sequence mask TRL computes (its public `get_off_policy_mask`) at each call."""

    def __init__(self, *args, **kwargs):
        self.off_policy_masks = []
        super().__init__(*args, **kwargs)

    def get_off_policy_mask(self, *args, **kwargs):
        mask = GRPOTrainer.get_off_policy_mask(*args, **kwargs)
        self.off_policy_masks.append(mask.detach().flatten().cpu())
        return mask


def train(trainer_cls, model_dir, args, train_size=16, eval_dataset=None, **trainer_kwargs) -> dict:
    trainer = make_trainer(trainer_cls, model_dir, args, prompts(train_size), eval_dataset=eval_dataset,
                           **trainer_kwargs)
    trainer.train()
    result = {"params": parameters(trainer), "history": trainer.state.log_history, "loss": logged(trainer, "loss"),
              "eval_loss": logged(trainer, "eval_loss"), "mixed_precision": trainer.accelerator.mixed_precision}
    if hasattr(trainer, "off_policy_masks"):
        result["off_policy_masks"] = trainer.off_policy_masks
    return result


def run_pair(tmp_path, model_dir, settings: dict, grpo_cls=FixedGRPOTrainer, eval_dataset=None, trainer_kwargs=None,
             **rpg_settings):
    """GRPO then RPG on the same settings; `trainer_kwargs` (reward functions, `peft_config`) go to both trainers."""
    grpo_args, rpg_args = config_pair(tmp_path, settings, **rpg_settings)
    trainer_kwargs = trainer_kwargs or {}
    key = repr(sorted(settings.items())) + grpo_cls.__name__ + repr(eval_dataset is not None) + repr(trainer_kwargs)
    if key not in _GRPO_RUNS:
        _GRPO_RUNS[key] = train(grpo_cls, model_dir, grpo_args, eval_dataset=eval_dataset, **trainer_kwargs)
    rpg = train(FixedRPGTrainer, model_dir, rpg_args, eval_dataset=eval_dataset, **trainer_kwargs)
    return _GRPO_RUNS[key], rpg


def assert_same_parameters(grpo, rpg, initial, what, atol=PARAM_ATOL):
    diff = max_difference(grpo["params"], rpg["params"])
    moved = max_difference(grpo["params"], initial)
    print(f"[equivalence] {what}: max |RPG - GRPO| parameter difference {diff:.3g} (tolerance {atol:.3g}); "
          f"max movement from the initial parameters {moved:.3g}")
    assert moved > max(MIN_MOVEMENT, 100 * atol), f"{what}: parameters barely moved ({moved})"
    assert diff <= atol, f"{what}: RPG and GRPO parameters differ by {diff} (> {atol})"


def assert_same_values(got: dict, want: dict, what: str, rtol=LOSS_RTOL, atol=LOSS_ATOL):
    assert want and got.keys() == want.keys(), (what, sorted(got), sorted(want))
    for step, value in want.items():
        assert abs(got[step] - value) <= atol + rtol * abs(value), (what, step, got[step], value)


def clipped_fraction(result) -> float:
    """The largest fraction of tokens in a clip region (rpg/clip_frac_high + low) over the optimizer steps."""
    high, low = logged_in(result, "rpg/clip_frac_high"), logged_in(result, "rpg/clip_frac_low")
    return max(high[s] + low[s] for s in high)


def logged_in(result, key) -> dict[int, float]:
    return {int(e["step"]): e[key] for e in result["history"] if key in e}


def logged_where(rpg, grpo, key) -> tuple[dict[int, float], dict[int, float]]:
    """RPG's and GRPO's values of a generation-time metric at the steps GRPO logs it (the steps that generated a
    batch; RPGTrainer also logs it on the steps that reuse the batch)."""
    want = logged_in(grpo, key)
    got = logged_in(rpg, key)
    assert set(want) <= set(got)
    return {step: got[step] for step in want}, want


# ----------------------------------------------------------------------------------------------------------------
# The four aggregations, with gradient accumulation and batch reuse
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type,scale_rewards", [("dapo", "group"), ("bnpo", "batch"), ("grpo", "group"),
                                                     ("dr_grpo", "none")])
def test_each_aggregation_trains_like_grpo(tmp_path, model_dir, initial, loss_type, scale_rewards):
    """gradient_accumulation_steps=2, 4 optimizer steps per generation batch: a wrong accumulation factor in any
    aggregation (e.g. dapo's normaliser without `gradient_accumulation_steps`, bnpo without `/ accumulation`)
    scales the gradient and the SGD step, and the parameters differ."""
    settings = base_settings(loss_type=loss_type, scale_rewards=scale_rewards, learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings)
    assert_same_parameters(grpo, rpg, initial, f"loss_type={loss_type}, scale_rewards={scale_rewards}")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")
    assert len(rpg["loss"]) == 8
    # the batches were off-policy and the clip regions were entered, so the clipped surrogate was compared
    w_max = logged_in(rpg, "rpg/w_max")
    assert w_max[1] == pytest.approx(1.0) and max(w_max.values()) > 1 + EPS_HIGH
    assert clipped_fraction(rpg) > 0.05


# ----------------------------------------------------------------------------------------------------------------
# GRPO features that act on the loss
# ----------------------------------------------------------------------------------------------------------------


def test_entropy_bonus_trains_like_grpo(tmp_path, model_dir, initial):
    """`entropy_coef`: loss - coef * mean entropy / accumulation (catches a wrong sign or scaling of the bonus)."""
    grpo, rpg = run_pair(tmp_path, model_dir, base_settings(entropy_coef=0.1, learning_rate=LEARNING_RATE))
    assert_same_parameters(grpo, rpg, initial, "entropy_coef=0.1")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


def test_top_entropy_quantile_trains_like_grpo(tmp_path, model_dir, initial):
    """`top_entropy_quantile=0.5`: only the highest-entropy half of the tokens carries policy gradient."""
    grpo, rpg = run_pair(tmp_path, model_dir, base_settings(top_entropy_quantile=0.5, learning_rate=LEARNING_RATE))
    assert_same_parameters(grpo, rpg, initial, "top_entropy_quantile=0.5")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


def test_top_entropy_quantile_with_entropy_bonus_trains_like_grpo(tmp_path, model_dir, initial):
    """Both: the entropy bonus then averages over the high-entropy tokens only."""
    settings = base_settings(top_entropy_quantile=0.5, entropy_coef=0.1, learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings)
    assert_same_parameters(grpo, rpg, initial, "top_entropy_quantile=0.5, entropy_coef=0.1")


def test_off_policy_mask_trains_like_grpo(tmp_path, model_dir, initial):
    """`off_policy_mask_threshold`: negative-advantage sequences whose mean log(mu / pi) exceeds the threshold carry
    no loss. The threshold is chosen so that the mask really drops sequences (asserted from TRL's own mask)."""
    settings = base_settings(off_policy_mask_threshold=0.02, learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings, grpo_cls=MaskRecordingGRPOTrainer)
    masks = torch.cat(grpo["off_policy_masks"])
    dropped = (masks == 0).sum().item()
    print(f"[equivalence] off-policy mask dropped {dropped} of {masks.numel()} sequence-steps")
    assert dropped >= 4, "the off-policy mask never dropped a sequence: the comparison would prove nothing"
    assert_same_parameters(grpo, rpg, initial, "off_policy_mask_threshold=0.02")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


def test_sequence_level_importance_sampling_trains_like_grpo(tmp_path, model_dir, initial):
    """`importance_sampling_level="sequence"` (GSPO): every token shares the length-normalised sequence ratio."""
    settings = base_settings(importance_sampling_level="sequence", learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings)
    assert_same_parameters(grpo, rpg, initial, "importance_sampling_level=sequence")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


def test_masked_truncated_completions_train_like_grpo(tmp_path, model_dir, initial):
    """`mask_truncated_completions=True`: completions without EOS (here those of max_completion_length tokens)
    carry no loss; some really are truncated (TRL's `completions/clipped_ratio`)."""
    settings = base_settings(mask_truncated_completions=True, learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings)
    assert max(logged_in(grpo, "completions/clipped_ratio").values()) > 0
    assert_same_parameters(grpo, rpg, initial, "mask_truncated_completions=True")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_eval_loss_matches_grpo(tmp_path, model_dir, initial, loss_type):
    """An eval set evaluated every 4 steps (`eval_strategy="steps"`): same eval loss at each evaluation.

    In evaluation nothing is accumulated: dapo normalises by the eval batch's tokens per process, bnpo by the
    micro-batch's, neither divides by gradient_accumulation_steps. Evaluation is on-policy (w = 1), where the
    clipped surrogate's value is -A whatever the parameters; the entropy bonus makes the eval loss depend on the
    evaluated model (asserted: it changes between the evaluations)."""
    settings = base_settings(loss_type=loss_type, eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=8,
                             entropy_coef=0.1, learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings, eval_dataset=prompts(8, offset=50))
    assert sorted(grpo["eval_loss"]) == [4, 8]
    assert grpo["eval_loss"][4] != grpo["eval_loss"][8]  # the evaluated model changed in between
    assert_same_values(rpg["eval_loss"], grpo["eval_loss"], "eval loss")
    assert_same_parameters(grpo, rpg, initial, f"loss_type={loss_type}, with an eval set")


# ----------------------------------------------------------------------------------------------------------------
# GRPO features around the loss: several weighted rewards, LoRA, gradient checkpointing, num_iterations
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_several_weighted_reward_functions_train_like_grpo(tmp_path, model_dir, initial, aggregation):
    """Three reward functions (sync, sync, async instance) with `reward_weights` (one negative) and each
    `multi_objective_aggregation`: RPG's checked reward wrappers and its reward capture must hand TRL the same
    rewards, in the same order, as GRPO's own calls (catches a dropped weight, a reordered or double-called
    function, a wrapper that breaks async)."""
    settings = base_settings(reward_weights=[1.0, 0.5, -0.3], multi_objective_aggregation=aggregation,
                             learning_rate=LEARNING_RATE)
    rewards = three_rewards()
    grpo, rpg = run_pair(tmp_path, model_dir, settings, trainer_kwargs={"reward": rewards})
    for name in ("length_reward", "first_character_reward", "distinct_characters"):
        for stat in ("mean", "std"):
            got, want = logged_where(rpg, grpo, f"rewards/{name}/{stat}")
            assert got == want
        assert max(logged_in(grpo, f"rewards/{name}/std").values()) > 0  # each function takes part
    got, want = logged_where(rpg, grpo, "reward")
    assert got == want
    assert_same_parameters(grpo, rpg, initial, f"3 weighted rewards, {aggregation}")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


def test_reward_model_trains_like_grpo(tmp_path, model_dir, initial):
    """A reward model (a local sequence-classification model given by path, which TRL loads and scores with its own
    tokenizer) next to a reward function: RPG leaves model rewards to TRL and wraps only the callables."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    reward_model_dir = tmp_path / "reward_model"
    if not reward_model_dir.exists():
        config = AutoConfig.from_pretrained(model_dir, num_labels=1)
        config.pad_token_id = AutoTokenizer.from_pretrained(model_dir).pad_token_id
        torch.manual_seed(1)
        AutoModelForSequenceClassification.from_config(config).save_pretrained(reward_model_dir)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(reward_model_dir)
    rewards = [str(reward_model_dir), length_reward]
    settings = base_settings(reward_weights=[2.0, 1.0], learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings, trainer_kwargs={"reward": rewards})
    model_means = logged_in(grpo, "rewards/reward_model/mean")
    assert model_means and len(set(model_means.values())) > 1  # the reward model scored, differently per batch
    assert logged_where(rpg, grpo, "rewards/reward_model/mean")[0] == model_means
    assert_same_parameters(grpo, rpg, initial, "reward model + reward function")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


def assert_same_lora_parameters(grpo, rpg, what):
    adapters = [n for n in rpg["params"] if "lora_" in n]
    assert adapters and grpo["params"].keys() == rpg["params"].keys()
    diff = max_difference(grpo["params"], rpg["params"])
    trained = max(grpo["params"][n].abs().max().item() for n in adapters if "lora_B" in n)  # B starts at 0
    print(f"[equivalence] {what}: max |RPG - GRPO| parameter difference {diff:.3g}; largest lora_B entry "
          f"{trained:.3g}")
    assert trained > max(MIN_MOVEMENT, 100 * PARAM_ATOL), f"{what}: the adapters barely trained"
    assert diff <= PARAM_ATOL, f"{what}: RPG and GRPO parameters differ by {diff}"


def test_lora_trains_like_grpo(tmp_path, model_dir):
    """`peft_config` (LoRA on the attention projections): the adapters train to GRPO's; the base stays frozen."""
    grpo, rpg = run_pair(tmp_path, model_dir, base_settings(learning_rate=LEARNING_RATE),
                         trainer_kwargs={"peft_config": lora_config()})
    assert_same_lora_parameters(grpo, rpg, "LoRA")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


def test_gradient_checkpointing_trains_like_grpo(tmp_path, model_dir, initial):
    """`gradient_checkpointing=True`: activations are recomputed in backward; nothing else may change."""
    grpo, rpg = run_pair(tmp_path, model_dir, base_settings(gradient_checkpointing=True, learning_rate=LEARNING_RATE))
    assert_same_parameters(grpo, rpg, initial, "gradient_checkpointing")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


# vLLM generation and its importance-sampling correction, every mode: tests/test_vllm_generation.py (TRL's real
# vLLM path with a fake engine).


def test_num_iterations_trains_like_grpo(tmp_path, model_dir, initial):
    """`num_iterations=2` with `steps_per_generation=4`: each generation batch is iterated twice, 2 optimizer steps
    per pass (TRL's own reuse, beside RPG's `rpg_generation_reuse`, which sets `steps_per_generation`)."""
    settings = base_settings(num_iterations=2, steps_per_generation=4, learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings)
    w_max = logged_in(rpg, "rpg/w_max")
    assert w_max[1] == pytest.approx(1.0) and max(w_max.values()) > 1.0  # reused batches were off-policy
    assert_same_parameters(grpo, rpg, initial, "num_iterations=2")
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss")


# ----------------------------------------------------------------------------------------------------------------
# Mixed precision
# ----------------------------------------------------------------------------------------------------------------


def test_bf16_autocast_matches_grpo(tmp_path, model_dir, initial):
    """`bf16=True, use_cpu=True`: accelerate's CPU bf16 autocast; master parameters stay float32.

    Both trainers run the model's matmuls in bf16 and get float32 log-probs and entropies from TRL's fused LM head;
    the per-token objective is float32 in both (RPG upcasts anything narrower). Tolerance: every gradient is only
    accurate to bf16's relative precision 2^-8 (its matmuls), so two correct implementations whose float32
    arithmetic differed by one rounding could legitimately see each gradient element differ by up to ~2^-8 of
    itself, i.e. parameters by up to 2^-8 of their total movement: BF16_ATOL = 2^-8 x max movement (~3e-4 here).
    A real discrepancy (a factor, a mask, a sign) changes the update by O(1) of the movement. Measured: 0.0.
    """
    grpo, rpg = run_pair(tmp_path, model_dir, base_settings(bf16=True, learning_rate=LEARNING_RATE))
    moved = max_difference(grpo["params"], initial)
    assert_same_parameters(grpo, rpg, initial, "bf16 autocast", atol=2.0 ** -8 * moved)
    assert_same_values(rpg["loss"], grpo["loss"], "logged loss", rtol=2.0 ** -7, atol=1e-4)
    assert grpo["mixed_precision"] == rpg["mixed_precision"] == "bf16"


# ----------------------------------------------------------------------------------------------------------------
# RPG-REINFORCE
# ----------------------------------------------------------------------------------------------------------------


def test_rpg_reinforce_without_kl_and_dual_clip_has_grpo_gradient(tmp_path, model_dir, initial):
    """RPG-REINFORCE with beta=0 and no dual clip trains exactly like GRPO's clipped surrogate.

    With beta=0, C_bar = 0 and A' = A, so the clip table (docs/math.md section 3) gives the per-token coefficient
    g (loss gradient -g grad log pi): g = w A where A >= 0 and w < 1 + eps_high, or A < 0 and w > 1 - eps_low;
    g = 0 otherwise. PPO's `-min(w A, clip(w) A)` has gradient `-w A grad log pi` exactly where the unclipped term
    attains the min, i.e. A > 0 and w <= 1 + eps_high, or A < 0 and w >= 1 - eps_low, and 0 where the clipped
    constant does. The two agree everywhere except on the boundaries w = 1 + eps_high and w = 1 - eps_low
    exactly (a measure-zero set never hit here), so the gradients, hence the trained parameters, are equal.

    The logged losses differ: RPG-REINFORCE's loss is the stop-gradient surrogate `-SG(g) * log pi` (aggregated),
    whose value is the coefficient times the negative log-probability (tokens in a clip region contribute 0), not
    the PPO objective `-min(w A, clip(w) A)` GRPO logs; only their gradients coincide.
    """
    settings = base_settings(learning_rate=LEARNING_RATE)
    grpo, rpg = run_pair(tmp_path, model_dir, settings, rpg_estimator="reinforce")
    assert_same_parameters(grpo, rpg, initial, "RPG-REINFORCE, beta=0, no dual clip")
    assert clipped_fraction(rpg) > 0.05  # the zero-gradient regions were exercised
    differing = [s for s in grpo["loss"] if abs(rpg["loss"][s] - grpo["loss"][s]) > 1e-3]
    assert len(differing) == len(grpo["loss"]), "RPG-REINFORCE's surrogate value should not equal GRPO's loss"


# ----------------------------------------------------------------------------------------------------------------
# Two processes (DDP on CPU)
# ----------------------------------------------------------------------------------------------------------------


def _ddp_cpu_config(directory: Path) -> Path:
    """The shipped DDP config (accelerate_configs/multi_gpu.yaml) on 2 CPU processes, without mixed precision."""
    config = yaml.safe_load((ROOT / "accelerate_configs" / "multi_gpu.yaml").read_text())
    config.update({"use_cpu": True, "num_processes": 2, "mixed_precision": "no"})
    path = directory / "ddp_cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, model_dir):
    """One `accelerate launch` (2 processes): for each of DDP_RUNS, GRPOTrainer then RPGTrainer."""
    directory = tmp_path_factory.mktemp("equivalence_ddp")
    spec = {"model_dir": model_dir, "output_dir": str(directory / "out"), "result": str(directory / "result"),
            "train_size": 32, "runs": DDP_RUNS}
    (directory / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(_ddp_cpu_config(directory)),
           "--main_process_port", str(_free_port()), str(DDP_SCRIPT), str(directory / "spec.json")]
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=600, cwd=directory)
    print(f"[equivalence] DDP launch: {time.perf_counter() - start:.1f} s")
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{output}")
    from safetensors.torch import load_file

    ranks = []
    for rank in range(2):
        logs = json.loads(Path(f"{spec['result']}.rank{rank}.json").read_text())
        for run in DDP_RUNS:
            for kind in ("grpo", "rpg"):
                logs[run["name"]][kind]["params"] = load_file(f"{spec['result']}.{run['name']}.{kind}.rank{rank}"
                                                              ".safetensors")
        ranks.append(logs)
    return ranks


@pytest.mark.distributed
@pytest.mark.parametrize("name", [run["name"] for run in DDP_RUNS])
def test_ddp_two_processes_train_like_grpo(ddp, initial, name):
    """Two processes, each with the single-process layout (so the global batch doubles): RPG equals GRPO on every
    rank, and DDP keeps the ranks' parameters identical."""
    for rank, logs in enumerate(ddp):
        grpo, rpg = logs[name]["grpo"], logs[name]["rpg"]
        assert grpo["num_processes"] == rpg["num_processes"] == 2
        by_step = {key: ({int(k): v for k, v in grpo[key].items()}, {int(k): v for k, v in rpg[key].items()})
                   for key in ("loss", "eval_loss", "entropy_coef")}
        if name == "adaptive_entropy":  # first: a controller decision that differs moves the coefficient by delta
            coefficients = by_step["entropy_coef"][0]
            assert len(set(coefficients.values())) > 2  # the controller moved the coefficient up and down
            assert_same_values(by_step["entropy_coef"][1], coefficients, f"DDP rank {rank} entropy_coef")
        if name == "lora":  # adapter parameters: compared as in test_lora_trains_like_grpo
            assert_same_lora_parameters(grpo, rpg, f"DDP rank {rank}, lora")
        elif name == "bf16":  # tolerances of test_bf16_autocast_matches_grpo
            assert grpo["mixed_precision"] == rpg["mixed_precision"] == "bf16"
            moved = max_difference(grpo["params"], initial)
            assert_same_parameters(grpo, rpg, initial, f"DDP rank {rank}, {name}", atol=2.0 ** -8 * moved)
            assert_same_values(by_step["loss"][1], by_step["loss"][0], "logged loss", rtol=2.0 ** -7, atol=1e-4)
        else:
            assert_same_parameters(grpo, rpg, initial, f"DDP rank {rank}, {name}")
        if name not in ("bf16", "reinforce"):
            assert_same_values(by_step["loss"][1], by_step["loss"][0], f"DDP rank {rank} logged loss")
        if name in ("entropy", "adaptive_entropy"):  # GRPO logs policy_loss with an entropy bonus: the mean over
            # processes of each process's policy loss (RPG: a sum over processes / processes, not a mean of a mean)
            grpo_policy, rpg_policy = ({int(k): v for k, v in run["policy_loss"].items()} for run in (grpo, rpg))
            assert len(grpo_policy) == 8
            assert_same_values(rpg_policy, grpo_policy, f"DDP rank {rank} policy_loss")
        if name == "eval":
            assert sorted(by_step["eval_loss"][0]) == [4, 8]
            assert_same_values(by_step["eval_loss"][1], by_step["eval_loss"][0], f"DDP rank {rank} eval loss")

        assert max(h + low for h, low in zip(rpg["clip_frac_high"].values(), rpg["clip_frac_low"].values())) > 0
    assert max_difference(ddp[0][name]["rpg"]["params"], ddp[1][name]["rpg"]["params"]) == 0.0
