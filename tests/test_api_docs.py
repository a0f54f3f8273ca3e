"""The API reference (`make api`, tools/build_api.py with pdoc) covers every package but the
command line, and builds: a page per public module, the docstrings in it."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("build_api", ROOT / "tools" / "build_api.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_package_but_the_command_line_is_documented():
    packages = {f"klppo.{p.name}" for p in (ROOT / "klppo").iterdir()
                if p.is_dir() and any(p.glob("*.py"))}
    assert set(_tool().PACKAGES) == packages - {"klppo.cli"}


@pytest.mark.slow
def test_the_api_reference_builds(tmp_path, capsys):
    pytest.importorskip("pdoc")
    assert _tool().main([str(tmp_path / "api")]) == 0
    assert "module pages" in capsys.readouterr().out
    html = (tmp_path / "api" / "klppo" / "rl" / "policy.html").read_text()
    page = " ".join(re.sub(r"<[^>]+>", "", html).split())
    assert "deterministic: bool = False" in page and "Stable-Baselines3" in page
    assert (tmp_path / "api" / "klppo" / "core" / "kl.html").exists()


def test_an_integration_whose_extra_is_missing_is_left_out_not_fatal(monkeypatch):
    """(issue #31) With the docs extra but not torchrl, `make api` stopped on the TorchRL
    integration's own ImportError ("needs TorchRL"): it is left out and named instead."""
    import sys

    for name in [m for m in sys.modules if m == "torchrl" or m.startswith("torchrl.")
                 or m.startswith("klppo.integrations.torchrl")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchrl", None)  # `import torchrl` fails, as uninstalled
    found, missing = _tool().modules()
    assert not any(m.startswith("klppo.integrations.torchrl") for m in found)
    assert any(m.startswith("klppo.integrations.torchrl") for m in missing)
    assert "klppo.core.kl" in found


def test_a_module_left_out_gets_its_members_read_from_the_source(tmp_path):
    """Without TRL, klppo.integrations.trl's page still names attach with its signature and
    docstring (read by ast from the module it is imported from), reST roles made plain."""
    tool = _tool()
    tool.stub_page(tmp_path, "klppo.integrations.trl (needs trl)")
    page = (tmp_path / "klppo" / "integrations" / "trl.html").read_text()
    assert "attach(trainer: Any, controller: KLController | str, *" in page
    assert "class KLControlCallback(trainer: Any, controller: KLController" in page
    assert "Drive <code>" not in page and ":class:`" not in page
    assert "Drive trainer.beta" in page  # attach's docstring, its first words
