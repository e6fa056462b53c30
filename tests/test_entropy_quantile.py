"""`top_entropy_quantile=q` other than 0.5 (at 0.5, q and 1 - q are the same number): policy gradient flows through
the highest-entropy fraction q of the tokens, the tokens GRPOTrainer trains on (TRL's `get_high_entropy_mask` takes
the quantile 1 - q as its threshold). Compared with GRPOTrainer on identical data as in
tests/test_grpo_equivalence.py (same tolerance, same reduction: beta=0, differentiable estimator, no dual clip)."""

import pytest
from _equivalence import (
    FixedGRPOTrainer,
    FixedRPGTrainer,
    base_settings,
    config_pair,
    make_trainer,
    max_difference,
    parameters,
    prompts,
)
from _tiny import save_tiny_model
from trl import GRPOTrainer

PARAM_ATOL = 1e-5  # tests/test_grpo_equivalence.py explains it (measured 0.0 for differentiable configurations)
MIN_MOVEMENT = 1e-2


class MaskRecordingGRPOTrainer(FixedGRPOTrainer):
    """Records the fraction of valid tokens TRL's high-entropy mask keeps."""

    def __init__(self, *args, **kwargs):
        self.kept = []
        super().__init__(*args, **kwargs)

    def get_high_entropy_mask(self, entropies, mask, threshold):
        kept = GRPOTrainer.get_high_entropy_mask(self, entropies, mask, threshold)
        self.kept.append(float((kept * mask).sum() / mask.sum()))
        return kept


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("model")))


def test_top_entropy_quantile_other_than_a_half_trains_like_grpo(tmp_path, model_dir):
    """q = 0.2: a fifth of the tokens carry policy gradient (with q and 1 - q swapped, four fifths would)."""
    settings = base_settings(top_entropy_quantile=0.2, max_steps=4)  # one generation batch, 4 optimizer steps
    grpo_args, rpg_args = config_pair(tmp_path, settings)
    grpo = make_trainer(MaskRecordingGRPOTrainer, model_dir, grpo_args, prompts(16))
    initial = parameters(grpo)
    grpo.train()
    rpg = make_trainer(FixedRPGTrainer, model_dir, rpg_args, prompts(16))
    rpg.train()
    assert max(grpo.kept) < 0.35  # TRL's mask kept the top fifth (ties at the quantile aside), not four fifths
    assert max_difference(parameters(grpo), initial) > MIN_MOVEMENT
    assert max_difference(parameters(grpo), parameters(rpg)) <= PARAM_ATOL
