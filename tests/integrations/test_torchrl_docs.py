"""The guide's TorchRL snippet runs (it is a ```py block, so the core docs test, which needs
no TorchRL, leaves it out)."""

import re
from pathlib import Path

import pytest

pytest.importorskip("torchrl")

ROOT = Path(__file__).resolve().parents[2]


def test_guide_torchrl_snippet_runs(capsys):
    """The snippet runs and does what its comments say: the KLip loss gives gradients and a
    kill fraction no larger than TorchRL's clip fraction (the kill set is part of the clipped
    set), KLPENPPOLoss leaves beta alone in forward and moves it on update_beta, and the PID
    controller is the one it uses."""
    import torch

    from klppo.core.controllers import PIDKL

    src = (ROOT / "docs" / "guide.md").read_text()
    section = src[src.index("## TorchRL users"):]
    code = re.findall(r"```py\n(.*?)```", section, re.S)[0]
    ns: dict = {}
    exec(compile(code, "docs/guide.md (TorchRL users)", "exec"), ns)
    clip_fraction, frac_kill, _ = (float(x) for x in re.findall(
        r"tensor\(([^,)]+)", capsys.readouterr().out))
    assert 0 <= frac_kill <= clip_fraction <= 1
    grads = [p.grad for p in ns["actor"].parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    before = float(ns["kl_loss"].beta)
    ns["kl_loss"](ns["data"])
    assert float(ns["kl_loss"].beta) == before  # forward leaves beta alone
    ns["kl_loss"].update_beta(torch.tensor(1.0))  # far above dtarg: the rule raises beta
    assert float(ns["kl_loss"].beta) > before
    assert isinstance(ns["pid"].controller, PIDKL)
