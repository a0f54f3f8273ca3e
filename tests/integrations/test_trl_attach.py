"""attach() refuses, at attach time and in one line, what cannot work; a resume without the
controller's state (or with another controller) is refused before the first step."""

import json

import pytest

pytest.importorskip("trl")

from klppo.core.controllers import make_controller  # noqa: E402
from klppo.integrations.trl import (  # noqa: E402
    STATE_FILE,
    KLControlCallback,
    TRLIntegrationError,
    attach,
)
from tests.integrations.trl_setup import make_trainer, tiny_lm_dir  # noqa: E402

OK = dict(target=0.5, beta_min=1e-3)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return tiny_lm_dir(tmp_path_factory.mktemp("trl_attach"))


@pytest.fixture
def grpo(lm_dir, tmp_path):
    return make_trainer("grpo", lm_dir, tmp_path / "out")


def _refused(trainer, match, controller="proportional", unit="per_token_mean", **options):
    with pytest.raises(TRLIntegrationError, match=match) as e:
        attach(trainer, controller, unit=unit, **(options or OK))
    assert "\n" not in str(e.value)


def test_attach_puts_the_callback_before_the_reporters(grpo):
    cb = attach(grpo, "proportional", unit="per_token_mean", **OK)
    names = [type(c).__name__ for c in grpo.callback_handler.callbacks]
    assert names[:2] == ["DefaultFlowCallback", "KLControlCallback"]
    assert cb.controller.value == grpo.beta == 0.1 and cb.spec.estimator == "k3"
    _refused(grpo, "already attached")


def test_beta_zero_at_construction_is_refused(lm_dir, tmp_path):
    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", beta=0.0)
    assert trainer.ref_model is None  # what TRL does with beta 0
    _refused(trainer, r"beta=0: .* loads no reference model", beta=0.1, **OK)


def test_a_controller_starting_elsewhere_or_able_to_reach_zero_is_refused(grpo):
    _refused(grpo, r"controller beta=0.2 but GRPOTrainer.beta=0.1", beta=0.2, **OK)
    _refused(grpo, r"beta_min=0.0: must be > 0", target=0.5, beta_min=0.0)
    with pytest.raises(TRLIntegrationError, match=r"beta_min=0.0: must be > 0"):
        attach(grpo, make_controller("pid", beta=0.1, target=0.5), unit="per_token_mean")
    with pytest.raises(TRLIntegrationError, match="given with a controller object"):
        attach(grpo, make_controller("fixed", beta=0.1), unit="per_token_mean", target=1.0)
    _refused(grpo, "controller='nope'", controller="nope")
    _refused(grpo, r"unit='nats': must be one of", unit="nats")
    cb = attach(grpo, make_controller("fixed", beta=0.1), unit="per_token_mean")
    assert cb.controller.name == "fixed"  # a fixed beta needs no floor


def test_a_trl_is_accepted_by_its_internals_not_its_version(grpo, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    attach(grpo, "proportional", **OK)  # a new version string with the same loss code: fine
    grpo.callback_handler.callbacks = [c for c in grpo.callback_handler.callbacks
                                       if not isinstance(c, KLControlCallback)]

    def _compute_loss(self, model, inputs):  # a release whose loss no longer adds beta * k3
        return model(inputs).loss

    monkeypatch.setattr(trl.GRPOTrainer, "_compute_loss", _compute_loss)
    _refused(grpo, r"trl==1.17.0: GRPOTrainer._compute_loss lacks .* lines tested: TRL 1.16")


def test_unknown_trainers_and_overrides_are_refused(grpo, lm_dir, tmp_path):
    from trl import GRPOTrainer

    from klppo.runs.errors import UserInputError

    _refused(object(), r"trainer=object: not a trainer .* GRPOTrainer, RLOOTrainer")
    _refused(42, r"trainer=int: not a trainer")
    # a controller that is neither a name nor a klppo controller (issue #32): klppo's error
    with pytest.raises(UserInputError, match=r"controller=42: must be a klppo KLController"):
        attach(grpo, 42, unit="per_token_mean")

    class MyGRPO(GRPOTrainer):
        def _compute_loss(self, model, inputs):  # e.g. a custom KL term
            return super()._compute_loss(model, inputs)

    grpo.__class__ = MyGRPO
    _refused(grpo, r"overrides _compute_loss of GRPOTrainer")


def test_a_fused_loss_holding_a_copy_of_beta_is_refused(grpo):
    grpo.liger_grpo_loss = object()  # where TRL < 1.0 kept its Liger GRPO loss (beta copied)
    _refused(grpo, r"liger_grpo_loss is a fused loss that copied beta=0.1")


@pytest.mark.parametrize("kind, setting, match", [
    ("rloo", dict(logging_steps=2), r"logging_steps \* gradient_accumulation_steps = 2 > "),
    ("rloo", dict(mask_truncated_completions=True), r"mask_truncated_completions=True"),
])
def test_a_unit_conversion_that_would_not_be_exact_is_refused(lm_dir, tmp_path, kind, setting,
                                                               match):
    trainer = make_trainer(kind, lm_dir, tmp_path / "o", **setting)
    _refused(trainer, match, unit="per_sequence_sum")
    attach(trainer, "proportional", unit="per_token_mean", **OK)  # the logged unit: no problem


@pytest.mark.parametrize("setting", [dict(gradient_accumulation_steps=2),
                                     dict(num_iterations=2), dict(logging_steps=2)])
def test_grpo_reads_its_kl_per_token_so_every_unit_is_served(lm_dir, tmp_path, setting):
    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", **setting)
    for unit in ("per_token_mean", "per_sequence_mean", "per_sequence_sum", "per_padded_token"):
        cb = attach(trainer, "proportional", unit=unit, **OK)
        trainer.callback_handler.remove_callback(cb)
    _refused(trainer, r"unit='nats': must be one of per_token_mean, per_sequence_mean",
             unit="nats")
    rloo = make_trainer("rloo", lm_dir, tmp_path / "r")
    _refused(rloo, r"unit='per_sequence_mean': must be one of per_token_mean, per_sequence_sum "
                   r"for RLOOTrainer", unit="per_sequence_mean")


def test_gspo_ratio_on_the_kl_is_refused_and_a_forward_kl_warns(lm_dir, tmp_path):
    from klppo.core.kl_gradient_claims import KLGradientWarning

    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", importance_sampling_level="sequence")
    _refused(trainer, r"importance_sampling_level='sequence' with use_bias_correction_kl=True: "
                      r".* neither KL's")
    trainer = make_trainer("grpo", lm_dir, tmp_path / "n", use_bias_correction_kl=False)
    with pytest.warns(KLGradientWarning, match=r"use_bias_correction_kl=False, first pass: .* "
                                               r"KL\(reference \|\| policy\), the forward KL"):
        attach(trainer, "proportional", **OK)
    trainer = make_trainer("grpo", lm_dir, tmp_path / "m", use_bias_correction_kl=False,
                           num_iterations=2)
    with pytest.warns(KLGradientWarning, match=r"first pass: .* the forward KL"):
        attach(trainer, "proportional", **OK)


def test_rloo_with_several_logs_per_generation_is_accepted(lm_dir, tmp_path):
    trainer = make_trainer("rloo", lm_dir, tmp_path / "o", num_iterations=2, logging_steps=2)
    assert isinstance(attach(trainer, "step", unit="per_sequence_sum", target=1.0,
                             beta=0.1, beta_min=1e-3), KLControlCallback)


def test_resume_without_or_with_another_controller_state_is_refused(lm_dir, tmp_path):
    out = tmp_path / "o"
    first = make_trainer("grpo", lm_dir, out, max_steps=1, save_strategy="steps", save_steps=1)
    attach(first, "proportional", unit="per_token_mean", **OK)
    first.train()
    ckpt = out / "checkpoint-1"
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["controller"]["num_updates"] == 1 and state["unit"] == "per_token_mean"

    again = make_trainer("grpo", lm_dir, out, max_steps=2)
    attach(again, "proportional", unit="per_token_mean", target=0.7, beta_min=1e-3)
    with pytest.raises(RuntimeError, match=r"saved settings .* differs .* \['target'\]"):
        again.train(resume_from_checkpoint=str(ckpt))

    (ckpt / STATE_FILE).unlink()
    again = make_trainer("grpo", lm_dir, out, max_steps=2)
    attach(again, "proportional", unit="per_token_mean", **OK)
    with pytest.raises(RuntimeError, match="no klppo controller state"):
        again.train(resume_from_checkpoint=str(ckpt))


def test_a_moving_reference_is_refused(lm_dir, tmp_path):
    """TRL's sync_ref_model and the experimental BEMA reference callback move the reference
    during training: the KL the target is about restarts, so attach refuses."""
    trainer = make_trainer("grpo", lm_dir, tmp_path / "s", sync_ref_model=True,
                           ref_model_sync_steps=4)
    _refused(trainer, r"sync_ref_model=True: TRL moves the reference towards the policy every "
                      r"ref_model_sync_steps=4 steps", target=0.5, beta_min=1e-3)
    from trl.experimental.bema_for_ref_model import BEMACallback

    trainer = make_trainer("grpo", lm_dir, tmp_path / "b")
    trainer.add_callback(BEMACallback(update_ref_model=True))
    _refused(trainer, r"BEMACallback from trl.experimental.bema_for_ref_model", target=0.5,
             beta_min=1e-3)
