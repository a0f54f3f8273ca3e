"""Checks shared by the bad-input tables: one line, the field and value named, no traceback,
and nothing created."""

from __future__ import annotations

from pathlib import Path


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (to show that a refused command created nothing)."""
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}


def assert_one_line_error(rc: int, err: str, expect_rc: int, command: str,
                          needles: list[str]) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == expect_rc, (rc, err)
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith(f"klppo {command}: "), lines[0]
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


def run_main(argv: list[str]) -> int:
    """``klppo.cli.main(argv)`` in-process; argparse's exits become the return code."""
    from klppo.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
