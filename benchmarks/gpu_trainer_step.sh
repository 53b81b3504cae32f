#!/bin/bash
# The trainer step's tokens/s and MFU on one GPU, side by side in one run (issue 38, item 4):
# the 1B Llama of benchmarks/trainer_gpu.py at 32 x 1,024 tokens with the step's chunked
# log-probabilities (and its synchronising calls counted) against the float32 cross-entropy
# over all logits it replaced, and with a fused AdamW; then lengths drawn in 128..1,024,
# padded against packed (sdpa's dense mask, flex attention, and flash-attention 2 where the
# package is installed), and passes of 16 sequences (the memory the chunked logprobs free).
# Sized for a 15-minute device slot: about 40 s a run, each cut at TIMEOUT seconds (default
# 150), the runs left skipped past BUDGET seconds (default 540: one device call is 600 s).
#
#   bash benchmarks/gpu_trainer_step.sh OUT_DIR [SIZE]     # SIZE: default 1b
#   DEVICE=cpu STEPS=1 bash benchmarks/gpu_trainer_step.sh /tmp/check tiny  # the script, on a CPU
#
# Needs a Python with torch (CUDA) and transformers; atropos from this checkout (PYTHONPATH).
set -uo pipefail
out=${1:?give an output directory}
size=${2:-1b}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"

start=$(date +%s)
run() {  # one benchmark run; skipped when less than a minute of BUDGET (s, default 540) is left
  local name=$1 left
  shift
  left=$((${BUDGET:-540} - $(date +%s) + start))
  if [ "$left" -lt 60 ]; then
    echo "== $name: skipped, ${left} s of the budget left"
    return
  fi
  echo "== $name: $*"
  SECONDS=0
  timeout "$((left < ${TIMEOUT:-150} ? left : ${TIMEOUT:-150}))" python3 benchmarks/trainer_gpu.py --size "$size" --warmup 3 \
    --steps "${STEPS:-10}" --device "${DEVICE:-auto}" --json "$out/trainer_gpu_${size}_$name.json" "$@" 2>&1 | grep -v "^step \|^  \|^[{}]"
  echo "$name: $SECONDS s"
}

# the most telling first: a slot cut short keeps them
run fixed_chunked --count-syncs
run fixed_full --logprobs full --count-syncs
run varied_padded --lengths 128:1024
run varied_packed_flex --lengths 128:1024 --layout packed --attention flex_attention
if python3 -c "import flash_attn" 2>/dev/null; then
  run varied_padded_fa2 --lengths 128:1024 --attention flash_attention_2
  run varied_packed_fa2 --lengths 128:1024 --layout packed --attention flash_attention_2
else
  echo "flash_attn is not installed: no flash_attention_2 runs"
fi
run fixed_chunked_fused_adamw --fused-adamw
run fixed_chunked_passes_of_16 --micro-batch-size 16
run varied_packed_sdpa --lengths 128:1024 --layout packed

python3 - "$out" "$size" <<'EOF'
import json, sys
from pathlib import Path

out, size = Path(sys.argv[1]), sys.argv[2]
print("| run | layout | attention | logprobs | fused AdamW | step s (median) | tokens/s | MFU | peak GiB | syncs/step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(out.glob(f"trainer_gpu_{size}_*.json")):
    r = json.loads(path.read_text())
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
    print(
        f"| {path.stem.split(size + '_', 1)[1]} | {r['layout']} | {r['attention']} | {r['logprobs']}"
        f" | {r.get('fused_adamw')}"
        f" | {r['step_s_median']:.3f} | {r['tokens_per_s']:,.0f} | {mfu}"
        f" | {max(r['peak_memory_gib_per_rank']):.1f} | {r.get('syncs_per_step')} |"
    )
EOF
