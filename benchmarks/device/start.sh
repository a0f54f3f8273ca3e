#!/bin/bash
# Start the MuJoCo table's sweeps on a many-core machine that has no package index (the
# `device` tool's machine): install carried wheels, freeze a copy of the code, then one
# `klppo sweep` per "task:workers" in $TASKS, detached (setsid), in /tmp/frozen.
#
#   TASKS='humanoid:8 ant:8' bash benchmarks/device/start.sh     # wheels in .whl/
#   bash benchmarks/device/poll.sh 540                           # wait, report, pack to $OUT
#   bash benchmarks/device/poll.sh 300 stop                      # ... then stop (resumable)
#
# Bring earlier results: put runs/mujoco-1m/<task>/ in the carried tree; the sweeps resume them.
# The wheels (the machine's python has torch and numpy): for p in gymnasium==1.4.0
# Farama-Notifications==0.0.6 mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0 glfw==2.11.0
# PyOpenGL==3.1.10 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.0 shtab websockets; do
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl $p
# done
set -e
[ -n "$SKIP_PIP" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl
rm -rf /tmp/frozen; mkdir -p /tmp/frozen/runs/mujoco-1m
cp -r klppo examples /tmp/frozen/
[ -d runs/mujoco-1m ] && cp -r runs/mujoco-1m/. /tmp/frozen/runs/mujoco-1m/
echo "export PYTHONPATH=/tmp/frozen:/tmp/site MUJOCO_GL=disable OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1" > /tmp/env.sh
source /tmp/env.sh
cd /tmp/frozen
python3 -c "import klppo, gymnasium, mujoco, torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__, 'gymnasium', gymnasium.__version__, 'mujoco', mujoco.__version__)"
lscpu | grep -E 'Model name|^CPU\(s\)'
for t in $TASKS; do
  n=${t%%:*}; w=${t##*:}
  setsid nohup python3 -m klppo sweep --spec examples/mujoco-1m/$n.yaml --out runs/mujoco-1m/$n \
    --workers $w > runs/mujoco-1m/$n.log 2>&1 < /dev/null &
  echo "started $n with $w workers"
done
date +%s > /tmp/t0
