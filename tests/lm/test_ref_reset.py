"""Reference reset / sync in `klppo rlhf`: when it happens, what the reference becomes, and an
exact resume across resets."""

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from klppo.lm.config import ConfigError, RLHFConfig  # noqa: E402
from klppo.lm.config_checks import validate_rlhf  # noqa: E402
from klppo.lm.model import mix_reference  # noqa: E402
from klppo.lm.rlhf import RLHFError, resume_rlhf, rlhf  # noqa: E402
from tests.lm.conftest import TINY  # noqa: E402
from tests.lm.test_resume import Crash, reward, strip  # noqa: E402


def _cfg(model, out, **kw):
    return RLHFConfig(model=str(model), out=str(out), **{**TINY, **kw})


def test_mix_moves_each_parameter_towards_the_policy():
    ref, pol = nn.Linear(3, 2), nn.Linear(3, 2)
    before = [p.detach().clone() for p in ref.parameters()]
    mix_reference(ref, pol, 0.25)
    for r, b, p in zip(ref.parameters(), before, pol.parameters()):
        assert torch.allclose(r, 0.25 * p + 0.75 * b)
    mix_reference(ref, pol, 1.0)
    assert all(torch.equal(r, p) for r, p in zip(ref.parameters(), pol.parameters()))


def test_a_periodic_hard_reset_makes_the_policy_the_reference(tiny_model_dir, tmp_path):
    res = rlhf(_cfg(tiny_model_dir, tmp_path / "run", iterations=4, ref_reset_every=2,
                    checkpoint_every=4), reward=reward)
    assert [m["ref_reset"] for m in res.metrics] == [0, 1, 0, 1]
    assert [m["ref_resets"] for m in res.metrics] == [0, 1, 1, 2]
    state = torch.load(res.run_dir / "checkpoint.pt", weights_only=True)
    lm = {k.removeprefix("lm."): v for k, v in state["policy"].items() if k.startswith("lm.")}
    assert state["ref"].keys() <= lm.keys()
    assert all(torch.equal(state["ref"][k], lm[k]) for k in state["ref"])
    # iteration 3 samples from the policy the reset made the reference: a KL of exactly 0
    assert res.metrics[2]["kl"] == 0.0 and res.metrics[3]["kl"] != 0.0


def test_a_kl_bound_resets_after_the_iteration_that_crossed_it(tiny_model_dir, tmp_path):
    res = rlhf(_cfg(tiny_model_dir, tmp_path / "run", iterations=4, ref_reset_kl=1e-9,
                    ref_reset_mix=0.6, checkpoint_every=4), reward=reward)
    assert [m["ref_reset"] for m in res.metrics] == [int(m["kl"] > 1e-9) for m in res.metrics]
    assert res.metrics[-1]["ref_resets"] >= 1


def test_a_resume_across_resets_is_exact(tiny_model_dir, tmp_path):
    full = rlhf(_cfg(tiny_model_dir, tmp_path / "full", ref_reset_every=2), reward=reward)
    run = tmp_path / "run"

    def crash(m):
        if m["iteration"] == 5:  # checkpoint at 3 holds the reference of the reset at 2
            raise Crash("simulated crash")

    with pytest.raises(RLHFError):
        rlhf(_cfg(tiny_model_dir, run, ref_reset_every=2), reward=reward, on_iteration=crash)
    assert strip(resume_rlhf(run, reward=reward).metrics) == strip(full.metrics)


def test_a_mix_without_a_reset_is_refused():
    with pytest.raises(ConfigError, match=r"ref_reset_mix=0.5: only a reference reset"):
        validate_rlhf(RLHFConfig(ref_reset_mix=0.5))
    with pytest.raises(ConfigError, match=r"ref_reset_mix=0.0: must be in \(0, 1\]"):
        validate_rlhf(RLHFConfig(ref_reset_every=2, ref_reset_mix=0.0))
