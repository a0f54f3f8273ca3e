"""Every key a tiny `klppo rlhf` run logs (both KL placements) is in docs/metrics.md."""

from klppo.lm.config import RLHFConfig
from klppo.lm.rlhf import rlhf
from tests.lm.conftest import TINY
from tests.test_metrics_documented import documented


def test_every_key_of_a_tiny_rlhf_run_is_documented(tiny_model_dir, tmp_path):
    keys: set[str] = set()
    for placement in ("reward", "loss"):
        cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / placement),
                         **{**TINY, "iterations": 3}, kl_placement=placement)
        keys |= set().union(*(set(m) for m in rlhf(cfg).metrics))
    assert {"kl_alarm_low", "kl_loss", "kl_loss_form", "held_out_perplexity", "samples"} <= keys
    missing = sorted(k for k in keys if not documented(k))
    assert not missing, f"docs/metrics.md does not document {missing}"
