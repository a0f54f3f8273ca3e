"""klppo: KL-controlled policy optimisation."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["load", "__version__"]


def load(run_dir: Any, policy: str | None = None) -> Any:
    """The trained policy of a run directory (:class:`klppo.rl.policy.Policy`): ``predict(obs)``
    in Stable-Baselines3's convention, ``act(batch)``, ``config``, ``export(path)``. A
    multi-agent run holds one per policy: ``policy`` names it."""
    from klppo.rl.policy import load as _load

    return _load(run_dir, policy)
