"""Jane Austen's six novels (public domain, shipped compressed) and their train / held-out split.

The split is by position within each novel: the first ``1 - held_out`` of every novel is training
text, the rest is held out, so held-out perplexity measures text the model never saw from every
book.
"""

from __future__ import annotations

import lzma
from dataclasses import dataclass
from importlib import resources

__all__ = ["NOVELS", "load_novels", "Split", "split_corpus"]

NOVELS = ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice",
          "sensesensibility")


def load_novels() -> dict[str, str]:
    """``{name: text}`` of the six novels, decompressed from the package data."""
    root = resources.files("klppo.lm") / "data" / "austen"
    out = {}
    for name in NOVELS:
        with (root / f"austen_{name}.txt.xz").open("rb") as f:
            out[name] = lzma.decompress(f.read()).decode("utf-8")
    return out


@dataclass(frozen=True)
class Split:
    train: str
    held_out: str


def split_corpus(held_out: float = 0.1) -> Split:
    """Concatenated train and held-out text; each novel's last ``held_out`` share is held out
    (cut at a line break)."""
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be in (0, 1), got held_out={held_out!r}")
    train, test = [], []
    for text in load_novels().values():
        cut = text.rfind("\n", 0, int(len(text) * (1 - held_out))) + 1
        train.append(text[:cut])
        test.append(text[cut:])
    return Split("\n".join(train), "\n".join(test))
