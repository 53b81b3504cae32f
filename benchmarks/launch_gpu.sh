#!/bin/bash
# `atropos launch` on a machine with one GPU: the demo's loop (examples/launch/local.yaml) twice,
# once with the CPU server on the GPU (inference.0.gpus=1) and the trainer beside it on the CPU,
# once the other way round; the local backend hands the GPU to the process that asks for it
# (CUDA_VISIBLE_DEVICES=0) and hides it from the other (CUDA_VISIBLE_DEVICES="").
#
#   bash benchmarks/launch_gpu.sh OUT_DIR [STEPS]
#
# Needs a Python with atropos' dependencies (torch with CUDA). Copies into OUT_DIR, per run:
# launch.json, the first lines of the server's and the trainer's logs (the devices they chose)
# and the trainer's metrics.
set -euo pipefail
out=${1:?give an output directory}
steps=${2:-40}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
for variant in server-gpu trainer-gpu; do
  run=$(mktemp -d)/run
  if [ $variant = server-gpu ]; then sets=(--set inference.0.gpus=1); else sets=(--set trainer.gpus=1); fi
  SECONDS=0
  python3 -m atropos launch examples/launch/local.yaml --no-live --set run.directory="$run" \
    --set trainer.args.steps="$steps" "${sets[@]}" > "$out/$variant-launch.log" 2>&1
  echo "$variant: exit 0 in $SECONDS s"
  cp "$run/launch.json" "$out/$variant-launch.json"
  grep -h "device=\|training steps" "$run/logs/policy.log" "$run/logs/trainer.log" | tee "$out/$variant-devices.txt"
  cp "$run/trainer/metrics.jsonl" "$out/$variant-metrics.jsonl"
  python3 - "$run/trainer/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
t = [r["time"] for r in rows[4:]]
print(f"  steps {len(rows)}, steps/s after step 5: {(len(t) - 1) / (t[-1] - t[0]):.2f},"
      f" reward first 10 {sum(r['reward_mean'] for r in rows[:10]) / 10:.3f},"
      f" last 10 {sum(r['reward_mean'] for r in rows[-10:]) / 10:.3f}")
PY
done
