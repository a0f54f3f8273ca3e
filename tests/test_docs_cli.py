import re
from pathlib import Path

from klppo.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_snippets_run():
    src = (ROOT / "README.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", src, re.S))
    assert code.strip()
    exec(compile(code, "README.md", "exec"), {})


def test_verify_command_passes_and_prints_checks(capsys):
    assert main(["verify", "--batches", "20"]) == 0
    out = capsys.readouterr().out
    assert "Theorem 1" in out and "Theorem 2" in out and "verify: OK" in out
    assert "step(rllib)" in out and "pid" in out
