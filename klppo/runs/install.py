"""The one way klppo tells a user how to install a missing extra.

klppo is installed from a clone (it is on no package index yet), so the command is pip's
editable install of the clone with the project's pinned versions, run in the clone's root.
"""

from __future__ import annotations

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """``pip install -c constraints.txt -e '.[EXTRA]'`` (run in the klppo clone)."""
    return f"pip install -c constraints.txt -e '.[{extra}]' (in the klppo clone)"
