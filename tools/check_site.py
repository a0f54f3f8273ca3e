"""Check the built documentation site in a real browser: ``make docs-check``.

Usage: ``python tools/check_site.py [SITE_DIR]`` (default ``build/site``, from ``make docs``).
Serves the site on 127.0.0.1 and opens every page in headless Chromium (Playwright driving the
system's ``chromium``, or Playwright's own browser when it has one): the page loads, logs no
console error and raises nothing, every image has decoded (natural width > 0), and every link
inside the site leads to a file that exists and, with a ``#fragment``, to an element of that id.
Links that leave the site are counted, not followed (no network here). Exits 1 naming each
problem, 2 when no browser can be started.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlparse

ROOT = Path(__file__).resolve().parents[1]

#: what a page reports to the checker: image states and every link's resolved URL
PROBE = """() => ({
  images: [...document.images].map(i => [i.currentSrc || i.src, i.complete, i.naturalWidth]),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  width: document.documentElement.scrollWidth,
})"""

#: the window width every page must fit without scrolling sideways (a wide table or code block
#: scrolls inside its own box)
WIDTH = 1280


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A page closed while its request was answered (the checker moves on once a page
        has loaded): not a problem of the site."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _ids(path: Path) -> set[str]:
    text = path.read_text(errors="replace")
    return set(re.findall(r'\s(?:id|name)="([^"]+)"', text))


def check_link(site: Path, base: str, href: str, ids: dict[Path, set[str]]) -> str | None:
    """None when ``href`` (absolute, as the browser resolved it) is fine, else the problem."""
    if not href.startswith(base):
        return None  # leaves the site: counted by the caller
    url, frag = urldefrag(href)
    rel = unquote(urlparse(url).path)[len(urlparse(base).path):]
    target = site / rel
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return f"{href}: no such file"
    if frag and target.suffix == ".html":
        if target not in ids:
            ids[target] = _ids(target)
        if unquote(frag) not in ids[target]:
            return f"{href}: no element with id {frag!r}"
    return None


def _browser(pw):  # type: ignore[no-untyped-def]
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        return pw.chromium.launch(executable_path=exe, args=["--no-sandbox"]) if exe \
            else pw.chromium.launch()
    except Exception as e:  # noqa: BLE001 - any launch failure: no browser here
        print(f"check_site: no browser could be started ({type(e).__name__}: "
              f"{str(e).splitlines()[0]}); apt-get install chromium", file=sys.stderr)
        return None


def check_page(page, url: str, site: Path, base: str, ids: dict) -> tuple[list[str], int]:  # type: ignore[no-untyped-def]
    """The problems of one page, and its number of links that leave the site."""
    errors: list[str] = []
    # A failed load is reported by its response, which names the file; the browser's own
    # favicon.ico probe is not the page's request (a page that wants one links it).
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None)
    page.on("response", lambda r: errors.append(f"{r.url} answered {r.status}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(url, wait_until="load")
    found = page.evaluate(PROBE)
    problems = [f"{url}: {e}" for e in errors]
    if found["width"] > WIDTH:
        problems.append(f"{url}: {found['width']} px wide, wider than a {WIDTH} px window")
    for src, complete, width in found["images"]:
        if not complete or width == 0:
            problems.append(f"{url}: image {src[:80]} did not render")
    outside = 0
    for href in found["links"]:
        if not href.startswith(base):
            outside += urlparse(href).scheme in ("http", "https")
            continue
        why = check_link(site, base, href, ids)
        if why is not None:
            problems.append(f"{url}: link {why}")
    return problems, outside


def unlisted_snapshots(site: Path) -> list[str]:
    """Each results snapshot (docs/results/NAME/) in the site must be in the navigation, which
    every page carries: the home page links its page."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_docs import snapshot_pages

    home = (site / "index.html").read_text(errors="replace")
    links = set(re.findall(r'href="([^"#]+)', home))
    return [f"index.html: no navigation link to the results snapshot {label} ({page})"
            for label, page in snapshot_pages()
            if (site / _html(page)).is_file() and _html(page) not in links]


def unreachable(site: Path) -> list[str]:
    """Every page of the site must be reached by links from the home page (following the
    site's own links, any depth); the API reference and mkdocs' search and 404 pages aside."""
    seen, todo = set(), [site / "index.html"]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for href in re.findall(r'href="([^"#?]+)', path.read_text(errors="replace")):
            if "://" in href or href.startswith("mailto:"):
                continue
            target = (path.parent / href).resolve()
            todo.append(target / "index.html" if target.is_dir() else target)
    pages = [p for p in site.rglob("*.html")
             if p.name != "404.html" and "api" not in p.relative_to(site).parts[:1]]
    return [f"{p.relative_to(site)}: no link from the home page reaches it"
            for p in sorted(pages) if p.resolve() not in seen]


def _html(page: str) -> str:
    """The site's file of a docs page (mkdocs makes README.md a folder's index.html)."""
    return (page[:-len("README.md")] + "index.html" if page.endswith("README.md")
            else page[:-3] + ".html")


def main(argv: list[str]) -> int:
    site = Path(argv[0] if argv else ROOT / "build" / "site").resolve()
    if not (site / "index.html").is_file():
        print(f"check_site: {site}/index.html missing; run make docs first", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    server, base = serve(site)
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    problems: list[str] = []
    outside = 0
    ids: dict[Path, set[str]] = {}
    with sync_playwright() as pw:
        browser = _browser(pw)
        if browser is None:
            return 2
        for path in pages:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            url = urljoin(base, str(path.relative_to(site)))
            found, out = check_page(page, url, site, base, ids)
            problems += found
            outside += out
            page.close()
        browser.close()
    server.shutdown()
    problems += unlisted_snapshots(site) + unreachable(site)
    for p in problems:
        print(f"check_site: {p}", file=sys.stderr)
    print(f"check_site: {len(pages)} pages, {len(problems)} problems, {outside} links that "
          f"leave the site (not followed)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
