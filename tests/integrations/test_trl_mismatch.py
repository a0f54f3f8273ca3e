"""The sampler / trainer mismatch logged by the TRL bridge where TRL's batches carry the
sampler's log-probabilities (vLLM: ``sampling_per_token_logps``, ``importance_sampling_ratio``).

No vLLM on the CPU: the test puts into each generated batch what TRL's vLLM path puts there (the
sampler's log-probs, here the trainer's old ones plus noise, and a truncated ratio) and checks
the logged ``klppo/mismatch_*`` numbers against a hand computation over the loss calls of each
log window."""

import math

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

from klppo.integrations.trl import attach  # noqa: E402
from tests.integrations.trl_setup import klppo_logs, make_trainer, tiny_lm_dir  # noqa: E402


def _with_sampler_logps(trainer):
    """Each generated batch as vLLM's would be: mu = pi_old + noise, TRL's ratio clamped at 2."""
    generate = trainer._generate_and_score_completions
    g = torch.Generator().manual_seed(3)

    def generates(*args, **kwargs):
        out = generate(*args, **kwargs)
        old = out["old_per_token_logps"]
        mu = old + 0.3 * torch.randn(old.shape, generator=g)
        mu[0, 0] = float("nan")  # a token vLLM could not score
        out["sampling_per_token_logps"] = mu
        out["importance_sampling_ratio"] = torch.exp(old - mu).clamp(max=2.0).nan_to_num(0.0)
        return out

    trainer._generate_and_score_completions = generates


def _record_loss_inputs(trainer, seen):
    compute = trainer._compute_loss

    def computes(model, inputs):
        seen.append((trainer.state.global_step + 1, {k: v for k, v in inputs.items()}))
        return compute(model, inputs)

    trainer._compute_loss = computes


def test_the_mismatch_of_each_window_is_logged_as_computed_by_hand(tmp_path):
    # num_iterations=2: TRL computes pi_old's log-probs and reuses each batch for two steps
    trainer = make_trainer("grpo", tiny_lm_dir(tmp_path), tmp_path / "run", perturb=0.05,
                           eos_bias=4.0, num_iterations=2)
    attach(trainer, "proportional", unit="per_token_mean", target=0.5, horizon=8.0,
           beta_min=1e-3)
    _with_sampler_logps(trainer)
    seen = []
    _record_loss_inputs(trainer, seen)
    trainer.train()
    logs = klppo_logs(trainer)
    assert len(logs) == 4
    for rec in logs:
        calls = [x for step, x in seen if step == rec["step"]]
        lr = torch.cat([(x["old_per_token_logps"] - x["sampling_per_token_logps"]).flatten()
                        for x in calls]).double()
        m = torch.cat([x["completion_mask"].bool().flatten() for x in calls]) & ~lr.isnan()
        w = torch.cat([x["importance_sampling_ratio"].flatten() for x in calls]).double()[m]
        lr = lr[m]
        assert rec["klppo/mismatch_kl_k1"] == pytest.approx(float((-lr).mean()), rel=1e-9)
        assert rec["klppo/mismatch_kl_k3"] == pytest.approx(
            float((lr.exp() - 1 - lr).mean()), rel=1e-9)
        assert rec["klppo/mismatch_ratio_max"] == pytest.approx(float(lr.exp().max()), rel=1e-9)
        assert rec["klppo/mismatch_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-9)
        assert rec["klppo/mismatch_ess"] == pytest.approx(
            float(w.mean()) ** 2 / float((w * w).mean()), rel=1e-9)
        assert math.isfinite(rec["klppo/mismatch_chi2_seq"])


def test_without_the_samplers_log_probs_nothing_is_logged(tmp_path):
    trainer = make_trainer("grpo", tiny_lm_dir(tmp_path), tmp_path / "run", perturb=0.05,
                           max_steps=2)
    attach(trainer, "proportional", unit="per_token_mean", target=0.5, horizon=8.0,
           beta_min=1e-3)
    trainer.train()
    assert not [k for r in klppo_logs(trainer) for k in r if "mismatch" in k]
