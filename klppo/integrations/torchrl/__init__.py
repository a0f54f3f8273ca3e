"""TorchRL losses whose math comes from :mod:`klppo.core` (the torchrl extra).

* :class:`KLPENPPOLoss` - TorchRL's ``KLPENPPOLoss`` with the KL from :mod:`klppo.core.kl`, the
  penalty from the core ``kl_penalty`` objective and beta from a :mod:`klppo.core.controllers`
  controller (by default the ``step`` rule with TorchRL's bands and factors). Same constructor,
  keys, loss values, gradients and beta trajectory as TorchRL's class; ``update_beta_in_forward=
  False`` moves the controller out of ``forward`` (``loss.update_beta(kl)``), and any klppo
  controller can be plugged in (``controller=make_controller(...)``).
* :class:`KLipPPOLoss` - TorchRL's ``ClipPPOLoss`` whose policy term is klppo's per-sample KL
  template ``w A + beta_t log w`` (shape ``clip`` by default: PPO-Clip's gradient, bit for bit in
  float32 with a power-of-two batch), plus klppo's diagnostics (``frac_kill``, ``beta_t_q*``).

Both subclass TorchRL's own classes and reuse their private PPO helpers, so they need the TorchRL
line they were written and tested against (0.14); an older TorchRL is refused at import. The
option mapping and units: ``docs/integrations.md``.
"""

from __future__ import annotations

from klppo.runs.install import install_hint

try:
    import torchrl
    from torchrl.objectives import ppo as _ppo
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"klppo.integrations.torchrl needs TorchRL: {install_hint('torchrl')}") from err

_NEEDED = ("_broadcast_advantage_to_log_weight", "_check_advantage_broadcast")
if not all(hasattr(_ppo, n) for n in _NEEDED) or not hasattr(
        _ppo.PPOLoss, "_maybe_normalize_advantage"):  # pragma: no cover
    raise ImportError(
        f"klppo.integrations.torchrl needs torchrl >= 0.14 (found {torchrl.__version__}): it "
        "reuses the PPO helpers of that line")

from klppo.integrations.torchrl.klip import KLipPPOLoss  # noqa: E402
from klppo.integrations.torchrl.klpen import KLPENPPOLoss  # noqa: E402

__all__ = ["KLPENPPOLoss", "KLipPPOLoss"]
