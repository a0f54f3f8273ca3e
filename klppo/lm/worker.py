"""``python -m klppo.lm.worker RUN_DIR``: run the RLHF arm described by RUN_DIR/pending.yaml."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

from klppo.lm.config import RLHFConfig
from klppo.lm.rlhf import rlhf
from klppo.runs import rundir as R


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    run_dir = Path(argv[0])
    cfg = RLHFConfig(**R.read_yaml(run_dir / "pending.yaml"))
    for stale in ("metrics.jsonl", "checkpoint.pt", "status.json"):  # an unfinished arm restarts
        (run_dir / stale).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "policy", ignore_errors=True)
    try:
        rlhf(cfg)
    except Exception as e:  # noqa: BLE001 - status.json holds the details
        print(f"klppo rlhf worker: {e!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
