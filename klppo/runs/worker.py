"""``python -m klppo.runs.worker RUN_DIR``: run or resume the run whose config.yaml is there."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from klppo.rl.trainer import resume


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:
        resume(Path(argv[0]))
    except Exception as e:  # noqa: BLE001 - the status file holds the details
        print(f"klppo worker: {e!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
