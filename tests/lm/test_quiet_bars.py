"""`klppo rlhf` and `klppo lm` show klppo's own progress only: tqdm bars of the libraries they
load (transformers' GGUF loader draws one with plain tqdm) are off, set before torch imports
tqdm (tqdm reads ``TQDM_DISABLE`` when imported); a user's own setting wins."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ("from klppo.cli import main; main({argv!r}); import tqdm; "
         "print(tqdm.tqdm(range(2)).disable)")


@pytest.mark.parametrize("argv", [["rlhf", "--lr", "fast"], ["rlhf", "compare", "--workers", "0"],
                                  ["lm", "pretrain", "--steps", "-5"]],
                         ids=["rlhf", "rlhf compare", "lm pretrain"])
@pytest.mark.parametrize("user", [None, ""], ids=["default", "user-set"])  # "": bars on
def test_library_tqdm_bars_are_off_unless_the_user_says_otherwise(argv, user):
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    if user is not None:
        env["TQDM_DISABLE"] = user
    out = subprocess.run([sys.executable, "-c", CHECK.format(argv=argv)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == ("True" if user is None else "False"), out
