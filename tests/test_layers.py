"""No import from a lower package to a higher one (docs/architecture in the README's layout):

core -> nn -> rl, lm, integrations (siblings) -> experiments -> report, cli. ``runs`` (run
directories, files, metric sinks, signals, the final-return protocol) is plumbing that imports
no klppo package but itself.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "klppo"

#: package -> the klppo packages it may import
ALLOWED = {
    "core": set(),
    "runs": {"klppo"},  # klppo.__version__ for the run metadata
    "nn": {"core"},
    "rl": {"core", "nn", "runs"},
    "lm": {"core", "runs"},
    "replay": {"core", "runs"},
    "integrations": {"core", "nn"},  # bridges to other ecosystems (TorchRL), optional extras
    "experiments": {"core", "nn", "rl", "lm", "runs"},
    "report": {"runs"},
}


def imports_of(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for n in names:
            parts = n.split(".")
            if parts[0] == "klppo":
                out.add(parts[1] if len(parts) > 1 else "klppo")
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_from_a_lower_package_to_a_higher_one(package):
    files = sorted((PKG / package).rglob("*.py")) if (PKG / package).is_dir() \
        else [PKG / f"{package}.py"]
    assert files and all(f.exists() for f in files), package
    for f in files:
        bad = imports_of(f) - ALLOWED[package] - {package}
        assert not bad, f"{f.relative_to(PKG.parent)} imports {sorted(bad)}"
