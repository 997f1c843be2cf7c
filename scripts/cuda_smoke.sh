#!/usr/bin/env bash
# mlxq's worker on an NVIDIA GPU (MLX's CUDA build): import the default model, run the engine
# alone, then the whole stack (redis-server, worker, API) with streaming clients.
# Made for a machine without network access: wheels, redis-server and the model's GGUF come
# in as files (STAGE: the pieces of mlx-cuda-13's wheel and the GGUF; .whl/final: the rest).
# Results go to $OUT (or ./cuda-out).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STAGE=${STAGE:-/tmp/stage}
OUT=${OUT:-cuda-out}
mkdir -p "$OUT" /tmp/models
cat "$STAGE"/cuda.part-* > /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
cat "$STAGE"/gguf.part-aa .whl/final/gguf.part-a[b-z] > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/final/wheels/*.whl /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PWD/.whl/final/redis:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" | tee -a "$OUT/gpu.txt"

for dtype in keep float32; do
  python3 -m worker.ops.cli import-gguf /tmp/SmolLM2-135M-Instruct.Q4_1.gguf --dtype $dtype \
    --out /tmp/models/smollm2-$dtype
  python3 -m bench.engine_only /tmp/models/smollm2-$dtype --concurrency 1,16,32 \
    | tee "$OUT/engine-$dtype.json"
done

python3 - <<'PY' 2>&1 | tee "$OUT/stack.txt"
import json, os, urllib.request
from pathlib import Path
from bench import systems
from bench.load import run_load

model = Path("/tmp/models/smollm2-keep")
with systems.mlxq(model, 32) as running:
    body = {"model": running.model, "stream": False, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    req = urllib.request.Request(f"http://127.0.0.1:{running.port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    print(json.load(urllib.request.urlopen(req))["choices"][0]["message"])
    for c in (1, 16, 32):
        print(json.dumps(run_load("mlxq (CUDA)", running.port, running.model, c, 2, 64).as_dict()))
PY
