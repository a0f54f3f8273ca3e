"""`klppo rlhf --loss-reduction seq_mean_token_mean`: each response's token mean, then the mean
over responses (verl's setting for SAPO), as the per-token weight N / (S L_i) on the objective,
checked by hand on responses of unequal lengths."""

from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")

from klppo.core.loss import PPOLoss  # noqa: E402
from klppo.lm import experiment as E  # noqa: E402
from klppo.lm.config import ConfigError, RLHFConfig  # noqa: E402
from klppo.lm.config_checks import validate_rlhf  # noqa: E402
from klppo.lm.rlhf import rlhf  # noqa: E402
from tests.lm.conftest import TINY  # noqa: E402
from tests.lm.test_resume import reward  # noqa: E402


@pytest.fixture
def calls(monkeypatch):
    """Responses of lengths 1..response_len (by row), and every loss call's arguments."""
    def ragged(responses, eos, stop):
        lengths = torch.arange(responses.shape[0]) % responses.shape[1] + 1
        return torch.arange(responses.shape[1])[None, :] < lengths[:, None]

    seen = []
    call = PPOLoss.__call__

    def spy(self, logp_new, logp_old, advantage, *args, sequence_ids=None, sample_weight=None,
            **kwargs):
        seen.append((logp_new.detach(), logp_old, advantage, sequence_ids, sample_weight,
                     call(self, logp_new, logp_old, advantage, *args, sequence_ids=sequence_ids,
                          sample_weight=sample_weight, **kwargs)))
        return seen[-1][-1]

    monkeypatch.setattr(E, "response_mask", ragged)
    monkeypatch.setattr(PPOLoss, "__call__", spy)
    return seen


def _cfg(model, out, **kw):
    return RLHFConfig(model=str(model), out=str(out), **{**TINY, "iterations": 1, **kw})


@pytest.mark.parametrize("objective", ["sapo", "clip"])
def test_seq_mean_token_mean_is_the_mean_of_each_responses_token_mean(tiny_model_dir, tmp_path,
                                                                      calls, objective):
    rlhf(_cfg(tiny_model_dir, tmp_path / "run", objective=objective,
              loss_reduction="seq_mean_token_mean"), reward=reward)
    assert calls
    for logp, logp_old, adv, ids, weight, out in calls:
        length = Counter(ids.tolist())
        assert len(set(length.values())) > 1  # unequal lengths in this minibatch
        n, s = len(ids), len(length)
        assert weight.tolist() == pytest.approx([n / (s * length[i]) for i in ids.tolist()])
        # the policy term by hand: per response, the mean of its tokens' objective
        ratio = (logp - logp_old).exp()
        per_token = PPOLoss(objective, normalize_advantage="none").policy.term(
            ratio, logp, logp_old, adv, None, 0.0, want_beta=False).objective
        means = [per_token[ids == i].mean() for i in length]
        assert float(out["loss_objective"]) == pytest.approx(-float(sum(means) / s), rel=1e-5)


def test_token_mean_weighs_nothing(tiny_model_dir, tmp_path, calls):
    rlhf(_cfg(tiny_model_dir, tmp_path / "run", objective="sapo"), reward=reward)
    assert calls and all(weight is None for *_, weight, _ in calls)


def test_a_sequence_objective_refuses_it():
    with pytest.raises(ConfigError, match=r"loss_reduction='seq_mean_token_mean': "
                                          r"objective='gspo' already reduces"):
        validate_rlhf(RLHFConfig(objective="gspo", loss_reduction="seq_mean_token_mean"))
