"""The one update loop over its two stacks: every controller cadence and both early stops give the
same decisions and (to float32 rounding) the same numbers with the numpy fast path as with torch
autograd, on the same rollout."""

import copy
import dataclasses

import pytest
import torch

from klppo import rl
from klppo.core.controllers import make_controller
from klppo.rl.engine.numpy_stack import NumpyStack
from klppo.rl.engine.torch_stack import TorchStack
from klppo.rl.trainer import _Trainer
from klppo.rl.update import Learner, make_loss
from tests.rl.update_helpers import rollout_batch, update_one

NumpyStep, TorchStep = "numpy", "torch"

K = dict
CASES = {
    "minibatch_cadence": ("kl_penalty", {}, K(controller="step", preset="klip", target=0.01,
                                               cadence="minibatch", measure="last_minibatch")),
    "epoch_cadence_epoch_mean": ("clip_kl", K(kl_estimator="k3"),
                                 K(controller="proportional", target=0.01, beta=0.1,
                                   horizon=1000, cadence="epoch", measure="epoch_mean")),
    "epoch_cadence_last": ("kl_penalty", {}, K(controller="step", preset="rllib",
                                               cadence="epoch", measure="last_minibatch")),
    "iteration_epoch_mean": ("kl_penalty", K(kl_estimator="k2"),
                             K(controller="pid", target=0.01, beta=0.5, cadence="iteration",
                               measure="epoch_mean")),
    "iteration_rollout": ("kl_penalty", {}, K(controller="step", preset="klip")),
    "early_stop_minibatch": ("clip", K(target_kl=0.002, early_stop="minibatch"), {}),
    "early_stop_epoch": ("per_sample_kl", K(target_kl=0.002, early_stop="epoch"), {}),
    "lr_actuator_rsl_rl": ("clip", K(anneal_lr=False), K(actuator="lr", target=0.005)),
    "clip_actuator_rl_games": ("clip_kl", {}, K(actuator="clip", actuator_rule="rl_games")),
}


def config(case):
    objective, ppo, kl = CASES[case]
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), objective=objective, tensorboard=False)
    cfg.ppo = dataclasses.replace(cfg.ppo, lr=3e-3, **ppo)
    cfg.kl = dataclasses.replace(cfg.kl, **kl)
    return rl.validate(cfg)


def learner(cfg, agent, library):
    """A learner whose network is row 0 of a one-row stack of ``library``."""
    loss = make_loss(cfg)
    ctrl = make_controller(cfg.kl.controller, **cfg.kl.controller_options())
    stack = NumpyStack(1) if library == "numpy" else TorchStack(1, "cpu")
    slot = stack.maker(0, cfg.ppo)(agent, loss)
    return Learner(cfg, slot, loss, ctrl, torch.Generator().manual_seed(7))


@pytest.mark.parametrize("case", list(CASES))
def test_fast_and_torch_backends_agree_on_every_cadence_and_early_stop(tmp_path, case):
    cfg = config(case)
    tr = _Trainer.alone(dataclasses.replace(cfg, fast_path=False), tmp_path)
    tr.collector.reset(cfg.seed)
    tr.collect_rollout(1)
    batch = rollout_batch(tr.unit, tr.collector.buf)
    tr.env.close()
    results = {}
    for name, cls in (("torch", TorchStep), ("numpy", NumpyStep)):
        lrn = learner(cfg, copy.deepcopy(tr.agent), cls)
        res, kl = update_one(lrn, batch)
        results[name] = (res.metrics, kl, [u["beta_after"] for u in lrn.schedule.updates])
    (mt, klt, bt), (mn, kln, bn) = results["torch"], results["numpy"]
    for k in ("epochs", "minibatch_steps", "early_stop"):
        assert mt[k] == mn[k], k
    assert len(bt) == len(bn) == {"minibatch": mt["minibatch_steps"], "epoch": mt["epochs"],
                                  "iteration": 1}.get(cfg.kl.cadence, 0) * (
        1 if make_loss(cfg).policy.uses_beta else 0)
    assert bn == pytest.approx(bt, rel=1e-4)
    assert kln == pytest.approx(klt, rel=1e-3, abs=1e-7)
    for k in ("loss", "value_loss", "kl_k3", "frac_kill", "entropy"):
        assert mn[k] == pytest.approx(mt[k], rel=1e-3, abs=1e-6), k
    if cfg.kl.actuator != "beta":  # the same rule decisions on both backends' KLs
        knob = "lr" if cfg.kl.actuator == "lr" else "clip_eps"
        assert mn[knob] == pytest.approx(mt[knob], rel=1e-6) and mn["actuator_updates"] == 80
    if "early_stop" in case:
        assert mt["early_stop"] == 1.0 and mt["epochs"] < cfg.ppo.update_epochs
    else:
        assert mt["epochs"] == cfg.ppo.update_epochs


def test_checkpoint_optimiser_state_is_the_same_format_for_both_backends(tmp_path):
    """A torch stack's optimiser state loads into the numpy stack and back, unchanged."""
    cfg = config("minibatch_cadence")
    tr = _Trainer.alone(dataclasses.replace(cfg, fast_path=False), tmp_path)
    tr.collector.reset(cfg.seed)
    tr.collect_rollout(1)
    batch = rollout_batch(tr.unit, tr.collector.buf)
    tr.env.close()
    a = learner(cfg, copy.deepcopy(tr.agent), TorchStep)
    update_one(a, batch)
    state = a.backend.state_dict()
    assert set(state) == {"lr", "m", "v", "t"} and state["t"] > 0
    b = learner(cfg, copy.deepcopy(tr.agent), NumpyStep)
    b.backend.load_state_dict(state)
    again = b.backend.state_dict()
    assert again["t"] == state["t"] and (again["m"] == state["m"]).all()
    c = learner(cfg, copy.deepcopy(tr.agent), TorchStep)
    c.backend.load_state_dict(again)
    assert (c.backend.state_dict()["v"] == state["v"]).all()
