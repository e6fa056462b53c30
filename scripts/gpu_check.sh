#!/usr/bin/env bash
# RPG vs GRPO (beta > 0) under DeepSpeed ZeRO-3 on one GPU: tokens per second and peak GPU memory, and their ratios.
#
#   bash scripts/gpu_check.sh              # CUDA machine: random ~0.5B Qwen2-shaped model, bf16, a few minutes
#   bash scripts/gpu_check.sh --dry-run    # no GPU needed: tiny model, fp32, DeepSpeed on CPU; checks the plumbing
#                                          # (needs DeepSpeed, which the test extra installs and the demo's does not:
#                                          # pip install -e ".[deepspeed]"; its first run in a new environment takes
#                                          # about twice the time docs/distributed.md states)
#   bash scripts/gpu_check.sh --with-rpg-initial   # also RPG with a reference model (rpg_reference="initial")
#   bash scripts/gpu_check.sh --vllm       # instead: tests/test_vllm_generation.py's claims with real vLLM (colocate,
#                                          # one GPU, vLLM installed; scripts/vllm_check.py); with --dry-run: on CPU
#                                          # with the fake engine of tests/vllm_stub (plumbing only)
#   bash scripts/gpu_check.sh --async      # instead: AsyncRPGTrainer with TRL's real rollout worker, a real `vllm serve`
#                                          # (started here, LoRA sync) and the FA3 kernel (scripts/async_check.py);
#                                          # with --dry-run: on CPU with the tests' stand-ins, no server (plumbing only)
#   bash scripts/gpu_check.sh --vllm-cost  # instead: the training side of rpg_sampler_logps="engine" against
#                                          # "recompute" and GRPO with vLLM (python -m benchmarks.cost_vllm --device
#                                          # cuda; writes benchmarks/results/cost_vllm_cuda.json); with --dry-run: one
#                                          # quick repetition on CPU with the fake engine (plumbing only)
#
# Environment: KEEP=1 keeps the work directory (model, per-run JSON); GPU=<index> picks the GPU (default 0).
# Nothing is downloaded: the model is randomly initialised and saved locally first.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
VLLM=0
ASYNC=0
VLLM_COST=0
TRAINERS=(rpg grpo)
for arg in "$@"; do
  case "$arg" in
    --dry-run|--tiny) DRY_RUN=1 ;;
    --with-rpg-initial) TRAINERS+=(rpg-initial) ;;
    --vllm) VLLM=1 ;;
    --async) ASYNC=1 ;;
    --vllm-cost) VLLM_COST=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-python}"
# DeepSpeed is for the ZeRO-3 comparison only: --vllm and --async (TRL's asynchronous trainer) do not use it
if [ "$VLLM" = 0 ] && [ "$ASYNC" = 0 ] && ! "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"; then
  echo "[gpu_check] needs DeepSpeed (both trainers run under ZeRO-3, on CPU with --dry-run too), which $PYTHON cannot" \
       "import: pip install -e \".[deepspeed]\" (the test extra has it; the demo's does not)" >&2
  exit 1
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rpg_gpu_check.XXXXXX")"
cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "[gpu_check] kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

CONFIG="$ROOT/accelerate_configs/deepspeed_zero3.yaml"
LAUNCH=("$PYTHON" -m accelerate.commands.launch --config_file "$CONFIG" --num_processes 1 --num_machines 1)
TINY=()
if [ "$DRY_RUN" = 1 ]; then
  echo "[gpu_check] --dry-run: tiny model, fp32, DeepSpeed ZeRO-3 on CPU (figures are meaningless)"
  export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  LAUNCH+=(--mixed_precision no)
  TINY=(--tiny)
else
  if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "[gpu_check] no CUDA device visible; use --dry-run to check the script on CPU" >&2
    exit 1
  fi
  export CUDA_VISIBLE_DEVICES="${GPU:-${CUDA_VISIBLE_DEVICES:-0}}"
  export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES%%,*}"  # one GPU
  LAUNCH+=(--mixed_precision bf16)
fi
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

free_port() { "$PYTHON" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

start=$(date +%s)
if [ "$VLLM_COST" = 1 ]; then
  cd "$ROOT"
  if [ "$DRY_RUN" = 1 ]; then  # benchmarks/cost_vllm.py puts the fake engine on its runs' path on CPU
    "$PYTHON" -m benchmarks.cost_vllm --quick --repetitions 1 --output "$WORK/cost_vllm.json"
  elif ! "$PYTHON" -c "import vllm" 2>/dev/null; then
    echo "[gpu_check] --vllm-cost needs vLLM installed (pip install 'trl[vllm]'); --dry-run checks it without" >&2
    exit 1
  else
    "$PYTHON" -m benchmarks.cost_vllm --device cuda
  fi
  echo "[gpu_check] done in $(( $(date +%s) - start )) s"
  exit 0
fi
"$PYTHON" "$ROOT/scripts/gpu_check.py" make-model "$WORK/model" "${TINY[@]}"
if [ "$ASYNC" = 1 ]; then
  CHECK=("$PYTHON" "$ROOT/scripts/async_check.py")
  "${CHECK[@]}" prepare --model "$WORK/model"
  "${CHECK[@]}" kernel --model "$WORK/model" --out "$WORK/kernel.json"
  SERVER=()
  if [ "$DRY_RUN" = 0 ]; then
    if ! "$PYTHON" -c "import vllm, kernels" 2>/dev/null; then
      echo "[gpu_check] --async needs vLLM and kernels installed; --dry-run checks the script without them" >&2
      exit 1
    fi
    PORT="$(free_port)"
    SERVE="$("${CHECK[@]}" serve-command --model "$WORK/model" --port "$PORT")"
    echo "[gpu_check] starting: $SERVE"
    bash -c "exec $SERVE" > "$WORK/vllm-serve.log" 2>&1 &
    SERVER_PID=$!
    trap 'kill "$SERVER_PID" 2>/dev/null || true; cleanup' EXIT
    for _ in $(seq 1 120); do
      "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://localhost:$PORT/health', timeout=2)" \
        2>/dev/null && break
      kill -0 "$SERVER_PID" 2>/dev/null || { echo "[gpu_check] vllm serve exited:" >&2; tail -n 40 \
        "$WORK/vllm-serve.log" >&2; exit 1; }
      sleep 5
    done
    SERVER=(--server "http://localhost:$PORT")
  fi
  OUTS=("$WORK/kernel.json")
  for trainer in rpg grpo; do
    echo "[gpu_check] async check: $trainer ..."
    "${CHECK[@]}" train --trainer "$trainer" --model "$WORK/model" --out "$WORK/async-$trainer.json" \
      "${SERVER[@]}" "${TINY[@]}" > "$WORK/async-$trainer.log" 2>&1 || {
        echo "[gpu_check] $trainer failed; last lines of its log:" >&2; tail -n 40 "$WORK/async-$trainer.log" >&2
        exit 1; }
    OUTS+=("$WORK/async-$trainer.json")
  done
  status=0
  "${CHECK[@]}" report "${OUTS[@]}" || status=$?
  echo "[gpu_check] done in $(( $(date +%s) - start )) s"
  exit "$status"
fi
if [ "$VLLM" = 1 ]; then
  if [ "$DRY_RUN" = 1 ]; then
    export PYTHONPATH="$ROOT/tests/vllm_stub:$PYTHONPATH"  # the fake engine, as the CPU tests use it
  elif ! "$PYTHON" -c "import vllm" 2>/dev/null; then
    echo "[gpu_check] --vllm needs vLLM installed (pip install 'trl[vllm]'); --dry-run checks the script without it" >&2
    exit 1
  fi
  OUTS=()
  for run in rpg-full rpg-lora grpo-full rpg-nosync rpg-topk; do
    echo "[gpu_check] vLLM check: $run ..."
    "$PYTHON" "$ROOT/scripts/vllm_check.py" train --run "$run" --model "$WORK/model" --out "$WORK/vllm-$run.json" \
      "${TINY[@]}" > "$WORK/vllm-$run.log" 2>&1 || {
        echo "[gpu_check] $run failed; last lines of its log:" >&2; tail -n 40 "$WORK/vllm-$run.log" >&2; exit 1; }
    OUTS+=("$WORK/vllm-$run.json")
  done
  status=0
  "$PYTHON" "$ROOT/scripts/vllm_check.py" report "${OUTS[@]}" || status=$?
  echo "[gpu_check] done in $(( $(date +%s) - start )) s"
  exit "$status"
fi
OUTS=()
for trainer in "${TRAINERS[@]}"; do
  echo "[gpu_check] training with $trainer ..."
  "${LAUNCH[@]}" --main_process_port "$(free_port)" "$ROOT/scripts/gpu_check.py" train --trainer "$trainer" \
    --model "$WORK/model" --out "$WORK/$trainer.json" "${TINY[@]}" > "$WORK/$trainer.log" 2>&1 || {
      echo "[gpu_check] $trainer failed; last lines of its log:" >&2; tail -n 40 "$WORK/$trainer.log" >&2; exit 1; }
  OUTS+=("$WORK/$trainer.json")
done
"$PYTHON" "$ROOT/scripts/gpu_check.py" report "${OUTS[@]}"
echo "[gpu_check] done in $(( $(date +%s) - start )) s"
