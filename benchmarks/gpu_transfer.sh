#!/bin/bash
# Weight transfer on a GPU machine (issue: weight transfer and OPD), in one run:
#   1. whether NCCL takes two processes on one GPU (the colocated case: trainer and server
#      sharing the only GPU), by a two-rank broadcast;
#   2. with BACKEND ipc, the GPU test of tests/local/test_ipc.py (a push under a request in
#      flight, the served weights equal the trainer's);
#   3. benchmarks/weight_sync.py --device cuda: one sync by transfer against reload, on the
#      tiny policy, a 134M and a ~1B random Llama;
#   4. benchmarks/sync_steps.py: trainer steps/s, transfer (keep) against reload, on the demo's
#      loop with the GPU visible to the trainer and the server.
#
#   bash benchmarks/gpu_transfer.sh OUT_DIR [BACKEND]    # BACKEND: ipc (default) or gloo
#
# Needs a Python with atropos' dependencies and torch with CUDA.
set -uo pipefail
out=${1:?give an output directory}
backend=${2:-ipc}
export PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'GPUs', torch.cuda.device_count())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== 1. NCCL, two ranks on one GPU"
probe=$(mktemp --suffix .py)
cat > "$probe" <<'PY'
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
timeout 60 python3 "$probe" 2>&1 | grep -v "^\s*$" | tail -4 | tee "$out/nccl_colocated.txt"
if [ "$backend" = ipc ]; then
  echo "== 2. tests/local/test_ipc.py on the GPU"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/local/test_ipc.py 2>&1 | tail -3
fi
echo "== 3. weight_sync --device cuda --backend $backend"
SECONDS=0
timeout 240 python3 benchmarks/weight_sync.py --device cuda --syncs 4 --backend "$backend" \
  --models tiny,llama-134m,llama-1b --json "$out/weight_sync_cuda_$backend.json" 2>&1 | tail -9
echo "weight_sync: $SECONDS s"
echo "== 4. sync_steps on the GPU, transfer over $backend"
SECONDS=0
timeout 150 python3 benchmarks/sync_steps.py --steps 30 --transfer-backend "$backend" \
  --out /tmp/sync-steps --json "$out/sync_steps_cuda_$backend.json" 2>&1 | grep -v "^\s*$" | tail -6
grep -h "device=\|training steps" /tmp/sync-steps/*/logs/*.log 2>/dev/null | sort | uniq -c | head
echo "sync_steps: $SECONDS s"
