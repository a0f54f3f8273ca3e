#!/usr/bin/env bash
# Interleaved A/B of two klppo checkouts, whole processes (imports included), one thread each:
#   git worktree add /tmp/old <rev>
#   benchmarks/ab_versions.sh /tmp/old klip/hopper 16384 [pairs]
# Prints the wall time of each pair (old first, then this checkout), run back to back so the
# machine's drift hits both alike.
set -euo pipefail
old=$1; preset=$2; steps=$3; pairs=${4:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
tmp=$(mktemp -d)
run() {
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$1" && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$py" -m klppo train --preset "$preset" \
    --total-steps "$steps" --no-tensorboard --out "$tmp/$RANDOM$RANDOM" >/dev/null 2>&1)
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}
for i in $(seq 1 "$pairs"); do
  echo "$preset pair $i: old $(run "$old") s, new $(run "$here") s"
done
rm -rf "$tmp"
