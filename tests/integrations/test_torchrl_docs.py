"""The README's TorchRL snippet runs (it is a ```py block, so the core README test, which needs
no TorchRL, leaves it out)."""

import re
from pathlib import Path

import pytest

pytest.importorskip("torchrl")

ROOT = Path(__file__).resolve().parents[2]


def test_readme_torchrl_snippet_runs(capsys):
    src = (ROOT / "README.md").read_text()
    section = src[src.index("### TorchRL users"):]
    code = re.findall(r"```py\n(.*?)```", section, re.S)[0]
    exec(compile(code, "README.md (TorchRL users)", "exec"), {})
    assert capsys.readouterr().out.strip()
