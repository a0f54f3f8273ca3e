"""``--device``: cpu, cuda or auto, resolved once, early, with a one-line error."""

from __future__ import annotations

import torch

__all__ = ["resolve_device", "DEVICES"]

DEVICES = ("cpu", "cuda", "auto")


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``auto`` (cuda when available) as a torch device; ValueError naming
    the value when CUDA is asked for and not available."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device={name!r}: must be cpu, cuda or auto")
    if name == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no GPU found"
        raise ValueError(f"device='cuda': CUDA is not available ({why}); use --device cpu or "
                         f"auto")
    return torch.device(name)
