#!/usr/bin/env bash
# RPG on DAPO-Math-17k, full fine-tuning on 8 GPUs with DeepSpeed ZeRO-3: the RPG paper's hyperparameters
# (Zhang et al., ICLR 2026, arXiv:2505.17508, Appendix H) in TRL terms, for 1.7B-8B models.
#
#   bash examples/recipes/rpg_math_8gpu.sh                                  # Qwen3-4B-Base, RPG-REINFORCE-URKL
#   MODEL=Qwen/Qwen3-1.7B-Base bash examples/recipes/rpg_math_8gpu.sh
#   MODEL=Qwen/Qwen3-8B-Base MICRO_BATCH=2 bash examples/recipes/rpg_math_8gpu.sh
#   DIVERGENCE=ufkl bash examples/recipes/rpg_math_8gpu.sh                  # RPG-REINFORCE-UFKL (Table 3)
#   ESTIMATOR=differentiable DIVERGENCE=rkl bash examples/recipes/rpg_math_8gpu.sh   # fully differentiable RPG
#   DRY_RUN=1 bash examples/recipes/rpg_math_8gpu.sh                        # print the command only
#   bash examples/recipes/rpg_math_8gpu.sh --max_steps 32 --report_to wandb # extra flags go to rpg_math.py
#
# The paper's setup and its TRL equivalent:
#   AdamW, lr 1e-6, weight decay 0.1, grad clip 1.0          --learning_rate 1e-6 --weight_decay 0.1 --max_grad_norm 1.0
#   512 prompts per rollout, 16 completions, temperature 1.0 --num_generations 16 --temperature 1.0, and
#                                                            generation_batch_size = 512 * 16 = 8192 completions
#   32 prompts per optimizer mini-batch (16 updates/rollout)  32 * 16 = 512 completions per optimizer step
#                                                            = 8 GPUs * MICRO_BATCH * gradient_accumulation_steps;
#                                                            steps_per_generation = 16 * gradient_accumulation_steps
#   400 training steps (rollouts), 10 warm-up, then constant --max_steps 6400 (400 rollouts * 16 optimizer steps)
#                                                            --warmup_steps 160 --lr_scheduler_type constant_with_warmup
#   beta 1e-4, clip (0.2, 0.28), dual-clip c = 10            RPGConfig defaults (--beta, --epsilon, --epsilon_high,
#                                                            --rpg_dual_clip_c)
#   4K context: rollouts of up to 4096 tokens                --max_completion_length 4096 (8192 for the 8K runs)
#   reward +1 correct, -1 otherwise (the authors' scorer)    paper_math_reward (rpg_math.py's reward)
#   DAPO dynamic sampling (on accuracy), soft overlong       --dynamic_sampling True --dynamic_sampling_metric
#   punishment                                               paper_math_reward --soft_punish_cache 1024
#   token-mean loss                                          --loss_type dapo (RPGConfig default)
#   mean@32 on AIME24 / AIME25 / AMC23                       --eval_num_samples 32 (bundled data)
# Rollouts use vLLM colocated with training (pip install vllm); USE_VLLM=False generates with transformers instead.
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${MODEL:-Qwen/Qwen3-4B-Base}
DATASET=${DATASET:-BytedTsinghua-SIA/DAPO-Math-17k}
DIVERGENCE=${DIVERGENCE:-urkl}
ESTIMATOR=${ESTIMATOR:-reinforce}
NUM_GPUS=${NUM_GPUS:-8}
MICRO_BATCH=${MICRO_BATCH:-4}                     # completions per GPU per forward/backward pass
PROMPTS_PER_STEP=${PROMPTS_PER_STEP:-32}          # prompts per optimizer step (the paper's mini-batch)
PROMPTS_PER_ROLLOUT=${PROMPTS_PER_ROLLOUT:-512}   # prompts per generation batch (the paper's batch size)
NUM_GENERATIONS=${NUM_GENERATIONS:-16}
ROLLOUTS=${ROLLOUTS:-400}
MAX_COMPLETION_LENGTH=${MAX_COMPLETION_LENGTH:-4096}
USE_VLLM=${USE_VLLM:-True}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/$(basename "$MODEL")-rpg-${ESTIMATOR}-${DIVERGENCE}}

COMPLETIONS_PER_STEP=$((PROMPTS_PER_STEP * NUM_GENERATIONS))
GRAD_ACCUM=$((COMPLETIONS_PER_STEP / (NUM_GPUS * MICRO_BATCH)))
if ((GRAD_ACCUM * NUM_GPUS * MICRO_BATCH != COMPLETIONS_PER_STEP)); then
  echo "PROMPTS_PER_STEP*NUM_GENERATIONS=$COMPLETIONS_PER_STEP is not a multiple of NUM_GPUS*MICRO_BATCH" >&2
  exit 1
fi
UPDATES_PER_ROLLOUT=$((PROMPTS_PER_ROLLOUT / PROMPTS_PER_STEP))
STEPS_PER_GENERATION=$((UPDATES_PER_ROLLOUT * GRAD_ACCUM))

CMD=(accelerate launch
  --config_file accelerate_configs/deepspeed_zero3.yaml
  --num_processes "$NUM_GPUS"
  examples/rpg_math.py
  --model_name_or_path "$MODEL"
  --dtype bfloat16
  --dataset_name "$DATASET"
  --output_dir "$OUTPUT_DIR"
  --rpg_divergence "$DIVERGENCE"
  --rpg_estimator "$ESTIMATOR"
  --rpg_reference sampling
  --beta 1e-4
  --epsilon 0.2
  --epsilon_high 0.28
  --rpg_dual_clip_c 10
  --loss_type dapo
  --scale_rewards none
  --learning_rate 1e-6
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
  --dynamic_sampling_max_rounds 8
  --gradient_checkpointing True
  --bf16 True
  --use_vllm "$USE_VLLM"
  --vllm_mode colocate
  --vllm_gpu_memory_utilization 0.35
  --logging_steps "$UPDATES_PER_ROLLOUT"
  --save_strategy steps
  --save_steps $((10 * UPDATES_PER_ROLLOUT))
  --save_total_limit 3
  --eval_num_samples 32
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
