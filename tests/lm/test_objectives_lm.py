"""The RLHF loop runs every objective of the catalogue it can (token and sequence level), hands
the sequence-level ones each token's sequence, and refuses the rest in one line."""

import json
import math

import pytest
import torch

from klppo.core.objectives import OBJECTIVES
from klppo.lm.config import ConfigError, RLHFConfig
from klppo.lm.config_checks import validate_rlhf
from klppo.lm.rlhf import rlhf
from tests.lm.conftest import TINY

LM_OBJECTIVES = [n for n, c in OBJECTIVES.items() if not c.uses_beta]


@pytest.mark.parametrize("objective", LM_OBJECTIVES)
def test_every_objective_runs_in_the_rlhf_loop(tiny_model_dir, tmp_path, objective):
    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "run"),
                     **{**TINY, "iterations": 2, "eval_every": 2, "stop_at_eos": True},
                     objective=objective)
    res = rlhf(cfg, reward=lambda p, r: [float(len(x) % 3) for x in r])
    recs = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    assert all(math.isfinite(r["loss_objective"]) for r in recs)


def test_sequence_objectives_get_each_tokens_sequence(tiny_model_dir, tmp_path, monkeypatch):
    """The loop passes sequence_ids that group the masked tokens row by row: as many tokens per
    id as the row's mask holds, in the order of the flattened tokens."""
    from klppo.core.loss import PPOLoss

    seen = []
    call = PPOLoss.__call__

    def spy(self, logp_new, *args, sequence_ids=None, **kw):
        seen.append((logp_new.shape[0], sequence_ids.clone()))
        return call(self, logp_new, *args, sequence_ids=sequence_ids, **kw)

    monkeypatch.setattr(PPOLoss, "__call__", spy)
    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "run"),
                     **{**TINY, "iterations": 1}, objective="gspo")
    rlhf(cfg, reward=lambda p, r: [1.0 for _ in r])
    assert seen
    for n, ids in seen:
        assert ids.shape == (n,) and bool((ids[1:] >= ids[:-1]).all())
        assert torch.equal(torch.bincount(ids), torch.full((TINY["minibatch_size"],),
                                                           TINY["response_len"]))


@pytest.mark.parametrize("fields, expect", [
    ({"objective": "kl_penalty"}, "objective='kl_penalty': its beta would be the reference"),
    ({"objective": "clip_kl"}, "objective='clip_kl'"),
    ({"tau_pos": 2.0}, "tau_pos=2.0: objective='clip' would ignore it"),
    ({"objective": "sapo", "eps_low": 0.1}, "eps_low=0.1: objective='sapo' would ignore it"),
    ({"objective": "trm", "cov_low": 1.0}, "cov_low=1.0: objective='trm' would ignore it"),
    ({"objective": "clip_cov", "cov_low": 6.0}, "cov_low must be < cov_high"),
    ({"objective": "kl_cov", "cov_fraction": 0.0}, "cov_fraction=0.0: must be in (0, 1]"),
    ({"objective": "dppo_tv", "delta": -1.0}, "delta=-1.0"),
    ({"objective": "gspoo"}, "objective='gspoo'"),
])
def test_bad_objective_settings_are_one_line(fields, expect):
    with pytest.raises(ConfigError) as e:
        validate_rlhf(RLHFConfig(**fields))
    assert expect in str(e.value) and "\n" not in str(e.value)
