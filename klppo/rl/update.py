"""The PPO update phase: epochs of minibatch steps over one rollout, with controller cadence."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from klppo.core.advantages import normalize_advantage
from klppo.core.controllers import KLController
from klppo.core.loss import PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.rl.config import TrainConfig

__all__ = ["Batch", "UpdateResult", "Learner"]

#: diagnostics reduced with min / max over minibatches instead of the mean
_REDUCE = {"ratio_min": torch.min, "ratio_max": torch.max}


@dataclass
class Batch:
    """A flattened rollout ``[B, ...]`` ready for minibatching."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    params: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __len__(self) -> int:
        return self.obs.shape[0]


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    controller_updates: list[dict] = field(default_factory=list)


class Learner:
    """Owns the optimiser and applies the update epochs. The controller is updated here, at the
    configured cadence, from the KL measured on the minibatches (never inside the loss)."""

    def __init__(self, cfg: TrainConfig, agent: ActorCritic, controller: KLController,
                 generator: torch.Generator) -> None:
        p = cfg.ppo
        self.cfg = cfg
        self.agent = agent
        self.head = agent.head
        self.controller = controller
        self.gen = generator
        self.loss = PPOLoss(
            cfg.objective, eps=p.eps, eps_low=p.eps_low, eps_high=p.eps_high,
            dual_clip=p.dual_clip, shape=p.shape, softness=p.softness,
            kl_estimator=p.kl_estimator, vf_coef=p.vf_coef, value_loss=p.value_loss,
            value_clip=p.value_clip, ent_coef=p.ent_coef,
            normalize_advantage="minibatch" if p.norm_adv == "minibatch" else "none",
        )
        self.uses_beta = cfg.objective in ("kl_penalty", "clip_kl")
        self.params = [q for q in agent.parameters() if q.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=p.lr, eps=p.adam_eps,
                                          foreach=True)

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def _measured_kl(self, out: dict[str, torch.Tensor], kl: torch.Tensor | None) -> torch.Tensor:
        """The per-sample-mean KL(old || new) the controller is fed for minibatch/epoch cadence:
        the KL the penalty uses (analytic or the sampled estimator)."""
        if "kl_penalty" in out:
            return out["kl_penalty"]
        return kl.detach().mean() if kl is not None else out["kl_k3"]

    def update(self, batch: Batch) -> UpdateResult:
        cfg, p, kcfg = self.cfg, self.cfg.ppo, self.cfg.kl
        adv = normalize_advantage(batch.advantages) if p.norm_adv == "rollout" else batch.advantages
        B, mb = len(batch), p.minibatch_size
        sums: dict[str, torch.Tensor] = {}
        count = 0
        ctrl_updates: list[dict] = []
        early_stopped = 0.0
        epochs_done = 0
        stop = False
        for _epoch in range(p.update_epochs):
            perm = torch.randperm(B, generator=self.gen)
            epoch_kls: list[torch.Tensor] = []
            last_kl = None
            for start in range(0, B, mb):
                idx = perm[start:start + mb]
                params, values = self.agent(batch.obs[idx])
                logp_new = self.head.log_prob(params, batch.actions[idx])
                entropy = self.head.entropy(params)
                kl = self.head.kl(batch.params[idx], params)
                beta = self.controller.value if self.uses_beta else 0.0
                out = self.loss(logp_new, batch.logp[idx], adv[idx], values,
                                batch.returns[idx], batch.values[idx], entropy,
                                kl if self.loss.needs_analytic_kl else None, beta)
                if p.early_stop == "minibatch" and float(out["kl_k3"]) > 1.5 * p.target_kl:
                    early_stopped, stop = 1.0, True
                    break
                self.optimizer.zero_grad(set_to_none=True)
                out["loss"].backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, p.max_grad_norm,
                                                           foreach=True)
                self.optimizer.step()
                out["grad_norm"] = grad_norm.detach()
                out["kl_analytic"] = kl.detach().mean()
                for k, v in out.items():
                    v = v.detach()
                    if k in _REDUCE and k in sums:
                        sums[k] = _REDUCE[k](sums[k], v)
                    else:
                        sums[k] = sums[k] + v if k in sums else v
                count += 1
                last_kl = self._measured_kl(out, kl)
                epoch_kls.append(last_kl)
                if kcfg.cadence == "minibatch" and self.uses_beta:
                    self.controller.update(float(last_kl), n_steps=mb)
                    ctrl_updates.append(self.controller.info.as_dict())
            epochs_done += 1
            if stop:
                break
            if kcfg.cadence == "epoch" and self.uses_beta and last_kl is not None:
                d = torch.stack(epoch_kls).mean() if kcfg.measure == "epoch_mean" else last_kl
                self.controller.update(float(d), n_steps=B)
                ctrl_updates.append(self.controller.info.as_dict())
            if p.early_stop == "epoch" and float(out["kl_k3"]) > p.target_kl:
                early_stopped = 1.0
                break
        self._epoch_kls = epoch_kls
        self._last_kl = last_kl
        metrics = {k: float(v if k in _REDUCE else v / max(count, 1)) for k, v in sums.items()}
        metrics.update(early_stop=early_stopped, epochs=float(epochs_done),
                       minibatch_steps=float(count))
        return UpdateResult(metrics, ctrl_updates)

    @torch.no_grad()
    def rollout_kl(self, batch: Batch) -> float:
        """Analytic KL(rollout policy || updated policy), per-sample mean over the rollout."""
        params = self.agent.policy_params(batch.obs)
        return float(self.head.kl(batch.params, params).mean())

    def measured_kl(self, batch: Batch) -> float:
        """The KL for the iteration-cadence controller update, per ``kl.measure``."""
        m = self.cfg.kl.measure
        if m == "rollout" or self._last_kl is None:
            return self.rollout_kl(batch)
        if m == "epoch_mean":
            return float(torch.stack(self._epoch_kls).mean())
        return float(self._last_kl)
