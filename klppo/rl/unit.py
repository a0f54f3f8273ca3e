"""One policy's learning state and its per-iteration phases after collection.

A :class:`PolicyUnit` holds what one policy learns with: its networks (a row of a stack, numpy
or torch: :mod:`klppo.rl.engine`), loss, KL controller, learner, KL monitor and normalisers. The
single-agent trainer has one; a multi-agent run (:mod:`klppo.rl.marl`) has one per policy, each
with its own objective, controller and target: each policy is one more row.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from klppo.core.controllers import is_fixed_fallback, make_controller
from klppo.core.kl import NOT_KL
from klppo.core.loss import PPOLoss
from klppo.core.mismatch import mismatch_stats, mismatch_weights
from klppo.core.monitor import KLMonitor
from klppo.core.values import explained_variance
from klppo.nn.actor_critic import ActorCritic, make_head
from klppo.rl.config import TrainConfig
from klppo.rl.envs import ObsNormalizer, RewardScaler
from klppo.rl.lr_schedule import learning_rate
from klppo.rl.policy import load_weights
from klppo.rl.rollout import RolloutBuffer
from klppo.rl.update import Batch, Learner, UpdateResult, make_loss

log = logging.getLogger(__name__)

__all__ = ["PolicyUnit", "episode_means"]


class PolicyUnit:
    """Networks (a stack row), loss, controller, learner, KL monitor and normalisers of one
    policy.

    ``cfg`` is the policy's own config (objective, ppo, kl, net); ``num_columns`` the number of
    ``[T, N]`` buffer columns it learns from (envs x agents of this policy); ``name`` prefixes
    its log lines (empty for a single-agent run).
    """

    def __init__(self, cfg: TrainConfig, obs_dim: int, action_space: Any, num_columns: int,
                 shuffle_seed: int, make_step: Callable[[ActorCritic, PPOLoss], Any],
                 name: str = "") -> None:
        self.cfg, self.name, self.obs_dim = cfg, name, obs_dim
        n, r, k = cfg.net, cfg.rollout, cfg.kl
        self.agent = ActorCritic(obs_dim, make_head(action_space), n.hidden, n.shared_trunk,
                                 n.separate_losses, n.log_std_init)
        loss = make_loss(cfg)
        backend = make_step(self.agent, loss)  # its row of a stack
        self.fast = backend.fast
        #: the numpy stack's row, handed to the rollout runner (None: a torch stack's row)
        self.weights = getattr(backend, "weights", None)
        self.controller = make_controller(k.controller, **k.controller_options())
        self.uses_beta = loss.policy.uses_beta
        self.kl_monitor = KLMonitor(self.controller.target, k.monitor_high, k.monitor_low,
                                    k.monitor_patience, loss.policy.penalty_unit)
        self._say_what_the_choices_mean(loss)
        self.obs_norm = ObsNormalizer((obs_dim,), r.clip_obs) if r.norm_obs else None
        self.rew_scale = (RewardScaler(num_columns, cfg.ppo.gamma, r.clip_reward)
                          if r.norm_reward else None)
        self.learner = Learner(cfg, backend, loss, self.controller,
                               torch.Generator().manual_seed(shuffle_seed))
        #: the policy after each of the last ppo.staleness + 1 updates (the first: the initial
        #: one, taken at the first rollout); the oldest acts (:meth:`act_stale`)
        self.past: deque[np.ndarray] = deque(maxlen=cfg.ppo.staleness + 1)
        #: the last stale rollout's mismatch metrics (:meth:`proximal`)
        self.mismatch: dict[str, float] = {}

    def _say_what_the_choices_mean(self, loss: Any) -> None:
        """Log the choices that do something users may not expect (once per run start)."""
        cfg, who = self.cfg, f"policy {self.name}: " if self.name else ""
        if is_fixed_fallback(cfg.kl.controller, cfg.kl.controller_options()) and \
                loss.policy.uses_beta:
            log.warning("%skl.controller proportional without kl.target: a fixed beta (trlx's "
                        "semantics); set kl.target to adapt it", who)
        if loss.policy.penalised and cfg.ppo.kl_estimator in NOT_KL:
            log.warning("%sppo.kl_estimator %s does not estimate KL(old || new) (see "
                        "klppo.core.kl); chosen to reproduce a peer", who, cfg.ppo.kl_estimator)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            # copies: a parameter may view a larger buffer (the engine's torch stack),
            # and torch.save writes a view's whole storage
            "agent": {k: v.clone() for k, v in self.agent.state_dict().items()},
            "optimizer": self.learner.backend.state_dict(),
            "controller": self.controller.state_dict(),
            "shuffle_generator": self.learner.gen.get_state(),
            "obs_norm": None if self.obs_norm is None else self.obs_norm.rms.state_dict(),
            "reward_scaler": None if self.rew_scale is None else self.rew_scale.state_dict(),
            "kl_monitor": self.kl_monitor.state_dict(),
            "actuator": None if self.learner.actuation is None else
            self.learner.actuation.state_dict(),
            "band_controller": None if self.learner.band is None else
            self.learner.band.state_dict(),
            "entropy_control": None if self.learner.entropy is None else
            self.learner.entropy.state_dict(),
            **({"past_policies": [x.copy() for x in self.past]} if self.cfg.ppo.staleness
               else {}),
        }

    def load_state_dict(self, s: dict[str, Any]) -> None:
        load_weights(self.agent, s["agent"], f"policy {self.name!r}" if self.name else "policy")
        self.learner.backend.load_state_dict(s["optimizer"])
        self.controller.load_state_dict(s["controller"])
        self.learner.gen.set_state(s["shuffle_generator"])
        if self.obs_norm is not None:
            self.obs_norm.rms.load_state_dict(s["obs_norm"])
        if self.rew_scale is not None:
            self.rew_scale.load_state_dict(s["reward_scaler"])
        if "kl_monitor" in s:
            self.kl_monitor.load_state_dict(s["kl_monitor"])
        if self.learner.actuation is not None:  # after the optimiser: its lr is the rule's
            self.learner.actuation.load_state_dict(s["actuator"])
        if self.learner.band is not None:
            self.learner.band.load_state_dict(s["band_controller"])
        if self.learner.entropy is not None:
            if s.get("entropy_control") is None:
                raise RuntimeError("the checkpoint holds no entropy controller state (written "
                                   "without ppo.ent_target); resume with the run's own config")
            self.learner.load_entropy_state(s["entropy_control"])
        if self.cfg.ppo.staleness:
            self.past.clear()
            self.past.extend(self._checked_past(s.get("past_policies")))

    def _checked_past(self, past: Any) -> list[np.ndarray]:
        """A checkpoint's past policies: 1 to ppo.staleness + 1 finite float32 vectors of the
        policy's size, the last the checkpoint's policy itself (loaded before them); a forged
        or foreign checkpoint is refused."""
        k, size = self.cfg.ppo.staleness, self.learner.backend.policy_weights().shape
        if not isinstance(past, list) or not 1 <= len(past) <= k + 1 or not all(
                isinstance(x, np.ndarray) and x.dtype == np.float32 and x.shape == size
                and np.isfinite(x).all() for x in past):
            raise RuntimeError(f"the checkpoint's past_policies are not 1 to {k + 1} finite "
                               f"float32 vectors of {size[0]} (written without ppo.staleness "
                               f"{k}?); resume with the run's own config")
        if not np.array_equal(past[-1], self.learner.backend.policy_weights()):
            raise RuntimeError("the checkpoint's past_policies do not end with its policy (a "
                               "checkpoint klppo writes always does): damaged or forged")
        return past

    def start_iteration(self, it: int) -> float:
        """Set iteration ``it``'s learning rate and return it: the schedule's
        (:func:`learning_rate`), or the lr actuator's current value, which replaces it."""
        a = self.learner.actuation
        if a is not None and a.knob == "lr":
            return a.value
        lr = learning_rate(self.cfg, it)
        self.learner.set_lr(lr)
        return lr

    # ---------------------------------------------------------------- stale rollouts
    def act_stale(self) -> np.ndarray | None:
        """Before a rollout with ``ppo.staleness`` k: put the policy k updates back (or the
        oldest kept, early in a run) into the row, and return the current policy's weights to
        put back after the rollout (None: the current policy acts). The critic stays the
        current one, so the rollout's values are the learner's."""
        if not self.cfg.ppo.staleness:
            return None
        slot = self.learner.backend
        now = slot.policy_weights()
        if not self.past:  # the first rollout: the initial policy
            self.past.append(now)
        if len(self.past) == 1:  # no update yet: the current policy is the oldest
            return None
        slot.load_policy_weights(self.past[0])
        return now

    def remember(self) -> None:
        """After an update: keep the updated policy for the rollouts ``staleness`` ahead."""
        if self.cfg.ppo.staleness:
            self.past.append(self.learner.backend.policy_weights())

    def proximal(self, batch: Batch) -> Batch:
        """A stale rollout's batch for the update: its ``logp`` and ``params`` become the
        proximal policy's (the current one, before the update: the ratio, the KL and the
        early stop are taken against it, decoupled PPO's proximal policy), and each sample is
        weighted by ``ppo.mismatch_correction`` of ``log pi_prox - log pi_behaviour``
        (:func:`klppo.core.mismatch.mismatch_weights`, a sample being a sequence of one); the
        mismatch's size goes to :attr:`mismatch`. An objective whose ratio is to the sampling
        policy (TOPR's ``mu``) keeps the behaviour's log-probabilities. The batch itself without
        staleness."""
        p = self.cfg.ppo
        if not p.staleness:
            return batch
        params, logp = self.learner.backend.log_prob(batch.obs.numpy(), batch.actions.numpy())
        prox = torch.from_numpy(logp)
        log_ratio = (prox - batch.logp)[:, None]
        mask = torch.ones_like(log_ratio, dtype=torch.bool)
        w = mismatch_weights(log_ratio, mask, p.mismatch_correction, p.mismatch_upper,
                             p.mismatch_lower, p.mismatch_reject)
        self.mismatch = mismatch_stats(log_ratio, mask, w)
        if self.learner.loss.policy.ratio_to_sampler:  # TOPR: its ratio is to the behaviour
            prox = batch.logp
        return dataclasses.replace(batch, logp=prox, params=torch.from_numpy(params),
                                   weight=None if p.mismatch_correction == "none" else w[:, 0])

    # ---------------------------------------------------------------- phases
    @staticmethod
    def batch(b: RolloutBuffer) -> Batch:
        """The rollout ``b``, its advantages and returns computed
        (:func:`klppo.rl.engine.advantages.group_gae`), as the update's batch: views of it,
        ``[T * N, ...]``."""
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
        return Batch(flat(b.obs), flat(b.actions), flat(b.logp), flat(b.params), flat(b.values),
                     flat(b.advantages), flat(b.returns))

    def report(self, batch: Batch, result: UpdateResult, kl_rollout: float,
               ctrl_updates: list[dict], iteration: int) -> dict[str, Any]:
        """The policy's metrics of one iteration from its update and controller (and the KL
        monitor's verdict)."""
        m: dict[str, Any] = {
            "beta": self.controller.value if self.uses_beta else 0.0,
            "kl_rollout": kl_rollout,
            **result.metrics,
            "explained_variance": float(explained_variance(batch.values, batch.returns)),
            "value_target_rms": float(batch.returns.square().mean().sqrt()),
            "controller_updates": len(ctrl_updates),
            **self.mismatch,
        }
        if self.learner.loss.policy.clipped and self.learner.band is None:
            m["clip_eps"] = self.learner.loss.band.eps  # (BAPO logs its bounds instead)
        if ctrl_updates:
            last = ctrl_updates[-1]
            m.update(kl_target=last["target"], kl_observed=last["observed"],
                     kl_relative_error=last["relative_error"],
                     kl_error_clipped=float(last["error_clipped"]),
                     beta_before=last["beta_before"], beta_after=last["beta_after"])
        m.update(self._watch_kl(iteration, kl_rollout, ctrl_updates))
        return m

    def _watch_kl(self, iteration: int, kl_rollout: float,
                  ctrl_updates: list[dict]) -> dict[str, float]:
        """The KL monitor on the controller's input (the rollout KL when it did not update)."""
        if not self.uses_beta:
            return {}
        observed = ctrl_updates[-1]["observed"] if ctrl_updates else kl_rollout
        alarm = self.kl_monitor.update(float(observed))
        if alarm.message:
            who = f"policy {self.name}: " if self.name else ""
            log.warning("iteration %d: %s%s", iteration, who, alarm.message)
        return alarm.as_metrics()


def episode_means(returns: list[float], lengths: list[int]) -> dict[str, Any]:
    """``episode_return_mean``, ``episode_length_mean`` (None without an ended episode) and
    ``episode_count`` of the episodes that ended in one rollout."""
    return {
        "episode_return_mean": float(np.mean(returns)) if returns else None,
        "episode_length_mean": float(np.mean(lengths)) if lengths else None,
        "episode_count": len(returns),
    }
