"""attach_entropy: a klppo rule driving the real GRPOTrainer's entropy_coef on a tiny CPU model:
the coefficients are the rule replayed on the logged entropies, TRL's loss used them, and a
resume continues them."""

import pytest

pytest.importorskip("trl")

from klppo.core.entropy_control import make_entropy_control  # noqa: E402
from klppo.integrations.trl import (  # noqa: E402
    ENTROPY_STATE_FILE,
    TRLIntegrationError,
    attach_entropy,
)
from tests.integrations.trl_setup import klppo_logs, make_trainer, tiny_lm_dir  # noqa: E402

RULE = dict(rule="pid", target=6.0, kp=0.01, ki=0.005, coef_min=1e-4, coef_max=0.5)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return tiny_lm_dir(tmp_path_factory.mktemp("trl_entropy"))


def _spy(trainer, seen):
    original = trainer._compute_loss

    def reads(*args, **kwargs):
        seen.append((trainer.state.global_step + 1, trainer.entropy_coef))
        return original(*args, **kwargs)

    trainer._compute_loss = reads


def test_the_coefficient_is_the_rule_replayed_and_trl_uses_it(lm_dir, tmp_path):
    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", entropy_coef=0.01, save_steps=2,
                           save_strategy="steps")
    cb = attach_entropy(trainer, **RULE)
    seen = []
    _spy(trainer, seen)
    trainer.train()
    replay = make_entropy_control("pid", 0.01, 6.0, 1e-4, 0.5, kp=0.01, ki=0.005)
    logs = klppo_logs(trainer)
    for r in logs:
        assert r["klppo/entropy_coef"] == replay.value
        replay.update(r["entropy"], n_steps=4)
        assert r["klppo/entropy_coef_next"] == replay.value
    assert len({r["klppo/entropy_coef"] for r in logs}) == 4
    assert seen == [(r["step"], r["klppo/entropy_coef"]) for r in logs]
    assert (tmp_path / "o" / "checkpoint-2" / ENTROPY_STATE_FILE).is_file()
    # a resume from step 2 continues the same coefficients
    again = make_trainer("grpo", lm_dir, tmp_path / "o", entropy_coef=0.01, save_steps=2,
                         save_strategy="steps")
    attach_entropy(again, **RULE)
    again.train(resume_from_checkpoint=str(tmp_path / "o" / "checkpoint-2"))
    keys = ("entropy", "klppo/entropy_coef", "klppo/entropy_coef_next")
    assert [[r[k] for k in keys] for r in klppo_logs(again)] == [[r[k] for k in keys]
                                                                  for r in logs]
    assert cb.history[-1]["entropy_coef_next"] == again.entropy_coef


def test_what_cannot_work_is_refused(lm_dir, tmp_path):
    with pytest.raises(TRLIntegrationError, match=r"entropy_coef=0.0: with 0 at construction"):
        attach_entropy(make_trainer("grpo", lm_dir, tmp_path / "a"), **RULE)
    with pytest.raises(TRLIntegrationError, match=r"use_adaptive_entropy=True"):
        attach_entropy(make_trainer("grpo", lm_dir, tmp_path / "b", entropy_coef=0.01,
                                    use_adaptive_entropy=True), **RULE)
    with pytest.raises(TRLIntegrationError, match=r"RLOOTrainer has none"):
        attach_entropy(make_trainer("rloo", lm_dir, tmp_path / "c"), **RULE)


def test_a_bonus_over_the_top_entropy_tokens_only_is_refused(lm_dir, tmp_path):
    """top_entropy_quantile < 1: the bonus runs over the entropy mask, the logged entropy over
    every token; the controller would read another entropy than the one its coefficient
    multiplies."""
    with pytest.raises(TRLIntegrationError, match=r"top_entropy_quantile=0.5: TRL's entropy bonus"):
        attach_entropy(make_trainer("grpo", lm_dir, tmp_path / "q", entropy_coef=0.01,
                                    top_entropy_quantile=0.5), **RULE)
