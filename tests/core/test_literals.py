"""Every ``Literal`` of names that a config or the CLI offers equals the registry behind it, so
a new objective, controller, estimator, shape or value loss cannot be offered without being
implemented, or implemented without being offered."""

import typing

import pytest

from klppo.core import controllers, kl, loss, surrogates, values
from klppo.core.objectives import OBJECTIVES


def _names(literal) -> set[str]:
    return set(typing.get_args(literal))


@pytest.mark.parametrize("literal, registry", [
    (loss.ObjectiveName, set(OBJECTIVES)),
    (controllers.ControllerName, set(controllers.CONTROLLERS)),
    (controllers.StepPreset, set(controllers.STEP_PRESETS)),
    (kl.Estimator, set(kl.ESTIMATORS)),
    (kl.Estimator, set(kl.ESTIMATOR_GRADS)),
    (loss.KLEstimatorChoice, {"analytic"} | set(kl.ESTIMATORS)),
    (surrogates.Shape, set(surrogates.SHAPES)),
    (values.ValueLossKind, set(values._ELEMENTWISE)),
    (values.ValueLossKind, set(values._CLOSED_FORMS)),
], ids=["objective", "controller", "step_preset", "estimator", "estimator_grad",
        "kl_estimator_choice", "shape", "value_loss", "value_loss_closed_form"])
def test_every_literal_equals_its_registry(literal, registry):
    assert _names(literal) == registry


def test_the_train_config_offers_the_registries():
    from klppo.rl.config import KLConfig, PPOConfig, TrainConfig

    hints = {**typing.get_type_hints(TrainConfig), **typing.get_type_hints(PPOConfig),
             **typing.get_type_hints(KLConfig)}
    assert _names(hints["objective"]) == set(OBJECTIVES)
    assert _names(hints["controller"]) == set(controllers.CONTROLLERS)
    assert _names(hints["shape"]) == set(surrogates.SHAPES)


def test_the_actuator_choices_equal_their_registries():
    from klppo.core.actuators import ACTUATOR_RULES, RuleName
    from klppo.rl.actuate import ACTUATORS
    from klppo.rl.config import KLConfig

    hints = typing.get_type_hints(KLConfig)
    assert _names(RuleName) == _names(hints["actuator_rule"]) == set(ACTUATOR_RULES)
    assert _names(hints["actuator"]) == set(ACTUATORS)


def test_the_band_controller_choices_equal_their_registry():
    from klppo.rl.band_control import BAND_CONTROLLERS
    from klppo.rl.config import PPOConfig

    assert _names(typing.get_type_hints(PPOConfig)["band_controller"]) == set(BAND_CONTROLLERS)
