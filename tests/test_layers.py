"""No import from a lower package to a higher one (docs/architecture.md):

core -> nn -> rl, lm, integrations (siblings) -> experiments -> report -> cli. ``runs`` (run
directories, files, metric sinks, signals, the final-return protocol) is plumbing that imports
no klppo package but itself. ``cli`` (the ``klppo`` command) may import every package, and only
``klppo/__main__.py`` imports it. Every package and module of ``klppo/`` is in the table.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "klppo"

#: package -> the klppo packages it may import
ALLOWED = {
    "core": set(),
    "runs": set(),  # plumbing: imports no other klppo package (its version from metadata)
    "nn": {"core"},
    "rl": {"core", "nn", "runs"},
    "lm": {"core", "runs"},
    "replay": {"core", "runs"},
    "integrations": {"core", "nn", "runs"},  # bridges (TorchRL, TRL), optional extras
    "experiments": {"core", "nn", "rl", "lm", "runs"},
    "report": {"runs"},
    "cli": {"core", "nn", "rl", "lm", "replay", "integrations", "experiments", "report", "runs"},
    "__init__": {"rl"},  # klppo.load, imported lazily inside the function
    "__main__": {"cli"},  # python -m klppo
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


def files_of(package: str) -> list[Path]:
    return sorted((PKG / package).rglob("*.py")) if (PKG / package).is_dir() \
        else [PKG / f"{package}.py"]


def test_every_package_and_module_is_in_the_table():
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    assert {p.stem for p in PKG.glob("*.py")} | packages == set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_from_a_lower_package_to_a_higher_one(package):
    files = files_of(package)
    assert files and all(f.exists() for f in files), package
    for f in files:
        bad = imports_of(f) - ALLOWED[package] - {package}
        assert not bad, f"{f.relative_to(PKG.parent)} imports {sorted(bad)}"


def test_only_python_dash_m_klppo_imports_the_cli():
    importers = {f.relative_to(PKG).as_posix() for package in ALLOWED if package != "cli"
                 for f in files_of(package) if "cli" in imports_of(f)}
    assert importers == {"__main__.py"}
