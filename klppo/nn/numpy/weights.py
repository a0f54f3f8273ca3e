"""The network's weights as ONE flat float32 buffer, handed to the step and the runner.

:func:`flat_weights` moves every parameter of a module into one contiguous buffer and makes the
torch parameters views of it (:class:`FlatWeights`), so Adam updates all of them with a few
vector operations and torch, the numpy step and the rollout runner read the same numbers. It
returns the module's existing buffer while every parameter still views it, so the update step
and the runner get the same object whichever is built first; if a parameter's storage was
replaced since (``p.data = ...``, ``module.to(...)``), the old buffer is marked ``stale`` (a
runner holding it refuses to act) and a new one is made.
"""

from __future__ import annotations

import typing
import weakref

import numpy as np
import torch
from torch import nn

__all__ = ["FlatWeights", "StaleWeights", "flat_weights", "mlp_supported"]


class StaleWeights(RuntimeError):
    """The network's parameters no longer view this buffer: acting with it would use old weights."""


def mlp_supported(seq: nn.Module) -> typing.TypeGuard[nn.Sequential]:
    """``seq`` is ``Linear (Tanh Linear)*``: what the numpy forward and backward compute."""
    if not isinstance(seq, nn.Sequential):
        return False
    mods = list(seq)
    return (len(mods) % 2 == 1 and all(isinstance(m, nn.Linear) for m in mods[::2])
            and all(isinstance(m, nn.Tanh) for m in mods[1::2]))


class FlatWeights:
    """``flat``: float32 ``[P]`` holding every parameter of a module (``module.parameters()``
    order); ``spans[i] = (start, end)`` is parameter i's slice. Made by :func:`flat_weights`;
    ``buffer`` (a contiguous float32 ``[P]``, e.g. one row of the engine's stack of
    networks) is used instead of a new array when given."""

    def __init__(self, module: nn.Module, buffer: np.ndarray | None = None) -> None:
        self.params = list(module.parameters())
        if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in self.params):
            raise ValueError("the numpy weights need float32 parameters on the CPU")
        total = sum(p.numel() for p in self.params)
        if buffer is not None and (buffer.shape != (total,) or buffer.dtype != np.float32
                                   or not buffer.flags.c_contiguous):
            raise ValueError(f"the weight buffer must be a contiguous float32 [{total}], got "
                             f"{buffer.dtype} {list(buffer.shape)}")
        self.flat = np.empty(total, np.float32) if buffer is None else buffer
        self.spans: list[tuple[int, int]] = []
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.stale = False
        at = 0
        for p in self.params:
            n = p.numel()
            self.flat[at:at + n] = p.detach().numpy().reshape(-1)
            p.data = torch.from_numpy(self.flat[at:at + n]).view(p.shape)
            self.spans.append((at, at + n))
            at += n

    def span(self, p: nn.Parameter) -> tuple[int, int]:
        """Parameter ``p``'s ``(start, end)`` in ``flat``."""
        return self.spans[self._index[id(p)]]

    def view(self, p: torch.Tensor, buffer: np.ndarray | None = None) -> np.ndarray:
        """Parameter ``p``'s slice of ``buffer`` (``flat`` by default; the step passes its flat
        gradient) in ``p``'s shape."""
        s, e = self.spans[self._index[id(p)]]
        return (self.flat if buffer is None else buffer)[s:e].reshape(p.shape)

    def mlp(self, seq: nn.Sequential, buffer: np.ndarray | None = None
            ) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[(W [out, in], b [out]), ...]`` views of a Linear/Tanh stack's layers."""
        layers = typing.cast("list[nn.Linear]", list(seq)[::2])
        return [(self.view(m.weight, buffer), self.view(m.bias, buffer)) for m in layers]

    def is_current(self) -> bool:
        """Every parameter still views its slice of ``flat`` (checked with np.shares_memory)."""
        return not self.stale and all(
            p.device.type == "cpu" and np.shares_memory(p.detach().numpy(), self.flat[s:e])
            for p, (s, e) in zip(self.params, self.spans))

    def check(self, module: nn.Module) -> None:
        """StaleWeights unless ``module``'s parameters are exactly these and view ``flat``."""
        if [id(p) for p in module.parameters()] != [id(p) for p in self.params] \
                or not self.is_current():
            raise StaleWeights("the network's parameters do not view this weight buffer "
                               "(take the weights from flat_weights(agent))")


_FLAT: weakref.WeakKeyDictionary[nn.Module, FlatWeights] = weakref.WeakKeyDictionary()


def flat_weights(module: nn.Module, buffer: np.ndarray | None = None) -> FlatWeights:
    """The module's flat weight buffer: its current one, else a new one (parameters become
    views of it; their values are unchanged, and in-place loads such as ``load_state_dict``
    keep the views valid). With ``buffer``, the parameters move into that array (see
    :class:`FlatWeights`) and a previous buffer is marked stale."""
    fw = _FLAT.get(module)
    if buffer is not None:
        if fw is not None:
            fw.stale = True
        fw = _FLAT[module] = FlatWeights(module, buffer)
        return fw
    if fw is not None:
        if fw.is_current() and [id(p) for p in module.parameters()] == [id(p) for p in fw.params]:
            return fw
        fw.stale = True
    fw = _FLAT[module] = FlatWeights(module)
    return fw
