"""Build the documentation site: ``make docs`` -> build/site/index.html.

Usage: ``python tools/build_docs.py`` (needs ``pip install -e '.[docs]'``). Assembles
``build/docs-src`` from ``docs/`` and ``README.md`` (the home page, its ``docs/`` links made
relative to the site), builds the API reference into ``build/docs-src/api`` with
``tools/build_api.py`` (pdoc), then runs ``mkdocs build --strict`` (``mkdocs.yml``): a broken
link, a missing anchor or a page outside the navigation that the navigation names is an error.
Exits non-zero when any step fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "build" / "docs-src"


def home_page(readme: str) -> str:
    """README.md as the site's index.md: links into docs/ become site links."""
    return re.sub(r"(\]\()docs/", r"\1", readme)


def _build_api(out: Path) -> int:
    spec = importlib.util.spec_from_file_location("build_api", ROOT / "tools" / "build_api.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return int(mod.main([str(out)]))


def assemble(src: Path = SRC, api: bool = True) -> int:
    """``src`` afresh: docs/, the home page and (``api``) the API reference."""
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(ROOT / "docs", src)
    (src / "index.md").write_text(home_page((ROOT / "README.md").read_text()))
    link_snapshot_files(src / "results")
    return _build_api(src / "api") if api else 0


def link_snapshot_files(results: Path) -> None:
    """Append to each snapshot's opening page (:func:`snapshot_pages`, in the assembled copy)
    a list of links to its other pages (tables, checks, per-task pages), so that every page of
    the site is reached by a link."""
    for _, page in snapshot_pages(results):
        opening = results.parent / page
        others = sorted(p for p in opening.parent.rglob("*.md") if p != opening)
        if not others:
            continue
        lines = [f"- [{p.relative_to(opening.parent).as_posix()}]"
                 f"({p.relative_to(opening.parent).as_posix()})" for p in others]
        text = opening.read_text().rstrip("\n")
        opening.write_text(text + "\n\n## Every page of this snapshot\n\n" +
                           "\n".join(lines) + "\n")


#: the navigation line after which each results snapshot gets its own entry
RESULTS_ANCHOR = "      - Results snapshots: results/README.md\n"


def snapshot_pages(results: Path = ROOT / "docs" / "results") -> list[tuple[str, str]]:
    """``(label, page)`` of each results snapshot, in name order: its README.md, else its
    summary.md or final_returns.md (the page a snapshot opens on)."""
    out = []
    for d in sorted(p for p in results.iterdir() if p.is_dir()):
        page = next((d / n for n in ("README.md", "summary.md", "final_returns.md")
                     if (d / n).is_file()), None)
        if page is not None:
            out.append((d.name, page.relative_to(results.parent).as_posix()))
    return out


def site_config(src: str, pages: list[tuple[str, str]]) -> str:
    """mkdocs.yml (``src``) with every snapshot in the navigation under Results, paths made
    relative to build/ where the generated file lives, and the snapshots' other pages (tables,
    equivalence checks, per-task pages, linked from their snapshot's page by
    :func:`link_snapshot_files`) left out of the navigation on purpose (``not_in_nav``)."""
    if RESULTS_ANCHOR not in src:
        raise ValueError(f"mkdocs.yml: no navigation line {RESULTS_ANCHOR.strip()!r}")
    entries = "".join(f"      - {label}: {page}\n" for label, page in pages)
    src = src.replace(RESULTS_ANCHOR, RESULTS_ANCHOR + entries, 1)
    src = src.replace("docs_dir: build/docs-src", "docs_dir: docs-src")
    src = src.replace("site_dir: build/site", "site_dir: site")
    keep = "".join(f"  !/{page}\n" for _, page in pages)
    return src + f"not_in_nav: |\n  /results/**/*.md\n{keep}"


def main(argv: list[str]) -> int:
    api = "--no-api" not in argv
    if assemble(api=api) != 0:
        return 1
    config = ROOT / "build" / "mkdocs.yml"
    config.write_text(site_config((ROOT / "mkdocs.yml").read_text(), snapshot_pages()))
    # not --quiet: mkdocs counts the warnings that --strict turns into errors from its log
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config)], cwd=ROOT, env=env)
    if done.returncode != 0:
        print("docs: mkdocs build failed (warnings are errors)", file=sys.stderr)
        return done.returncode
    print(f"docs: {ROOT / 'build' / 'site' / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
