"""Input validation shared by the core math: loud errors on shape misuse and non-finite values.

Every public function in ``klppo.core`` validates its tensors here, so a ``[B]`` tensor against a
``[B, 1]`` tensor never broadcasts silently into ``[B, B]`` and a NaN never propagates into a loss.
Finite checks synchronise with the device; :func:`validation` switches them off for a hot loop
whose inputs are already known to be good (shape checks are free and always run).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_CHECK_FINITE = True


@contextlib.contextmanager
def validation(check_finite: bool) -> Iterator[None]:
    """Temporarily enable or disable the finite-value checks (shape checks always run)."""
    global _CHECK_FINITE
    previous = _CHECK_FINITE
    _CHECK_FINITE = check_finite
    try:
        yield
    finally:
        _CHECK_FINITE = previous


def check_tensor(name: str, x: torch.Tensor) -> torch.Tensor:
    """Raise TypeError unless ``x`` is a floating tensor; ValueError if it holds NaN or inf."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if _CHECK_FINITE and x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x)).nonzero()[0].tolist()
        raise ValueError(f"{name} holds a non-finite value (first at index {bad}): {x[tuple(bad)]}")
    return x


def check_same_shape(**tensors: torch.Tensor) -> torch.Size:
    """Raise ValueError unless every tensor is finite and has exactly the same shape."""
    for name, t in tensors.items():
        check_tensor(name, t)
    return check_shapes_only(**tensors)


def check_shapes_only(**tensors: torch.Tensor) -> torch.Size:
    """Raise ValueError unless every tensor has exactly the same shape (no broadcasting)."""
    items = list(tensors.items())
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.shape != first.shape:
            raise ValueError(
                f"shape mismatch: {first_name} has shape {tuple(first.shape)} but {name} has "
                f"shape {tuple(t.shape)}; klppo never broadcasts per-sample tensors "
                f"(reshape one of them explicitly)"
            )
    return first.shape


def check_positive(name: str, value: float, allow_zero: bool = False) -> float:
    """Raise ValueError unless ``value`` is a finite number > 0 (or >= 0 with allow_zero)."""
    v = float(value)
    ok = v >= 0 if allow_zero else v > 0
    if not (ok and v == v and v != float("inf")):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {name}={value!r}")
    return v
