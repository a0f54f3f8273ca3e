#!/bin/bash
# Wait $1 seconds printing each run's state and iteration every minute; with "stop" as $2, then
# SIGTERM the sweeps (runs checkpoint and are recorded interrupted) and wait for them. Packs
# runs/mujoco-1m into $OUT/table.tgz.NN pieces of 15 MB (the device tool returns files of at
# most 16 MB, 8 files); join them with `cat table.tgz.* | tar xz`.
source /tmp/env.sh; cd /tmp/frozen
end=$(( $(date +%s) + $1 ))
progress() {
  echo "t=$(( $(date +%s) - $(cat /tmp/t0) ))s load=$(cut -d' ' -f1 /proc/loadavg)"
  for d in runs/mujoco-1m/*/; do python3 - "$d" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
cells = []
for r in sorted((d / "runs").glob("*")):
    st = json.loads((r / "status.json").read_text()) if (r / "status.json").exists() else {}
    n = sum(1 for _ in open(r / "metrics.jsonl")) if (r / "metrics.jsonl").exists() else 0
    cells.append(f"{r.name.split('__', 1)[1]}:{st.get('state', '-')[:4]}:{n}")
print(d.name, " ".join(cells))
PY
  done
}
while [ "$(date +%s)" -lt "$end" ]; do sleep 60; progress; done
if [ "$2" = stop ]; then
  pkill -TERM -f "klppo sweep" || true
  for _ in $(seq 90); do pgrep -f "klppo sweep" > /dev/null || break; sleep 1; done
  echo "sweeps left: $(pgrep -fc 'klppo sweep')"; progress
fi
# one archive of every sweep: no TensorBoard events (metrics.jsonl has it all), no checkpoint of
# a finished run (only unfinished runs need theirs, to resume)
find runs/mujoco-1m -name checkpoint.pt | while read -r c; do
  grep -q '"finished"' "$(dirname "$c")/status.json" 2>/dev/null && echo "$c"
done > /tmp/skip.txt
tar czf - --exclude=.lock --exclude='events.out.*' -X /tmp/skip.txt runs/mujoco-1m \
  | split -b 15M -d - "$OUT/table.tgz."
ls -la "$OUT"
