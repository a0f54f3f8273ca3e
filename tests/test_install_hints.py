"""Every install hint klppo prints or documents works from a clone: klppo is on no package
index, so ``pip install 'klppo[NAME]'`` cannot; the one form is ``pip install -c constraints.txt
-e '.[NAME]'`` (klppo.runs.install.install_hint), and each extra it names exists."""

import re
from pathlib import Path

import tomllib

from klppo.runs.install import install_hint

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
             ["optional-dependencies"])


def _texts():
    for folder, pattern in (("klppo", "*.py"), ("examples", "*"), ("docs", "*.md"),
                            (".", "README.md")):
        for p in (ROOT / folder).rglob(pattern) if folder != "." else [ROOT / pattern]:
            if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".yml"):
                yield p, p.read_text(errors="replace")


def test_no_hint_installs_klppo_from_an_index():
    bad = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p, text in _texts()
           for m in re.finditer(r"pip install ['\"]?klppo\[", text)]
    assert not bad, bad


def test_every_hinted_extra_exists():
    named = {m.group(1) for _, text in _texts()
             for m in re.finditer(r"-e '\.\[([a-z0-9_,-]+)\]'", text)}
    named = {e for group in named for e in group.split(",")}
    assert named and named <= EXTRAS, named - EXTRAS
    assert install_hint("box2d") == ("pip install -c constraints.txt -e '.[box2d]' (in the klppo "
                                     "clone)")
