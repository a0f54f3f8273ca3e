#!/bin/bash
# Start the MuJoCo table's sweeps on a many-core machine that has no package index (the
# `device` tool's machine): install carried wheels, freeze a copy of the code, then one
# `klppo sweep` per "task:workers[:nice]" in $TASKS, detached (setsid), in /tmp/frozen. A task's
# spec is examples/mujoco-1m/<task>.yaml, else examples/<task>.yaml, else $SPECS/<task>.yaml; its
# sweep directory is runs/mujoco-1m/<task>. A nice level lets the long runs (Humanoid, Ant) keep
# whole cores while the short ones share the rest, so the tasks end together.
#
#   TASKS='humanoid:8 ant:8' bash tools/device/start.sh     # wheels in .whl/
#   TASKS='humanoid:4 hopper:8:5 lunarlander-1m:4:5' bash tools/device/start.sh
#   bash tools/device/poll.sh 540                      # wait, report, pack to $OUT
#   bash tools/device/poll.sh 300 stop                 # ... then stop (resumable)
#
# A call may run 600 s: the poll ends on its next 60 s tick after T, then the stop and the packing
# take up to about 90 s, so keep T at 480 or less. LunarLander needs pygame besides box2d (the
# gymnasium.envs.box2d package imports it): carry both wheels, or run it elsewhere.
#
# Bring earlier results: put runs/mujoco-1m/<task>/ in the carried tree; the sweeps resume them.
# The wheels (the machine's python has torch and numpy): for p in gymnasium==1.4.0
# Farama-Notifications==0.0.6 mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0 glfw==2.11.0
# PyOpenGL==3.1.10 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.0 shtab websockets
# box2d==2.3.10; do
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
python3 -c "import Box2D; print('Box2D', Box2D.__version__)" || echo "no Box2D: LunarLander sweeps will fail"
lscpu | grep -E 'Model name|^CPU\(s\)'
for t in $TASKS; do
  IFS=: read -r n w nice <<< "$t"
  spec=examples/mujoco-1m/$n.yaml
  [ -f "$spec" ] || spec=examples/$n.yaml
  [ -f "$spec" ] || spec=$SPECS/$n.yaml
  setsid nohup nice -n "${nice:-0}" python3 -m klppo sweep --spec "$spec" --out runs/mujoco-1m/$n \
    --workers "$w" > runs/mujoco-1m/$n.log 2>&1 < /dev/null &
  echo "started $n ($spec) with $w workers at nice ${nice:-0}"
done
date +%s > /tmp/t0
