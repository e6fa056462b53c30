#!/usr/bin/env bash
# RPG on DAPO-Math-17k with LoRA on one GPU: the paper's recipe (arXiv:2505.17508, Appendix H) scaled to one device.
# The objective, clip, reference, temperature, 16 completions per prompt, 16 optimizer steps per rollout, dynamic
# sampling (keeping the groups whose paper_math_reward varies, as DAPO does), the reward (+1 correct, -1 otherwise)
# and the soft overlong punishment are the paper's; the batch is smaller (64 prompts per rollout, 4 per optimizer
# step) and the learning rate is LoRA-sized (1e-5 instead of the full fine-tuning 1e-6).
#
#   bash examples/recipes/rpg_math_1gpu_lora.sh                             # Qwen3-1.7B-Base, RPG-REINFORCE-URKL
#   MODEL=Qwen/Qwen3-4B-Base bash examples/recipes/rpg_math_1gpu_lora.sh
#   DRY_RUN=1 bash examples/recipes/rpg_math_1gpu_lora.sh                   # print the command only
#   bash examples/recipes/rpg_math_1gpu_lora.sh --max_steps 64              # extra flags go to rpg_math.py
#
# With rpg_reference=sampling (the default) no reference model is loaded at all; with a moving reference
# (periodic/adaptive) the reference is a frozen copy of the adapter, not a second model.
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${MODEL:-Qwen/Qwen3-1.7B-Base}
DATASET=${DATASET:-BytedTsinghua-SIA/DAPO-Math-17k}
DIVERGENCE=${DIVERGENCE:-urkl}
ESTIMATOR=${ESTIMATOR:-reinforce}
MICRO_BATCH=${MICRO_BATCH:-8}                     # completions per forward/backward pass
PROMPTS_PER_STEP=${PROMPTS_PER_STEP:-4}
PROMPTS_PER_ROLLOUT=${PROMPTS_PER_ROLLOUT:-64}
NUM_GENERATIONS=${NUM_GENERATIONS:-16}
ROLLOUTS=${ROLLOUTS:-400}
MAX_COMPLETION_LENGTH=${MAX_COMPLETION_LENGTH:-4096}
USE_VLLM=${USE_VLLM:-True}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/$(basename "$MODEL")-rpg-lora-${ESTIMATOR}-${DIVERGENCE}}

GRAD_ACCUM=$((PROMPTS_PER_STEP * NUM_GENERATIONS / MICRO_BATCH))
UPDATES_PER_ROLLOUT=$((PROMPTS_PER_ROLLOUT / PROMPTS_PER_STEP))
STEPS_PER_GENERATION=$((UPDATES_PER_ROLLOUT * GRAD_ACCUM))

CMD=(accelerate launch
  --config_file accelerate_configs/single_process.yaml
  examples/rpg_math.py
  --model_name_or_path "$MODEL"
  --dtype bfloat16
  --use_peft True
  --lora_r 64
  --lora_alpha 128
  --lora_dropout 0.0
  --lora_target_modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
  --dataset_name "$DATASET"
  --output_dir "$OUTPUT_DIR"
  --rpg_divergence "$DIVERGENCE"
  --rpg_estimator "$ESTIMATOR"
  --beta 1e-4
  --epsilon 0.2
  --epsilon_high 0.28
  --rpg_dual_clip_c 10
  --learning_rate 1e-5
  --weight_decay 0.1
  --max_grad_norm 1.0
  --lr_scheduler_type constant_with_warmup
  --warmup_steps $((10 * UPDATES_PER_ROLLOUT))
  --max_steps $((ROLLOUTS * UPDATES_PER_ROLLOUT))
  --per_device_train_batch_size "$MICRO_BATCH"
  --gradient_accumulation_steps "$GRAD_ACCUM"
  --steps_per_generation "$STEPS_PER_GENERATION"
  --num_generations "$NUM_GENERATIONS"
  --temperature 1.0
  --max_completion_length "$MAX_COMPLETION_LENGTH"
  --soft_punish_cache 1024
  --dynamic_sampling True
  --dynamic_sampling_metric paper_math_reward
  --gradient_checkpointing True
  --bf16 True
  --use_vllm "$USE_VLLM"
  --vllm_mode colocate
  --vllm_gpu_memory_utilization 0.3
  --logging_steps "$UPDATES_PER_ROLLOUT"
  --save_strategy steps
  --save_steps $((20 * UPDATES_PER_ROLLOUT))
  --save_total_limit 2
  --eval_num_samples 8
  --eval_max_new_tokens "$MAX_COMPLETION_LENGTH"
  --seed 42
  "$@"
)

if [[ -n "${DRY_RUN:-}" ]]; then
  printf '%q ' "${CMD[@]}"
  echo
  exit 0
fi
exec "${CMD[@]}"
