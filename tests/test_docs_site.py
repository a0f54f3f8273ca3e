"""The documentation site (issue #31): `make docs` assembles docs/ and the README into an
mkdocs-material site that builds with warnings as errors, every link of the Markdown resolves
in the repository view too, and the browser check (tools/check_site.py) reports what is broken."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _links(md: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return [h for h in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", h) and not h.startswith("#")]


MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("md", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_every_relative_link_resolves_in_the_repository(md):
    for href in _links(md):
        if md.name == "api.md" and href.startswith("api/"):
            continue  # the API reference exists in the built site only (make docs writes it)
        target = (md.parent / href.split("#")[0]).resolve()
        assert target.exists(), f"{md.relative_to(ROOT)}: {href} leads nowhere"


def test_the_readme_is_the_home_page_with_site_links():
    page = _tool("build_docs").home_page((ROOT / "README.md").read_text())
    assert "](docs/" not in page and "](tutorials/cartpole-study.md)" in page
    assert "](figures/hopper-v5-learning-curves.png)" in page


def _build(src: Path, site: Path) -> subprocess.CompletedProcess:
    cfg = src.parent / "mkdocs.yml"
    cfg.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {src}\nsite_dir: {site}\n")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(cfg)],
                          capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})


def test_the_site_builds_with_warnings_as_errors_and_a_broken_link_fails_it(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    src = tmp_path / "src"
    assert _tool("build_docs").assemble(src, api=False) == 0
    (src / "api").mkdir()
    (src / "api" / "index.html").write_text("<html><body>API</body></html>")  # pdoc's place
    done = _build(src, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "tutorials" / "cartpole-study.html").is_file()
    # the same build with one broken anchor fails
    guide = src / "guide.md"
    guide.write_text(guide.read_text() + "\nSee [nowhere](usage.md#no-such-section).\n")
    done = _build(src, tmp_path / "site2")
    assert done.returncode != 0 and "no-such-section" in done.stderr


def test_the_browser_check_finds_a_broken_link_an_anchor_and_an_image(tmp_path, capsys):
    pytest.importorskip("playwright")
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    check = _tool("check_site")
    site = tmp_path / "site"
    site.mkdir()
    (site / "other.html").write_text('<html><body><h1 id="here">x</h1></body></html>')
    (site / "index.html").write_text(
        '<html><body><a href="other.html#here">ok</a> <a href="https://example.org">out</a>'
        '</body></html>')
    assert check.main([str(site)]) == 0
    assert "2 pages, 0 problems, 1 links that leave the site" in capsys.readouterr().out
    (site / "index.html").write_text(
        '<html><body><a href="gone.html">a</a> <a href="other.html#nope">b</a>'
        '<img src="missing.png"></body></html>')
    assert check.main([str(site)]) == 1
    err = capsys.readouterr().err
    assert "gone.html: no such file" in err and "no element with id 'nope'" in err
    assert "image" in err and "did not render" in err
    assert "missing.png answered 404" in err  # a failed load names its file


def test_every_results_snapshot_gets_a_navigation_entry(tmp_path):
    build = _tool("build_docs")
    results = tmp_path / "results"
    for name, page in (("b-run", "README.md"), ("a-run", "summary.md"), ("empty", None)):
        (results / name).mkdir(parents=True)
        (results / name / "final_returns.md").write_text("| x |")
        if page:
            (results / name / page).write_text("# x")
    pages = build.snapshot_pages(results)
    assert pages == [("a-run", "results/a-run/summary.md"), ("b-run", "results/b-run/README.md"),
                     ("empty", "results/empty/final_returns.md")]
    cfg = build.site_config((ROOT / "mkdocs.yml").read_text(), pages)
    nav = cfg.split(build.RESULTS_ANCHOR, 1)[1]
    assert nav.startswith("      - a-run: results/a-run/summary.md\n"
                          "      - b-run: results/b-run/README.md\n")
    assert cfg.endswith("not_in_nav: |\n  /results/**/*.md\n  !/results/a-run/summary.md\n"
                        "  !/results/b-run/README.md\n  !/results/empty/final_returns.md\n")
    assert "docs_dir: docs-src" in cfg and "site_dir: site" in cfg  # relative to build/
    # the repository's own: every snapshot folder of docs/results has an entry
    have = {label for label, _ in build.snapshot_pages()}
    assert have == {p.name for p in (ROOT / "docs" / "results").iterdir() if p.is_dir()}


def test_the_browser_check_finds_a_page_too_wide_and_a_snapshot_out_of_the_navigation(
        tmp_path, capsys):
    pytest.importorskip("playwright")
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    check = _tool("check_site")
    site = tmp_path / "site"
    (site / "results" / "rlhf-compare").mkdir(parents=True)  # a snapshot's page, not linked
    (site / "results" / "rlhf-compare" / "summary.html").write_text("<html><body>s</body></html>")
    (site / "index.html").write_text(
        '<html><body><div style="width:2000px">wide</div></body></html>')
    assert check.main([str(site)]) == 1
    err = capsys.readouterr().err
    assert "index.html: 2008 px wide, wider than a 1280 px window" in err  # with the margin
    assert "no navigation link to the results snapshot rlhf-compare" in err


def test_every_committed_report_is_linked_from_the_results_page():
    results = ROOT / "docs" / "results"
    page = (results / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)]+report\.html)\)", page))
    have = {p.relative_to(results).as_posix() for p in results.rglob("report.html")}
    assert have <= linked, f"not linked from docs/results/README.md: {sorted(have - linked)}"


def test_every_page_of_a_snapshot_is_linked_from_its_opening_page(tmp_path):
    build = _tool("build_docs")
    results = tmp_path / "results"
    (results / "run" / "task").mkdir(parents=True)
    (results / "run" / "README.md").write_text("# run\n")
    (results / "run" / "aggregates.md").write_text("| x |")
    (results / "run" / "task" / "final_returns.md").write_text("| y |")
    build.link_snapshot_files(results)
    text = (results / "run" / "README.md").read_text()
    assert text.endswith("## Every page of this snapshot\n\n- [aggregates.md](aggregates.md)\n"
                         "- [task/final_returns.md](task/final_returns.md)\n")


def test_the_site_check_names_a_page_no_link_reaches(tmp_path):
    check = _tool("check_site")
    site = tmp_path / "site"
    (site / "results" / "run").mkdir(parents=True)
    (site / "index.html").write_text('<a href="results/run/">run</a>')
    (site / "results" / "run" / "index.html").write_text('<a href="../../index.html">home</a>')
    (site / "results" / "run" / "aggregates.html").write_text("a table")
    (site / "api").mkdir()
    (site / "api" / "klppo.html").write_text("the API reference is checked apart")
    assert check.unreachable(site.resolve()) == [
        "results/run/aggregates.html: no link from the home page reaches it"]
