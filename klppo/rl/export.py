"""Export a policy module to a file that runs without klppo: ``torch.export`` or ONNX.

``torch.export`` (the successor of TorchScript, which torch deprecates) captures the module as a
graph with a dynamic batch dimension and saves it as a ``.pt2`` program. ONNX goes through
``torch.onnx.export`` (the dynamo exporter), which needs the ``onnx`` and ``onnxscript``
packages; they are optional.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from klppo.runs.install import install_hint

__all__ = ["export_policy", "ONNX_MISSING"]

ONNX_MISSING = ("exporting to ONNX needs the onnx and onnxscript packages: "
                f"{install_hint('onnx')}, or pip install onnx onnxscript")


def export_policy(module: nn.Module, obs_dim: int, path: Path) -> Path:
    """Write ``module`` (``obs [B, obs_dim] float32 -> action [B, ...]``) to ``path``: ONNX when
    it ends in ``.onnx``, else a ``torch.export`` program. ImportError naming the packages when
    ONNX is asked for and not installed."""
    module = module.eval()
    example = (torch.zeros(2, obs_dim),)
    batch = torch.export.Dim("batch")
    shapes = {"obs": {0: batch}}
    if path.suffix.lower() == ".onnx":
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError:
            raise ImportError(ONNX_MISSING) from None
        with _quiet_onnx_exporter():
            program = torch.onnx.export(module, example, input_names=["obs"],
                                        output_names=["action"], dynamic_shapes=shapes,
                                        dynamo=True, verbose=False)
        assert program is not None  # dynamo=True without a file name returns the program
        program.save(str(path))
        return path
    exported = torch.export.export(module, example, dynamic_shapes=shapes)
    torch.export.save(exported, str(path))
    return path


@contextlib.contextmanager
def _quiet_onnx_exporter() -> Iterator[None]:
    """torch's ONNX exporter logs a line per torchvision operator it skips (torchvision is not
    klppo's) and torch's own pytree deprecation: neither concerns the user, so neither is
    shown while the policy is exported; its errors still are."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec")
            yield
    finally:
        registration.setLevel(level)
