"""Everything that depends on TRL's (or transformers') internals lives here, so a TRL upgrade touches one file.

Tested against TRL 1.16 (`pyproject.toml` pins `trl>=1.16,<1.17`). `RPGTrainer` overrides these private
`GRPOTrainer` hooks:

- `_compute_loss(model, inputs)`: RPG's per-token loss replaces GRPO's (the method is monolithic in TRL 1.16).
- `_generate_and_score_completions(inputs)`: tags each generation batch with the reference version (and runs
  dynamic sampling).
- `_save_checkpoint` / `_load_optimizer_and_scheduler`: RPG state in checkpoints.
- `_calculate_rewards`: keeps the gathered rewards for dynamic sampling's group filter.

and reads these private attributes: `_buffered_inputs` and `_step` (the reused generation batch and the micro-step
counter of `GRPOTrainer._prepare_inputs`), `_metrics`, `_get_per_token_logps_and_entropies`,
`get_high_entropy_mask`, `get_off_policy_mask`, `current_gradient_accumulation_steps`, `aux_loss_enabled`; and,
for dynamic sampling, `state.stateful_callbacks`, `_tokenizer`, `reward_weights`, `multi_objective_aggregation`,
`shuffle_dataset`, `_remove_unused_columns`.
"""

from trl.trainer.utils import use_adapter

try:  # TRL 1.16
    from trl.models.utils import disable_gradient_checkpointing
except ImportError:  # pragma: no cover - older layouts
    from contextlib import nullcontext

    def disable_gradient_checkpointing(model, kwargs=None):
        return nullcontext()

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

#: Keys of a TRL generation batch that are forwarded to the model as multimodal inputs.
MULTIMODAL_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)



__all__ = [
    "MULTIMODAL_KEYS",
    "PREFIX_CHECKPOINT_DIR",
    "disable_gradient_checkpointing",
    "rotate_checkpoints",
    "use_adapter",
]
