#!/bin/bash
# Call 1 of a GPU session (the `device` tool's machine; tools/device/prepare.sh makes what the
# calls carry and prints their list): install the carried wheels (.dev1/*.whl) into /tmp/site,
# keep the first part of the SmolLM2 file (.dev1/smol.xz.part00) for the last call, then the
# engine benchmark: the numpy stack on one CPU core against the torch stack on the GPU
# (benchmarks/bench_engine_device.py) at R = 20 and 100 runs x 4096 steps, then R = 1000 x 2048
# steps with the GPU first; stopped after $1 seconds (the rows printed by then are kept).
# Output: $OUT/engine.txt.
T=${1:-240}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .dev1/*.whl || exit 1
bash tools/device/gpu_stash.sh .dev1 || exit 1
export PYTHONPATH=$PWD:/tmp/site MUJOCO_GL=disable PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep -E 'Model name|^CPU\(s\)'
  python3 -c "import torch, numpy, gymnasium, mujoco, transformers; print('torch', \
torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'gymnasium', \
gymnasium.__version__, 'mujoco', mujoco.__version__, 'transformers', transformers.__version__)"
  git log -1 --format='klppo %h' 2>/dev/null
} 2>&1 | tee "$OUT/engine.txt"
t0=$(date +%s)
timeout "$T" python3 benchmarks/bench_engine_device.py --device "${DEVICE:-cuda}" --runs 20 100 \
  --steps 4096 2>&1 | tee -a "$OUT/engine.txt"
left=$(( T - ($(date +%s) - t0) ))
[ "$left" -gt 20 ] && timeout "$left" python3 benchmarks/bench_engine_device.py \
  --device "${DEVICE:-cuda}" --runs 1000 --steps 2048 --stacks torch numpy 2>&1 |
  tee -a "$OUT/engine.txt"
