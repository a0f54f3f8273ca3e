"""The PPO update phase: epochs of minibatch steps over one rollout, with controller cadence.

The minibatch loop does only what the step needs (forward, loss, fused clipped Adam step) and
keeps the detached per-sample outputs; the diagnostics (docs/metrics.md) are computed once per
iteration over all of them (:meth:`Learner.update`), which gives the same means as averaging
per-minibatch values and costs one vectorised pass instead of dozens of tiny ops per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from klppo.core._checks import validation
from klppo.core.advantages import normalize_advantage
from klppo.core.controllers import KLController
from klppo.core.diagnostics import policy_diagnostics
from klppo.core.loss import PPOLoss
from klppo.core.values import value_loss
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.fastpath import FastStep
from klppo.rl.config import TrainConfig
from klppo.rl.optim import ClippedAdam

__all__ = ["Batch", "UpdateResult", "Learner", "make_loss"]


def make_loss(cfg: TrainConfig) -> PPOLoss:
    """The PPO loss of a training config (its objective comes from the core's registry)."""
    p = cfg.ppo
    return PPOLoss(
        cfg.objective, eps=p.eps, eps_low=p.eps_low, eps_high=p.eps_high,
        dual_clip=p.dual_clip, shape=p.shape, softness=p.softness,
        kl_estimator=p.kl_estimator, vf_coef=p.vf_coef, value_loss=p.value_loss,
        value_clip=p.value_clip, ent_coef=p.ent_coef,
        normalize_advantage="minibatch" if p.norm_adv == "minibatch" else "none",
    )


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
                 generator: torch.Generator,
                 flat: tuple[np.ndarray, list[tuple[int, int]]] | None = None,
                 loss: PPOLoss | None = None) -> None:
        p = cfg.ppo
        self.cfg = cfg
        self.agent = agent
        self.head = agent.head
        self.controller = controller
        self.gen = generator
        self.loss = loss if loss is not None else make_loss(cfg)
        self.uses_beta = self.loss.policy.uses_beta
        self.params = [q for q in agent.parameters() if q.requires_grad]
        if flat is not None:  # numpy fast path (klppo.nn.fastpath); same math
            self.optimizer = FastStep(agent, self.loss, p.lr, p.adam_eps, p.max_grad_norm,
                                      *flat)
        else:
            self.optimizer = ClippedAdam(self.params, lr=p.lr, eps=p.adam_eps,
                                         max_norm=p.max_grad_norm)
        self.fast = flat is not None
        self._epoch_kls: list[torch.Tensor] = []
        self._last_kl: torch.Tensor | None = None

    def set_lr(self, lr: float) -> None:
        self.optimizer.set_lr(lr)

    def _minibatch_kl(self, out: dict[str, torch.Tensor], kl: torch.Tensor) -> torch.Tensor:
        """KL(old || new) fed to a minibatch/epoch-cadence controller, nats per sample: the KL the
        penalty uses (analytic or the sampled estimator), else the analytic KL."""
        return out["kl_penalty"] if "kl_penalty" in out else kl.detach().mean()

    def update(self, batch: Batch) -> UpdateResult:
        p, kcfg = self.cfg.ppo, self.cfg.kl
        adv = normalize_advantage(batch.advantages) if p.norm_adv == "rollout" else batch.advantages
        B, mb = len(batch), p.minibatch_size
        keep: dict[str, list[torch.Tensor]] = {k: [] for k in (
            "idx", "logp", "values", "entropy", "kl", "adv", "loss", "loss_objective",
            "loss_critic", "loss_entropy", "grad_norm")}
        ctrl_updates: list[dict] = []
        early_stopped, epochs_done, stop = 0.0, 0, False
        needs_kl = self.loss.needs_analytic_kl
        if self.fast:
            npb = {k: getattr(batch, k).numpy() for k in ("obs", "actions", "logp", "params",
                                                           "values", "returns")}
            np_adv = adv.numpy()
        with validation(False):  # inputs come from a checked rollout; the result is checked below
            for _epoch in range(p.update_epochs):
                perm = torch.randperm(B, generator=self.gen)
                self._epoch_kls = []
                steps_before = len(keep["idx"])
                for start in range(0, B, mb):
                    idx = perm[start:start + mb]
                    beta = self.controller.value if self.uses_beta else 0.0
                    if self.fast:
                        i = idx.numpy()
                        if p.early_stop == "minibatch" and self._k3_too_high(
                                batch, idx, npb, i, p.target_kl):
                            early_stopped, stop = 1.0, True
                            break
                        a_i = np.take(np_adv, i)
                        r = self.optimizer.step(*(np.take(npb[k], i, axis=0) for k in (
                            "obs", "actions", "params", "logp")), a_i, np.take(npb["returns"], i),
                            np.take(npb["values"], i), beta, p.ent_coef > 0, needs_kl)
                        self._record(keep, i, r["logp"], r["values"], r["entropy"], r["kl"],
                                     a_i, r["grad_norm"], r)
                        if not self.uses_beta:  # no controller reads the minibatch KL
                            continue
                        self._last_kl = r["kl_penalty"]  # every beta objective has the term
                        self._epoch_kls.append(self._last_kl)
                        if kcfg.cadence == "minibatch":
                            self.controller.update(float(self._last_kl), n_steps=mb)
                            ctrl_updates.append(self.controller.info.as_dict())
                        continue
                    params, values = self.agent(batch.obs[idx])
                    logp_new = self.head.log_prob(params, batch.actions[idx])
                    with torch.set_grad_enabled(p.ent_coef > 0):
                        entropy = self.head.entropy(params)
                    with torch.set_grad_enabled(needs_kl):
                        kl = self.head.kl(batch.params[idx], params)
                    out = self.loss(logp_new, batch.logp[idx], adv[idx], values,
                                    batch.returns[idx], batch.values[idx], entropy,
                                    kl if needs_kl else None, beta, diagnostics=False)
                    if p.early_stop == "minibatch":
                        lr_ = logp_new.detach() - batch.logp[idx]
                        if float((lr_.expm1() - lr_).mean()) > 1.5 * p.target_kl:
                            early_stopped, stop = 1.0, True
                            break
                    grad_norm = self.optimizer.step(out["loss"])
                    self._record(keep, idx, logp_new, values, entropy, kl, adv[idx], grad_norm,
                                 out)
                    self._last_kl = self._minibatch_kl(out, kl)
                    self._epoch_kls.append(self._last_kl)
                    if kcfg.cadence == "minibatch" and self.uses_beta:
                        self.controller.update(float(self._last_kl), n_steps=mb)
                        ctrl_updates.append(self.controller.info.as_dict())
                epochs_done += 1
                if stop or len(keep["idx"]) == steps_before:
                    break
                if kcfg.cadence == "epoch" and self.uses_beta:
                    d = (_concat(self._epoch_kls).mean() if kcfg.measure == "epoch_mean"
                         else self._last_kl)
                    self.controller.update(float(d), n_steps=B)
                    ctrl_updates.append(self.controller.info.as_dict())
                if p.early_stop == "epoch":
                    last_idx, last_logp = (torch.as_tensor(keep[k][-1]) for k in ("idx", "logp"))
                    lr_ = last_logp - batch.logp[last_idx]
                    if float((lr_.expm1() - lr_).mean()) > p.target_kl:
                        early_stopped = 1.0
                        break
        with validation(False):  # the loss was checked; everything else derives from the rollout
            metrics = self._diagnostics(batch, keep)
        metrics.update(early_stop=early_stopped, epochs=float(epochs_done),
                       minibatch_steps=float(len(keep["idx"])))
        return UpdateResult(metrics, ctrl_updates)

    @staticmethod
    def _record(keep, idx, logp_new, values, entropy, kl, adv, grad_norm, out) -> None:
        """Keep one step's detached outputs: tensors (torch path) or numpy arrays and floats
        (fast path); :func:`_concat` joins either kind."""
        for k, v in (("idx", idx), ("logp", logp_new), ("values", values),
                     ("entropy", entropy), ("kl", kl), ("adv", adv),
                     ("grad_norm", grad_norm), ("loss", out["loss"]),
                     ("loss_objective", out["loss_objective"]),
                     ("loss_critic", out["loss_critic"]),
                     ("loss_entropy", out["loss_entropy"])):
            keep[k].append(v.detach() if isinstance(v, torch.Tensor) else v)
        if "kl_penalty" in out:
            v = out["kl_penalty"]
            keep.setdefault("kl_penalty", []).append(
                v.detach() if isinstance(v, torch.Tensor) else v)

    def _k3_too_high(self, batch, idx, npb, i, target_kl) -> bool:
        """SB3's minibatch early stop, checked before the step: k3 > 1.5 target."""
        with torch.no_grad():
            params = self.agent.policy_params(batch.obs[idx])
            lr_ = self.head.log_prob(params, batch.actions[idx]) - batch.logp[idx]
        return float((lr_.expm1() - lr_).mean()) > 1.5 * target_kl

    @torch.no_grad()
    def _diagnostics(self, batch: Batch, keep: dict[str, list[torch.Tensor]]) -> dict[str, float]:
        """The policy diagnostics (docs/metrics.md) over every sample of every minibatch step."""
        if not keep["idx"]:
            return {}
        cat = {k: _concat(v) for k, v in keep.items()}
        if not bool(torch.isfinite(cat["loss"]).all()):
            raise FloatingPointError("the PPO loss became non-finite during the update")
        idx = cat["idx"]
        logp_old, adv = batch.logp[idx], cat["adv"]
        ratio = torch.exp(cat["logp"] - logp_old)
        p, band = self.cfg.ppo, self.loss.band
        beta_t = self.loss.policy.beta_t(ratio, adv)
        d = policy_diagnostics(cat["logp"], logp_old, adv, band.eps, band.eps_low, band.eps_high,
                               beta_t)
        v_loss, v_clipped = value_loss(cat["values"], batch.returns[idx], batch.values[idx],
                                       p.value_clip, p.value_loss)
        d.update(value_loss=v_loss.mean(), value_clip_fraction=v_clipped.float().mean(),
                 entropy=cat["entropy"].mean(), kl_analytic=cat["kl"].mean(),
                 grad_norm=cat["grad_norm"].mean())
        for k in ("loss", "loss_objective", "loss_critic", "loss_entropy", "kl_penalty"):
            if k in cat:
                d[k] = cat[k].mean()
        return {k: float(v) for k, v in d.items()}

    @torch.no_grad()
    def rollout_kl(self, batch: Batch) -> float:
        """Analytic KL(rollout policy || updated policy), per-sample mean over the rollout."""
        if self.fast:
            return self.optimizer.policy_kl(batch.obs.numpy(), batch.params.numpy())
        params = self.agent.policy_params(batch.obs)
        return float(self.head.kl(batch.params, params).mean())

    def measured_kl(self, batch: Batch) -> float:
        """The KL for the iteration-cadence controller update, per ``kl.measure``."""
        m = self.cfg.kl.measure
        if m == "rollout" or self._last_kl is None:
            return self.rollout_kl(batch)
        if m == "epoch_mean":
            return float(_concat(self._epoch_kls).mean())
        return float(self._last_kl)


def _concat(parts: list) -> torch.Tensor:
    """One tensor from per-step pieces: tensors or numpy arrays are concatenated, scalars
    (0-d tensors or floats) stacked; floats become float32 like ``torch.tensor(x)``."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts) if first.dim() else torch.stack(parts)
    if isinstance(first, np.ndarray):
        return torch.from_numpy(np.concatenate(parts))
    return torch.tensor(parts, dtype=torch.float32)
