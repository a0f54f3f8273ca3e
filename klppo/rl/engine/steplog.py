"""One update's step outputs of a stack's rows, stacked as the steps compute them.

A :class:`~klppo.nn.step.StepResult` per row and step is what a row's schedule reads; the
diagnostics read every step of a row at once. :class:`StepLog` keeps each per-sample output
``[R, S, n]`` and each per-step number ``[R, S]`` (S the update's most steps, n the minibatch
size), written by the numpy stack's step for all its stepping rows with one assignment per
quantity, so that :func:`~klppo.rl.engine.learn.diagnostics_rows` slices a family's rows
instead of concatenating R x S pieces. A row's slice holds the numbers of its own steps (the
pieces :func:`klppo.rl.update.step_parts` would concatenate, per-step numbers as float32 as it
makes them): ``tests/rl/test_engine.py`` compares the diagnostics with and without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["StepLog"]


class StepLog:
    """Per quantity ``[R, S, ...]``; row r's steps so far: ``steps[r]``."""

    def __init__(self, R: int, steps: int, n: int) -> None:
        self.R, self.S, self.n = R, steps, n
        self.steps = [0] * R
        self.arrays: dict[str, np.ndarray] = {}

    def at(self, rows: np.ndarray) -> tuple[Any, Any]:
        """The index of the rows ``rows``' current step in every quantity: basic indexing when
        they are at one step and side by side in the stack (the common case)."""
        rl = rows.tolist()
        k = self.steps[rl[0]]
        if any(self.steps[r] != k for r in rl):
            return rows, np.array([self.steps[r] for r in rl])
        if rl == list(range(rl[0], rl[0] + len(rl))):
            return slice(rl[0], rl[0] + len(rl)), k
        return rows, k

    @staticmethod
    def part(at: tuple[Any, Any], sel: Any) -> tuple[Any, Any]:
        """The index :meth:`at` gave for a step's rows, narrowed to their positions ``sel`` (a
        slice of positions, or an array of them)."""
        rows, k = at
        if isinstance(rows, slice) and isinstance(sel, slice):
            return slice(rows.start + sel.start, rows.start + sel.stop), k
        if isinstance(rows, slice):
            rows = np.arange(rows.start, rows.stop)
        return rows[sel], (k if isinstance(k, int) else k[sel])

    def put(self, at: tuple[Any, Any], name: str, x: Any) -> None:
        """The values of ``name`` at ``at`` (:meth:`at`): ``x [A, n]`` per sample (its dtype
        kept), or ``[A]`` per step (stored as float32, as ``step_parts`` makes them)."""
        a = self.arrays.get(name)
        if a is None:
            x = np.asarray(x)
            shape, dtype = x.shape[1:], (x.dtype if x.ndim > 1 else np.float32)
            a = self.arrays[name] = np.zeros((self.R, self.S, *shape), dtype)
        a[at] = x

    def advance(self, rows: np.ndarray) -> None:
        """The rows ``rows`` took their step."""
        for r in rows.tolist():
            self.steps[r] += 1

    def rows(self, rows: np.ndarray, names: Any, steps: int) -> dict[str, np.ndarray]:
        """``names`` of the rows ``rows`` over their first ``steps`` steps, ``[A, steps * n]``
        (per-step numbers ``[A, steps]``), each row's steps one after another."""
        return {k: self.arrays[k][rows, :steps].reshape(len(rows), -1) for k in names}
