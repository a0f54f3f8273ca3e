"""Build klppo's API reference from its docstrings with pdoc: ``make api`` -> build/api/.

Usage: ``python tools/build_api.py [OUT_DIR]`` (default ``build/api``; needs ``pip install -e
'.[docs]'``). Every klppo package but the command line (``klppo --help`` documents that) gets a
page per module. Modules are imported here first, outside pdoc's import sandbox (which stubs
``subprocess``, and some optional extras run a subprocess when imported); a module whose
optional extra is not installed is left out and named; private modules (``_name``) have no
page. Exits non-zero when pdoc fails or a public module got no page.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the packages documented (klppo.cli is the command line: its --help is its reference)
PACKAGES = ["klppo.core", "klppo.nn", "klppo.rl", "klppo.runs", "klppo.experiments",
            "klppo.replay", "klppo.report", "klppo.integrations", "klppo.lm"]
#: top-level modules of optional extras: a klppo module that needs a missing one is left out
EXTRAS = {"transformers", "tokenizers", "vaderSentiment", "torchrl", "tensordict", "ray",
          "wandb", "tensorboard", "mujoco", "Box2D", "pettingzoo", "mpe2", "moviepy", "onnx",
          "onnxscript"}


def modules() -> tuple[list[str], list[str]]:
    """(every module of :data:`PACKAGES` that imports, the modules left out with the reason)."""
    found, missing = [], []
    for pkg in PACKAGES:
        names = [pkg]
        path = [str(ROOT / pkg.replace(".", "/"))]
        names += [m.name for m in pkgutil.walk_packages(path, prefix=pkg + ".")]
        for name in names:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] not in EXTRAS:
                    raise
                missing.append(f"{name} (needs {e.name})")
                continue
            except ImportError as e:  # an integration's own refusal: its extra is missing
                if not name.startswith("klppo.integrations."):
                    raise
                missing.append(f"{name} ({' '.join(str(e).split())[:100]})")
                continue
            found.append(name)
    return found, missing


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else ROOT / "build" / "api")
    sys.path.insert(0, str(ROOT))
    import pdoc
    import pdoc.render

    found, missing = modules()
    for m in missing:
        print(f"api: left out {m}")
    pdoc.render.configure(docformat="google", footer_text="klppo API reference",
                          search=True, show_source=True)
    # TorchRL's constructor signatures, which the drop-in losses take over, name TorchRL's types
    warnings.filterwarnings("ignore", message="Error parsing type annotation .* for "
                            "klppo.integrations.torchrl")
    # a package without __all__ brings its modules itself; they are named once more below
    warnings.filterwarnings("ignore", message="The module specification .* adds a module named")
    public = [m for m in found if not any(part.startswith("_") for part in m.split("."))]
    left_out = [f"!{m.split(' ')[0]}" for m in missing]
    pdoc.pdoc("klppo", *public, *left_out, output_directory=out)
    pages = sorted(p.relative_to(out) for p in out.rglob("*.html") if p.name != "index.html")
    absent = [m for m in public if Path(*m.split(".")).with_suffix(".html") not in pages]
    if absent:
        print(f"api: no page for {absent}", file=sys.stderr)
        return 1
    unlinked = sum(unlink_missing_anchors(out / p) for p in pages)
    write_index(out, public)
    print(f"api: {len(pages)} module pages -> {out / 'index.html'} ({unlinked} links to "
          f"members pdoc does not render made plain text)")
    return 0


def unlink_missing_anchors(page: Path) -> int:
    """pdoc links some names to members it does not render on the page (a private base class,
    attributes inherited from TorchRL or Gymnasium): those links lead nowhere, so their text is
    kept and the link dropped. Returns how many."""
    import re

    text = page.read_text()
    ids = set(re.findall(r'\sid="([^"]+)"', text))
    count = 0

    def plain(m: re.Match) -> str:
        nonlocal count
        if m.group(1) in ids:
            return m.group(0)
        count += 1
        return m.group(2)

    text = re.sub(r'<a href="#([^"]+)"[^>]*>(.*?)</a>', plain, text, flags=re.S)
    page.write_text(text)
    return count


def first_line(module: str) -> str:
    """The first sentence-line of ``module``'s docstring (imported above)."""
    import re

    doc = (sys.modules[module].__doc__ or "").strip()
    first = doc.split("\n\n")[0].replace("\n", " ") if doc else ""
    first = re.sub(r":\w+:`~?([^`]+)`", r"\1", first)  # :class:`~a.B` -> a.B
    return first.replace("``", "")


def write_index(out: Path, public: list[str]) -> None:
    """``out/index.html``: the module tree, a package per section, each module with the first
    paragraph of its docstring (pdoc's own index would open on the top package's page, which
    lists ``load`` and links to no module)."""
    import html

    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>klppo API reference"
             "</title><style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;"
             "margin:2rem auto;padding:0 1rem}li{margin:.3rem 0}code{font-size:95%}"
             "span{color:#555}</style></head><body><h1>klppo API reference</h1>"
             "<p>Every public module, by package, from the docstrings "
             "(<a href='klppo.html'>klppo</a>: <code>klppo.load</code>). The command line "
             "documents itself: <code>klppo --help</code>.</p>"]
    for pkg in PACKAGES:
        mods = [m for m in public if m == pkg or m.startswith(pkg + ".")]
        if not mods:
            continue
        parts.append(f"<h2><a href='{pkg.replace('.', '/')}.html'>{e(pkg)}</a></h2>"
                     f"<p>{e(first_line(pkg))}</p><ul>")
        for m in mods[1:] if mods[0] == pkg else mods:
            parts.append(f"<li><a href='{m.replace('.', '/')}.html'><code>{e(m)}</code></a> "
                         f"<span>{e(first_line(m))}</span></li>")
        parts.append("</ul>")
    (out / "index.html").write_text("".join(parts) + "</body></html>\n")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
