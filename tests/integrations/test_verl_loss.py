"""klppo controllers on verl's loss side (``kl_loss_coef``, ``entropy_coeff``), against the real
verl package: its own ``ppo_loss`` computes every loss, its own metric functions aggregate what
the actor update returns, its own config builds the actor's dataclass.

The actor workers are simulated in this process (no Ray, no FSDP): a worker group whose
``set_loss_fn`` keeps the function it is sent (as verl's ``ActorRolloutRefWorker.set_loss_fn``,
dispatched ONE_TO_ALL, does on every worker) and whose ``update_actor`` runs that function over
two mini-batches of two micro-batches each with a plain SGD step, returning the metrics as verl's
``TrainingWorker.train_mini_batch`` and ``RayPPOTrainer._update_actor`` shape them. Run by
``make test-verl``.
"""

from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("verl.workers.engine_workers")

import torch  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.metric import Metric, reduce_metrics  # noqa: E402
from verl.utils.py_functional import append_to_dict, rename_dict  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from klppo.core.controllers import make_controller  # noqa: E402
from klppo.core.entropy_control import make_entropy_control  # noqa: E402
from klppo.integrations.verl import (  # noqa: E402
    LOSS_STATE_FILE,
    VerlIntegrationError,
    attach_loss,
)

B, P, R, V = 4, 3, 5, 7  # sequences per micro-batch, prompt and response lengths, vocabulary


@pytest.fixture(scope="module")
def base_config():
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_coef=0.05",
            "actor_rollout_ref.actor.entropy_coeff=0.01"])


def _config(base, tmp_path, **actor):
    cfg = base.copy()
    cfg.trainer.default_local_dir = str(tmp_path / "ckpt")
    for k, v in actor.items():
        cfg.actor_rollout_ref.actor[k] = v
    return cfg


def _micro_batch(seed: int) -> TensorDict:
    """Four sequences (prompts of 3 tokens, responses of 5 with unequal masks), old and reference
    log-probs and advantages, padded, as ``ppo_loss`` receives them."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    td = TensorDict({
        "prompts": torch.randint(0, V, (B, P), generator=g),
        "responses": torch.randint(0, V, (B, R), generator=g),
        "attention_mask": torch.cat([torch.ones(B, P, dtype=torch.long), mask], 1),
        "response_mask": mask,
        "old_log_probs": -torch.rand(B, R, generator=g) * 2,
        "ref_log_prob": -torch.rand(B, R, generator=g) * 2,
        "advantages": torch.randn(B, R, generator=g),
    }, batch_size=[B])
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return td


def _model_output(logits: torch.Tensor, td: TensorDict) -> dict:
    """The engine's output layout: every sequence's tokens concatenated (no padding), the
    response tokens' log-probs and entropies one position to the left of each token."""
    logp = torch.log_softmax(logits, -1)
    token_logp = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    lens = td["response_mask"].sum(1).tolist()
    flat_lp, flat_h = [], []
    for b, n in enumerate(lens):
        pad = torch.zeros(P - 1)
        flat_lp += [pad, token_logp[b, :n], torch.zeros(1)]
        flat_h += [pad, entropy[b, :n], torch.zeros(1)]
    return {"log_probs": torch.cat(flat_lp), "entropy": torch.cat(flat_h)}


class Workers:
    """The actor worker group: ``set_loss_fn`` and ``update_actor`` as verl's workers do them."""

    def __init__(self, actor_section):
        worker_config = omega_conf_to_dataclass(actor_section) \
            if actor_section.ppo_micro_batch_size_per_gpu else None  # (a config verl refuses)
        self.loss_fn = lambda **kw: ppo_loss(worker_config, **kw)  # the workers' own at start
        self.logits = torch.zeros(2, 2, B, R, V, requires_grad=True)  # [mini, micro, ...]
        self.sent = []

    def set_loss_fn(self, fn):
        self.loss_fn = fn
        self.sent.append(fn)

    def update_actor(self, step: int) -> dict:
        metrics: dict = {}
        for mini in range(2):
            per_micro: dict = {}
            for micro in range(2):
                td = _micro_batch(100 * step + 10 * mini + micro)
                # the engine sets the global token count of the mini-batch before the loss
                tokens = sum(int(_micro_batch(100 * step + 10 * mini + m)["response_mask"].sum())
                             for m in range(2))
                tu.assign_non_tensor(td, batch_num_tokens=tokens, global_batch_size=2 * B)
                loss, m = self.loss_fn(model_output=_model_output(self.logits[mini, micro], td),
                                       data=td, dp_group=None)
                loss.backward()
                append_to_dict(per_micro, m)
            with torch.no_grad():
                self.logits -= 5.0 * self.logits.grad
                self.logits.grad = None
            gathered = {k: [v] for k, v in per_micro.items()}  # one data-parallel rank
            out = {k: Metric.aggregate_dp(v) if isinstance(v[0], Metric) else list(v[0])
                   for k, v in gathered.items()}
            append_to_dict(metrics, out)
        return rename_dict(metrics, "actor/")


def _trainer(cfg):
    """A RayPPOTrainer object without Ray workers: the simulated group, an ``_update_actor``
    returning what verl's returns, checkpoint methods that only make the folder."""
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config, trainer.global_steps = cfg, 0
    trainer.actor_rollout_wg = Workers(cfg.actor_rollout_ref.actor)

    def update_actor(batch):
        metrics = trainer.actor_rollout_wg.update_actor(trainer.global_steps)
        return DataProto.from_single_dict(data={}, meta_info={"metrics": metrics})

    def save():
        Path(cfg.trainer.default_local_dir, f"global_step_{trainer.global_steps}").mkdir(
            parents=True, exist_ok=True)

    def load():
        trainer.global_steps = 2
        return 2

    trainer._update_actor, trainer._save_checkpoint, trainer._load_checkpoint = \
        update_actor, save, load
    return trainer


def _batch():
    return DataProto.from_single_dict({"x": torch.zeros(16, 1)})  # 16 responses per update


def _k3_term(workers, step: int, mini: int) -> float:
    """Hand computation of a mini-batch's KL term (low_var_kl, token mean over the mini-batch),
    with the logits as they were when that mini-batch's loss was computed."""
    total, tokens = 0.0, 0
    for micro in range(2):
        td = _micro_batch(100 * step + 10 * mini + micro)
        lp = torch.log_softmax(workers.before[mini, micro], -1).gather(
            -1, td["responses"].unsqueeze(-1)).squeeze(-1)
        r = td["ref_log_prob"] - lp
        k3 = (r.exp() - r - 1).clamp(-10, 10) * td["response_mask"]
        total, tokens = total + float(k3.sum()), tokens + int(td["response_mask"].sum())
    return total / tokens


def test_the_kl_fed_is_the_term_the_coefficient_multiplies_and_the_rule_moves_it(
        base_config, tmp_path):
    cfg = _config(base_config, tmp_path)
    trainer = _trainer(cfg)
    control = attach_loss(trainer, "proportional", kl_options=dict(target=0.02, horizon=32))
    replay = make_controller("proportional", beta=0.05, target=0.02, horizon=32)
    workers = trainer.actor_rollout_wg
    for step in range(3):
        trainer.global_steps = step
        workers.before = workers.logits.detach().clone()
        coef = control.kl_coef
        out = trainer._update_actor(_batch())
        metrics = out.meta_info["metrics"]
        # verl logs the coefficient its loss used: the one the controller set after the step
        # before; the fed KL is verl's logged actor/kl_loss, the mean of the mini-batches' terms
        assert metrics["klppo/kl_coef"] == coef == replay.value
        logged = reduce_metrics({k: list(v) for k, v in metrics.items()
                                 if k.startswith("actor/")})
        assert logged["actor/kl_coef"] == pytest.approx(coef, rel=1e-12)
        assert metrics["klppo/kl"] == logged["actor/kl_loss"]
        assert step > 0 or metrics["klppo/kl"] == pytest.approx(
            (_k3_term(workers, step, 0) + _k3_term(workers, step, 1)) / 2, rel=1e-5)
        replay.update(metrics["klppo/kl"], n_steps=16)
        assert control.kl_coef == replay.value == metrics["klppo/kl_coef_next"]
        # the workers were sent verl's ppo_loss with the new coefficient
        assert workers.sent[-1].keywords["config"].kl_loss_coef == replay.value
    assert len({r["kl_coef"] for r in control.history}) == 3


def test_the_loss_sent_weighs_the_fed_kl_by_the_coefficient(base_config, tmp_path):
    """``loss(beta) - loss(0)`` is ``beta * actor/kl_loss``: the KL fed is what beta
    multiplies (verl's own ppo_loss, token-mean and seq-mean-token-mean)."""
    for mode in ("token-mean", "seq-mean-token-mean"):
        cfg = _config(base_config, tmp_path / mode, loss_agg_mode=mode)
        control = attach_loss(_trainer(cfg), make_controller("fixed", beta=0.05))
        td = _micro_batch(0)
        logits = torch.randn(B, R, V, generator=torch.Generator().manual_seed(1))
        with_beta, m = control.loss_fn()(model_output=_model_output(logits, td), data=td)
        control.kl._beta = 0.0
        without, _ = control.loss_fn()(model_output=_model_output(logits, td), data=td)
        assert float(with_beta - without) == pytest.approx(0.05 * m["kl_loss"].values[0],
                                                           rel=1e-5)


def test_the_entropy_coefficient_is_driven_by_the_entropy_it_multiplies(base_config, tmp_path):
    cfg = _config(base_config, tmp_path)
    trainer = _trainer(cfg)
    ent = make_entropy_control("proportional", coef=0.01, target=2.5, horizon=32)
    replay = make_entropy_control("proportional", coef=0.01, target=2.5, horizon=32)
    control = attach_loss(trainer, entropy=ent)
    for step in range(2):
        trainer.global_steps = step
        metrics = trainer._update_actor(_batch()).meta_info["metrics"]
        logged = reduce_metrics({"e": list(metrics["actor/entropy_loss"])})["e"]
        assert metrics["klppo/entropy"] == logged
        replay.update(logged, n_steps=16)
        assert control.entropy_coeff == replay.value
        config = trainer.actor_rollout_wg.sent[-1].keywords["config"]
        assert config.entropy_coeff == replay.value and config.kl_loss_coef == 0.05
    assert control.entropy_coeff != 0.01


def test_the_state_is_saved_beside_every_checkpoint_and_restored_into_the_workers(
        base_config, tmp_path):
    cfg = _config(base_config, tmp_path)
    first = _trainer(cfg)
    control = attach_loss(first, "pid", kl_options=dict(target=0.02, kp=0.5, ki=2.0))
    for step in (1, 2):
        first.global_steps = step
        first._update_actor(_batch())
        first._save_checkpoint()
    coef_2 = control.kl_coef
    assert (tmp_path / "ckpt" / "global_step_2" / LOSS_STATE_FILE).is_file()
    again = _trainer(cfg)
    resumed = attach_loss(again, "pid", kl_options=dict(target=0.02, kp=0.5, ki=2.0))
    again._load_checkpoint()
    assert resumed.kl_coef == coef_2 and resumed.kl.integral == control.kl.integral
    assert again.actor_rollout_wg.sent[-1].keywords["config"].kl_loss_coef == coef_2
    (tmp_path / "ckpt" / "global_step_2" / "kl_ctrl_state.pt").write_bytes(b"")
    with pytest.raises(RuntimeError, match=r"verl saved its own KL controller state "
                                           r"\(kl_ctrl_state.pt\)"):
        _trainer_with(cfg)._load_checkpoint()


def _trainer_with(cfg):
    t = _trainer(cfg)
    attach_loss(t, "pid", kl_options=dict(target=0.02, kp=0.5, ki=2.0))
    return t


@pytest.mark.parametrize("actor, kw, message", [
    ({"use_kl_loss": False}, dict(kl="pid", kl_options={"target": 0.1}),
     r"use_kl_loss=False: there is no KL in the loss"),
    ({"loss_agg_mode": "token-sum"}, dict(kl="pid", kl_options={"target": 0.1}),
     r"loss_agg_mode='token-sum'"),
    ({}, dict(kl="pid", kl_options={"target": 0.1, "beta": 0.2}),
     r"the KL controller starts at 0.2 but actor_rollout_ref.actor.kl_loss_coef=0.05"),
    ({"entropy_coeff": 0.0}, dict(entropy="pid", entropy_options={"target": 2.0}),
     r"entropy_coeff=0 and calculate_entropy=False"),
    ({}, dict(), r"give kl, entropy or both"),
    ({"ppo_micro_batch_size_per_gpu": None}, dict(kl="pid", kl_options={"target": 0.1}),
     r"actor_rollout_ref.actor: verl cannot build it"),
])
def test_what_cannot_work_is_refused_in_one_line(base_config, tmp_path, actor, kw, message):
    with pytest.raises(VerlIntegrationError, match=message) as e:
        attach_loss(_trainer(_config(base_config, tmp_path, **actor)), **kw)
    assert "\n" not in str(e.value)


def test_verls_workers_take_a_loss_function_on_every_worker():
    """What the bridge relies on: the actor worker's set_loss_fn, dispatched to all workers."""
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch
    from verl.workers.engine_workers import ActorRolloutRefWorker

    assert getattr(ActorRolloutRefWorker.set_loss_fn, MAGIC_ATTR)["dispatch_mode"] is \
        Dispatch.ONE_TO_ALL
