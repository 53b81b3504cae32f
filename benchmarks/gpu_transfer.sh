#!/bin/bash
# Weight transfer on a GPU machine (issue: weight transfer and OPD), in one run:
#   1. whether NCCL takes two processes on one GPU (the colocated case: trainer and server
#      sharing the only GPU), by a two-rank broadcast;
#   2. benchmarks/weight_sync.py --device cuda: one sync by transfer against reload, on the
#      tiny policy, a 134M and a ~1B random Llama;
#   3. benchmarks/sync_steps.py: trainer steps/s, transfer (keep) against reload, on the demo's
#      loop with the GPU visible to the trainer and the server.
#
#   bash benchmarks/gpu_transfer.sh OUT_DIR
#
# Needs a Python with atropos' dependencies and torch with CUDA.
set -uo pipefail
out=${1:?give an output directory}
export PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'GPUs', torch.cuda.device_count())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== 1. NCCL, two ranks on one GPU"
timeout 60 python3 - <<'PY' 2>&1 | tail -5 | tee "$out/nccl_colocated.txt"
import os, torch, torch.distributed as dist, torch.multiprocessing as mp
def rank(r, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=r, world_size=2, device_id=torch.device("cuda", 0))
    t = torch.full((1 << 18,), float(r), device="cuda")
    dist.broadcast(t, 0)
    torch.cuda.synchronize()
    print(f"rank {r}: broadcast ok, value {t[0].item()}")
    dist.destroy_process_group()
if __name__ == "__main__":
    from atropos.net import free_port
    try:
        mp.spawn(rank, args=(free_port(),), nprocs=2)
        print("NCCL two ranks on one GPU: works")
    except Exception as e:
        print("NCCL two ranks on one GPU: fails:", str(e).strip().splitlines()[-1][:300])
PY
echo "== 2. weight_sync --device cuda"
SECONDS=0
timeout 270 python3 benchmarks/weight_sync.py --device cuda --syncs 4 \
  --models tiny,llama-134m,llama-1b --json "$out/weight_sync_cuda.json" 2>&1 | tail -8
echo "weight_sync: $SECONDS s"
echo "== 3. sync_steps on the GPU"
SECONDS=0
timeout 150 python3 benchmarks/sync_steps.py --steps 30 --transfer-backend gloo \
  --out /tmp/sync-steps --json "$out/sync_steps_cuda.json" 2>&1 | grep -v "^\s*$" | tail -6
grep -h "device=\|training steps" /tmp/sync-steps/*/logs/*.log 2>/dev/null | sort | uniq -c | head
echo "sync_steps: $SECONDS s"
