"""klppo: KL-controlled policy optimisation."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["load", "__version__"]


def load(run_dir: Any, policy: str | None = None) -> Any:
    """The trained policy of a run directory, or of its ``checkpoint.pt``
    (:class:`klppo.rl.policy.Policy`): ``predict(obs, deterministic=False)`` as
    Stable-Baselines3's (a sample unless ``deterministic=True``), ``act(batch)`` (the mode),
    ``config``, ``export(path)`` (``torch.export``, or ONNX for ``*.onnx``). The environment
    need not be installed (the run's ``spaces.json``). A multi-agent run holds one per policy:
    ``policy`` names it. See docs/usage.md."""
    from klppo.rl.policy import load as _load

    return _load(run_dir, policy)
