#!/bin/bash
# Keep the parts of SmolLM2's compressed GGUF file that the folder $1 carries (DIR/smol.xz.partNN,
# made by tools/device/prepare.sh) in /root/stash on the warm device machine, for the last call
# (gpu_call2.sh) to join. A call of its own for a middle part:
#   run(carry=[".dev2"], command="bash tools/device/gpu_stash.sh .dev2")
set -e
mkdir -p /root/stash
shopt -s nullglob
parts=("$1"/smol.xz.part*)
[ ${#parts[@]} -gt 0 ] || exit 0
cp "${parts[@]}" /root/stash/
ls -l /root/stash
