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
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the packages documented (klppo.cli is the command line: its --help is its reference), in the
#: index's order: what users call first, the internals (the engine, networks, run directories)
#: after
PACKAGES = ["klppo.core", "klppo.rl", "klppo.integrations", "klppo.lm", "klppo.report",
            "klppo.experiments", "klppo.replay", "klppo.nn", "klppo.runs"]
#: modules the index lists under "Internals" (with their submodules)
INTERNAL = ("klppo.nn", "klppo.runs", "klppo.rl.engine")
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
                missing.append(f"{name} ({' '.join(str(e).split())[:160]})")
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
    absent_names = [m.split(" ")[0] for m in missing]
    # exactly these modules and their submodules (pdoc's "!" is a regular expression matched at
    # the start: "!a.trl" would also leave out "a.trl_gradients")
    left_out = [f"!{re.escape(n)}(\\.|$)" for n in absent_names]
    for n in absent_names:  # pdoc imports them again to list a package's submodules
        warnings.filterwarnings("ignore", message=f"(Couldn't import|Error loading) {n}")
    pdoc.pdoc("klppo", *public, *left_out, output_directory=out)
    for m in missing:
        stub_page(out, m)
    pages = sorted(p.relative_to(out) for p in out.rglob("*.html") if p.name != "index.html")
    absent = [m for m in public if Path(*m.split(".")).with_suffix(".html") not in pages]
    if absent:
        print(f"api: no page for {absent}", file=sys.stderr)
        return 1
    unlinked = sum(unlink_missing_anchors(out / p) for p in pages)
    write_index(out, public, missing)
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


def source_docstring(module: str) -> str:
    """``module``'s docstring read from its source, without importing it."""
    import ast

    return ast.get_docstring(ast.parse(_module_path(module).read_text())) or ""


def _module_path(module: str) -> Path:
    base = ROOT / module.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _plain_doc(doc: str) -> str:
    """A docstring without reST roles and double backquotes (``:func:`~a.b``` -> ``a.b``)."""
    import re

    return re.sub(r":\w+:`~?([^`]+)`", r"\1", doc).replace("``", "")


def source_members(module: str, depth: int = 0) -> list[tuple[str, str]]:
    """``(signature, docstring)`` of each public name of ``module`` (its ``__all__``), read
    from the source without importing it: functions and classes defined there, or imported
    there from another klppo module (followed)."""
    import ast

    tree = ast.parse(_module_path(module).read_text())
    names: list[str] = []
    defs: dict[str, ast.AST] = {}
    origin: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            names = [e.value for e in getattr(node.value, "elts", [])
                     if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("klppo"):
            for a in node.names:
                origin[a.asname or a.name] = node.module or ""
    out: list[tuple[str, str]] = []
    for n in names:
        found = defs.get(n)
        if isinstance(found, ast.FunctionDef):
            out.append((f"{n}({ast.unparse(found.args)})", ast.get_docstring(found) or ""))
        elif isinstance(found, ast.ClassDef):
            init = next((b for b in found.body if isinstance(b, ast.FunctionDef)
                         and b.name == "__init__"), None)
            args = ast.unparse(init.args).removeprefix("self, ").removeprefix("self") \
                if init else ", ".join(ast.unparse(b) for b in found.bases)
            out.append((f"class {n}({args})", ast.get_docstring(found) or ""))
        elif n in origin and depth < 3:
            out += [m for m in source_members(origin[n], depth + 1)
                    if m[0].removeprefix("class ").split("(")[0] == n]
    return out


def stub_page(out: Path, missing: str) -> None:
    """The page of a module left out because its optional extra is not installed here: its
    docstring and its public functions and classes with their signatures and docstrings, all
    read from the source, and how to get the full page."""
    import html

    name, _, why = missing.partition(" ")
    members = "".join(
        f"<h2><code>{html.escape(sig)}</code></h2><pre style='white-space:pre-wrap'>"
        f"{html.escape(_plain_doc(doc))}</pre>" for sig, doc in source_members(name))
    page = out / Path(*name.split(".")).with_suffix(".html")
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(name)}</title>"
        f"</head><body style='font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem "
        f"auto'><h1><code>{html.escape(name)}</code></h1><p><em>Its optional extra was not "
        f"installed where this reference was built {html.escape(why)}: the page below is the "
        f"module's docstring and its public members, read from the source; install the "
        f"extra and run <code>make docs</code> for the full page.</em></p>"
        f"<pre style='white-space:pre-wrap'>{html.escape(_plain_doc(source_docstring(name)))}"
        f"</pre>{members}</body></html>\n")


def first_line(module: str) -> str:
    """The first sentence-line of ``module``'s docstring (imported above, else read from its
    source)."""
    import re

    loaded = sys.modules.get(module)
    doc = ((loaded.__doc__ if loaded is not None else source_docstring(module)) or "").strip()
    first = doc.split("\n\n")[0].replace("\n", " ") if doc else ""
    first = re.sub(r":\w+:`~?([^`]+)`", r"\1", first)  # :class:`~a.B` -> a.B
    return first.replace("``", "")


def write_index(out: Path, public: list[str], missing: list[str] | tuple[()] = ()) -> None:
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
    absent = {m.split(" ")[0] for m in missing}
    listed = sorted({*public, *absent}, key=lambda m: (PACKAGES.index(_package(m)), m))
    for title, internal in (("Public API", False), ("Internals", True)):
        parts.append(f"<h2>{title}</h2>")
        for pkg in PACKAGES:
            mods = [m for m in listed if _package(m) == pkg and _internal(m) == internal]
            if not mods:
                continue
            head = pkg if _internal(pkg) == internal else f"{pkg} (internals)"
            parts.append(f"<h3><a href='{pkg.replace('.', '/')}.html'>{e(head)}</a></h3>"
                         f"<p>{e(first_line(pkg))}</p><ul>")
            for m in (x for x in mods if x != pkg):
                note = " (its extra not installed here)" if m in absent else ""
                parts.append(f"<li><a href='{m.replace('.', '/')}.html'><code>{e(m)}</code></a>"
                             f" <span>{e(first_line(m))}{note}</span></li>")
            parts.append("</ul>")
    (out / "index.html").write_text("".join(parts) + "</body></html>\n")


def _package(module: str) -> str:
    return next(p for p in PACKAGES if module == p or module.startswith(p + "."))


def _internal(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in INTERNAL)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
