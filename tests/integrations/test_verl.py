"""klppo controllers in verl's reward-side KL control, against the real verl package (CPU, no
cluster): its ``apply_kl_penalty`` and its own ``AdaptiveKLController``.

verl cannot be installed beside the ``trl`` and ``torchrl`` extras (it pins
``tensordict<=0.10`` and ``transformers<5.11``), so this file is skipped by ``make test`` and
run by ``make test-verl`` in a virtual environment of its own.
"""

import math
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("verl.trainer.ppo.ray_trainer")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, apply_kl_penalty  # noqa: E402

from klppo.core.controllers import make_controller  # noqa: E402
from klppo.core.kl import per_sequence_mean  # noqa: E402
from klppo.integrations.verl import (  # noqa: E402
    FED_UNIT,
    RewardKLControl,
    VerlIntegrationError,
    attach,
)

KLS = [0.5, 0.01, 0.3, 0.08, 0.2, 0.0, 1.5, 0.1]


def _batch(seed: int) -> DataProto:
    """Four responses of unequal lengths (mask), scores on the last token, log-probs."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                         [1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    scores = torch.zeros(4, 6)
    scores[torch.arange(4), mask.sum(1).long() - 1] = torch.randn(4, generator=g)
    old = -torch.rand(4, 6, generator=g) * 3
    ref = old - 0.3 * torch.randn(4, 6, generator=g)
    return DataProto.from_dict(tensors={"response_mask": mask, "token_level_scores": scores,
                                        "old_log_probs": old, "ref_log_prob": ref})


def test_klppos_proportional_rule_is_verls_adaptive_controller_bit_for_bit():
    verl_ctrl = core_algos.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=500)
    ours = RewardKLControl("proportional", beta=0.1, target=0.1, horizon=500, clip=0.2)
    for kl in KLS:
        verl_ctrl.update(current_kl=kl, n_steps=64)
        ours.update(current_kl=kl, n_steps=64)
        assert ours.value == verl_ctrl.value
    assert ours.value != 0.1


@pytest.mark.parametrize("estimator", ["kl", "low_var_kl"])
def test_apply_kl_penalty_penalises_with_and_feeds_the_drop_in(estimator):
    """verl's own function with klppo's controller: the rewards carry -beta * kl_t with the
    controller's beta; the controller was fed the per-sequence mean of the batch's KL and moved
    by klppo's PID rule replayed on it."""
    ctrl = RewardKLControl("pid", beta=0.05, target=0.02, kp=0.5, ki=0.2, beta_min=1e-4)
    replay = make_controller("pid", beta=0.05, target=0.02, kp=0.5, ki=0.2, beta_min=1e-4)
    for seed in range(3):
        data = _batch(seed)
        beta = ctrl.value
        kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"],
                                    kl_penalty=estimator) * data.batch["response_mask"]
        out, metrics = apply_kl_penalty(data, ctrl, kl_penalty=estimator)
        expect = data.batch["token_level_scores"] - beta * kld
        assert torch.equal(out.batch["token_level_rewards"], expect)
        fed = float(per_sequence_mean(kld, data.batch["response_mask"].bool()).mean())
        assert ctrl.history[-1]["kl"] == pytest.approx(fed, rel=1e-6)
        assert metrics["actor/reward_kl_penalty_coeff"] == beta
        replay.update(ctrl.history[-1]["kl"], n_steps=4)
        assert ctrl.value == replay.value
    assert len({r["beta"] for r in ctrl.history}) == 3 and FED_UNIT == "per_sequence_mean"


def _config(tmp_path, **trainer):
    return OmegaConf.create({
        "algorithm": {"use_kl_in_reward": True, "kl_penalty": "kl",
                      "kl_ctrl": {"type": "adaptive", "kl_coef": 0.05, "target_kl": 0.1,
                                  "horizon": 1000}},
        "trainer": {"default_local_dir": str(tmp_path / "ckpt"), "resume_mode": "auto",
                    "resume_from_path": None, **trainer}})


def _trainer(cfg):
    """A RayPPOTrainer object without workers: its checkpoint methods write the folder only
    (verl's would also save the actor through its Ray workers, which a CPU test has not)."""
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config, trainer.global_steps = cfg, 0
    trainer.kl_ctrl_in_reward = core_algos.get_kl_controller(cfg.algorithm.kl_ctrl)

    def save():
        Path(cfg.trainer.default_local_dir, f"global_step_{trainer.global_steps}").mkdir(
            parents=True, exist_ok=True)

    def load():
        trainer.global_steps = 3
        return 3

    trainer._save_checkpoint, trainer._load_checkpoint = save, load
    return trainer


def test_the_state_is_saved_beside_every_checkpoint_and_restored_on_resume(tmp_path):
    cfg = _config(tmp_path)
    first = _trainer(cfg)
    ctrl = attach(first, "proportional", target=0.1, horizon=20, beta_min=1e-4)
    assert first.kl_ctrl_in_reward is ctrl and ctrl.value == 0.05
    for step, kl in enumerate(KLS[:3], start=1):
        ctrl.update(kl, n_steps=4)
        first.global_steps = step
        first._save_checkpoint()
    beta_3 = ctrl.value
    ctrl.update(KLS[3], n_steps=4)  # step 4, not checkpointed
    again = _trainer(cfg)
    resumed = attach(again, "proportional", target=0.1, horizon=20, beta_min=1e-4)
    again._load_checkpoint()
    assert resumed.value == beta_3 and resumed.controller.num_updates == 3
    resumed.update(KLS[3], n_steps=4)
    assert resumed.value == ctrl.value  # the same trajectory as the uninterrupted run
    other = _trainer(cfg)
    attach(other, "proportional", target=0.2, horizon=20, beta_min=1e-4)
    with pytest.raises(RuntimeError, match=r"klppo_kl_controller.json: saved settings .* differs"):
        other._load_checkpoint()


def test_what_cannot_work_is_refused_before_training(tmp_path):
    cfg = _config(tmp_path)
    with pytest.raises(VerlIntegrationError,
                       match=r"the controller starts at 0.2 but algorithm.kl_ctrl.kl_coef=0.05"):
        attach(_trainer(cfg), "proportional", beta=0.2, target=0.1)
    with pytest.raises(VerlIntegrationError, match=r"controller='nope'"):
        attach(_trainer(cfg), "nope")
    cfg.algorithm.use_kl_in_reward = False
    with pytest.raises(VerlIntegrationError, match=r"use_kl_in_reward=False"):
        attach(_trainer(cfg), "fixed")
    assert not math.isnan(RewardKLControl("fixed", beta=0.1).value)
