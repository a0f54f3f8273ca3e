#!/usr/bin/env bash
# TorchRL's own PPO tests (test/objectives/test_ppo.py) with klppo's KLPENPPOLoss and
# KLipPPOLoss in place of TorchRL's KLPENPPOLoss and ClipPPOLoss (docs/integrations.md).
#
# Usage: tools/torchrl_ppo_tests.sh TORCHRL_CHECKOUT [OUT_DIR]
#   TORCHRL_CHECKOUT: a clone of https://github.com/pytorch/rl (its test/objectives/ files are
#   copied out of it; nothing of TorchRL is stored in this repository). Runs the file twice,
#   unpatched and patched, and prints per loss class the passed / failed / skipped counts.
set -euo pipefail
src=${1:?a TorchRL checkout}
out=${2:-$(mktemp -d)}
py=${PYTHON:-"$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python"}
mkdir -p "$out"
for f in test_ppo.py _objectives_common.py conftest.py; do
  if [ -d "$src/.git" ] || git -C "$src" rev-parse 2>/dev/null; then
    git -C "$src" show "HEAD:test/objectives/$f" > "$out/$f" 2>/dev/null || cp "$src/test/objectives/$f" "$out/$f"
  else
    cp "$src/test/objectives/$f" "$out/$f"
  fi
done
cat >> "$out/conftest.py" <<'PY'


# klppo: with KLPPO_PATCH=1, TorchRL's KLPENPPOLoss and ClipPPOLoss are klppo's drop-ins for the
# whole session (set before the test module imports them from torchrl.objectives)
import os as _os

if _os.environ.get("KLPPO_PATCH") == "1":
    import torchrl.objectives as _objectives

    from klppo.integrations.torchrl import KLipPPOLoss as _KLip
    from klppo.integrations.torchrl import KLPENPPOLoss as _KLPEN

    _objectives.KLPENPPOLoss = _KLPEN
    _objectives.ClipPPOLoss = _KLip
PY
cd "$out"
for mode in 0 1; do
  KLPPO_PATCH=$mode "$py" -m pytest -q -p no:cacheprovider test_ppo.py \
    --junitxml="$out/patch$mode.xml" > "$out/patch$mode.log" 2>&1 || true
done
"$py" - "$out" <<'PY'
import collections, sys, xml.etree.ElementTree as ET
for mode, label in ((0, "TorchRL's classes"), (1, "klppo's classes in place")):
    counts = collections.Counter()
    for case in ET.parse(f"{sys.argv[1]}/patch{mode}.xml").iter("testcase"):
        name = case.get("name")
        who = ("KLPENPPOLoss" if "KLPENPPOLoss" in name else
               "ClipPPOLoss" if "ClipPPOLoss" in name or "KLipPPOLoss" in name else "other")
        state = ("failed" if case.find("failure") is not None or case.find("error") is not None
                 else "skipped" if case.find("skipped") is not None else "passed")
        counts[who, state] += 1
    print(label + ":", ", ".join(f"{w} {s} {n}" for (w, s), n in sorted(counts.items())))
PY
