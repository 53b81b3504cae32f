#!/bin/bash
# Trainer steps/s with in-flight transfers (`--sync transfer`, pause `keep`, CUDA IPC) against
# `--sync reload` on a GPU machine, on the demo's loop with trainer and server sharing the GPU:
# the tiny policy, then random Llamas of 134M and ~1B (benchmarks/sync_steps.py --model).
#
#   bash benchmarks/gpu_sync_steps.sh OUT_DIR [MODELS]    # MODELS: default "tiny llama-134m llama-1b"; STEPS, TIMEOUT (s) per model
#
# Needs a Python with atropos' dependencies and torch with CUDA.
set -uo pipefail
out=${1:?give an output directory}
models=${2:-tiny llama-134m llama-1b}
export PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
for model in $models; do
  echo "== sync_steps --model $model (transfer over ipc)"
  SECONDS=0
  steps=${STEPS:-30}; [ "$model" = tiny ] || steps=${STEPS:-20}
  timeout "${TIMEOUT:-200}" python3 benchmarks/sync_steps.py --steps "$steps" --model "$model" \
    --transfer-backend ipc --out "/tmp/sync-steps-$model" \
    --json "$out/sync_steps_cuda_$model.json" 2>&1 | grep "^|"
  grep -h "device=\|training steps" /tmp/sync-steps-"$model"/*/logs/*.log 2>/dev/null | sed 's/^.*atropos/atropos/' | sort | uniq -c
  echo "$model: $SECONDS s"
done
