"""One policy's side of the PPO update: its loss, learner state, schedule and diagnostics.

The update loop itself (epochs, minibatches, steps) is the engine's, written once for a stack of
policies (:func:`klppo.rl.engine.learn.update_rows`). Per policy it uses what this module holds:
a :class:`Learner` (its stack row, loss, KL controller, shuffle generator, lr / clip actuator and
clip-bound controller), a :class:`Schedule` per update, which owns the controller cadence
(minibatch / epoch / iteration), the actuator's updates around each step and both early stops,
and :meth:`Learner.diagnostics`, computed once per iteration over every step's detached
per-sample outputs (the same means as averaging per-minibatch values, at a fraction of the
cost; docs/metrics.md).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from klppo.core._checks import validation
from klppo.core.advantages import normalize_advantage
from klppo.core.controllers import KLController
from klppo.core.diagnostics import policy_diagnostics
from klppo.core.entropy_control import make_entropy_control
from klppo.core.kl import k3
from klppo.core.loss import PPOLoss
from klppo.core.objectives import Knobs
from klppo.nn.step import StepResult
from klppo.rl.actuate import Actuation
from klppo.rl.band_control import BandControl
from klppo.rl.config import TrainConfig

__all__ = ["Batch", "UpdateResult", "Schedule", "Learner", "make_loss"]


#: the per-sample outputs of a step (and its gradient norm) that the diagnostics read
STEP_OUTPUTS = ("idx", "logp", "values", "entropy", "kl", "adv", "grad_norm")


def make_loss(cfg: TrainConfig) -> PPOLoss:
    """The PPO loss of a training config (its objective comes from the core's registry)."""
    p = cfg.ppo
    return PPOLoss(
        cfg.objective, eps=p.eps, eps_low=p.eps_low, eps_high=p.eps_high,
        dual_clip=p.dual_clip, shape=p.shape, softness=p.softness,
        kl_estimator=p.kl_estimator, vf_coef=p.vf_coef, value_loss=p.value_loss,
        value_clip=p.value_clip, ent_coef=p.ent_coef,
        normalize_advantage="minibatch" if p.norm_adv == "minibatch" else "none",
        knobs=Knobs(p.tau_pos, p.tau_neg, p.tau, p.delta, p.cov_fraction, p.cov_low,
                    p.cov_high, p.kl_cov_coef),
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
    #: each sample's weight on the objective (a stale rollout's correction,
    #: :meth:`klppo.rl.unit.PolicyUnit.proximal`; None: 1)
    weight: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.obs.shape[0]

    def to(self, device: torch.device) -> Batch:
        """The batch on ``device`` (itself when it is there already)."""
        if self.obs.device == torch.device(device):
            return self
        moved: dict[str, Any] = {f: None if (x := getattr(self, f)) is None else x.to(device)
                                 for f in self.__dataclass_fields__}
        return dataclasses.replace(self, **moved)


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    controller_updates: list[dict] = field(default_factory=list)


class Schedule:
    """When the controller updates (after every minibatch, epoch or iteration), from which KL,
    when the lr / clip actuator acts (around every minibatch step, :mod:`klppo.rl.actuate`), and
    when the update stops early (SB3's minibatch rule: before every step, stop the whole update
    when the minibatch's k3 exceeds ``1.5 target_kl``; CleanRL's epoch rule: stop after an epoch
    whose last step's k3 exceeded ``target_kl``). One instance per update; ``updates`` lists the
    controller's records."""

    def __init__(self, cfg: TrainConfig, controller: KLController, uses_beta: bool,
                 actuation: Actuation | None = None, band: BandControl | None = None) -> None:
        self.cfg, self.controller, self.uses_beta = cfg, controller, uses_beta
        self.actuation, self.band = actuation, band
        self.updates: list[dict] = []
        self.epoch_kls: list[Any] = []
        self.last_kl: Any = None
        self.early_stopped = False
        if actuation is not None:
            actuation.begin()

    def _update(self, kl: Any, n_steps: int) -> None:
        self.controller.update(float(kl), n_steps=n_steps)
        info = self.controller.info
        assert info is not None  # (an update records it)
        self.updates.append(info.as_dict())

    def beta(self) -> float:
        return self.controller.value if self.uses_beta else 0.0

    def start_epoch(self) -> None:
        self.epoch_kls = []  # an iteration-cadence epoch mean reads the last epoch's

    def skip_minibatch(self, k3: Any) -> bool:
        """Minibatch early stop; ``k3`` is called only when that rule is on."""
        p = self.cfg.ppo
        if p.early_stop == "minibatch" and k3() > 1.5 * _target(p.target_kl):
            self.early_stopped = True
        return self.early_stopped

    @property
    def acts_before_step(self) -> bool:
        """Whether :meth:`before_step` does anything (an actuator or a band controller)."""
        return self.actuation is not None or self.band is not None

    def before_step(self, idx: torch.Tensor) -> None:
        """The actuator's before-step update (rsl_rl's timing), if it has one, and the
        clip-bound controller's choice of this step's band."""
        if self.actuation is not None:
            self.actuation.before_step(idx)
        if self.band is not None:
            self.band.before_step(idx)

    def after_step(self, r: StepResult, n: int) -> None:
        if self.actuation is not None:
            self.actuation.after_step(r)
        if not self.uses_beta:  # no controller reads the minibatch KL
            return
        self.last_kl = r.controller_kl
        self.epoch_kls.append(self.last_kl)
        if self.cfg.kl.cadence == "minibatch":
            self._update(self.last_kl, n)

    def after_epoch(self, last: StepResult | None, batch: Batch) -> bool:
        """Epoch-cadence controller update and the epoch early stop; True: stop the update."""
        k = self.cfg.kl
        if self.uses_beta and k.cadence == "epoch":
            d = _concat(self.epoch_kls).mean() if k.measure == "epoch_mean" else self.last_kl
            self._update(d, len(batch))
        if self.cfg.ppo.early_stop == "epoch" and last is not None:
            log_r = torch.as_tensor(last.logp) - batch.logp[torch.as_tensor(last.idx)]
            if float(k3(log_r).mean()) > _target(self.cfg.ppo.target_kl):
                self.early_stopped = True
        return self.early_stopped

    def after_iteration(self, rollout_kl: float, batch_size: int) -> None:
        """Iteration-cadence update from the rollout KL, the last minibatch's or the last
        epoch's mean (``kl.measure``)."""
        k = self.cfg.kl
        if not (self.uses_beta and k.cadence == "iteration"):
            return
        d: Any
        if k.measure == "rollout" or self.last_kl is None:
            d = rollout_kl
        elif k.measure == "epoch_mean":
            d = _concat(self.epoch_kls).mean()
        else:
            d = self.last_kl
        self._update(d, batch_size)


class Learner:
    """One policy's learner state: its stack row (``backend``, a
    :class:`~klppo.rl.engine.rows.RowSlot`), loss, KL controller (updated by the
    :class:`Schedule` from the KL measured on the minibatches, never inside the loss), shuffle
    generator, and its lr / clip actuator and clip-bound controller if it has them."""

    def __init__(self, cfg: TrainConfig, backend: Any, loss: PPOLoss,
                 controller: KLController, generator: torch.Generator) -> None:
        self.cfg, self.backend, self.loss = cfg, backend, loss
        self.controller, self.gen = controller, generator
        self.uses_beta = loss.policy.uses_beta
        self.actuation = Actuation.from_config(cfg, backend, loss)
        self.band = BandControl.from_config(cfg, backend, loss)
        p = cfg.ppo
        self.entropy = None if p.ent_target is None else make_entropy_control(
            p.ent_controller, p.ent_coef, p.ent_target, p.ent_coef_min, p.ent_coef_max)
        self.schedule = Schedule(cfg, controller, self.uses_beta, self.actuation, self.band)

    def set_lr(self, lr: float) -> None:
        self.backend.set_lr(lr)

    def new_schedule(self) -> Schedule:
        """The schedule of a new update (it starts the actuator's record)."""
        self.schedule = Schedule(self.cfg, self.controller, self.uses_beta, self.actuation,
                                 self.band)
        return self.schedule

    def advantages_for_update(self, batch: Batch) -> torch.Tensor:
        """The advantages the steps use: normalised once over the rollout with
        ``ppo.norm_adv rollout`` (per minibatch, inside the loss, with ``minibatch``)."""
        if self.cfg.ppo.norm_adv == "rollout":
            return normalize_advantage(batch.advantages)
        return batch.advantages

    def update_metrics(self, batch: Batch, steps: list[StepResult], sched: Schedule,
                       epochs: int, diagnostics: dict[str, float] | None = None) -> UpdateResult:
        """The update's metrics (diagnostics, early stop, steps, the actuator's and the band
        controller's) and controller records; ``diagnostics``: this update's
        :meth:`diagnostics` where they were computed with other rows'
        (:func:`diagnostics_rows`)."""
        p, B = self.cfg.ppo, len(batch)
        if diagnostics is None:
            with validation(False):
                diagnostics = self.diagnostics(batch, steps)
        metrics = dict(diagnostics)
        planned = p.update_epochs * -(-B // p.minibatch_size)
        metrics.update(early_stop=float(sched.early_stopped), epochs=float(epochs),
                       minibatch_steps=float(len(steps)), update_fraction=len(steps) / planned)
        if self.actuation is not None:
            metrics.update(self.actuation.metrics())
        if self.band is not None:
            metrics.update(self.band.metrics())
        if self.entropy is not None and "entropy" in metrics:
            metrics.update(self.drive_entropy(metrics["entropy"], B))
        return UpdateResult(metrics, sched.updates)

    def drive_entropy(self, entropy: float, n: int) -> dict[str, float]:
        """Feed the update's mean entropy to the entropy controller and set the coefficient
        the next update uses; the metrics ``ent_coef`` (used) and ``ent_coef_next``."""
        assert self.entropy is not None
        used = self.loss.ent_coef
        self.loss.ent_coef = self.entropy.update(entropy, n_steps=n)
        return {"ent_coef": used, "ent_coef_next": self.loss.ent_coef}

    def load_entropy_state(self, state: dict[str, Any]) -> None:
        """Restore the entropy controller and the coefficient it had set."""
        assert self.entropy is not None
        self.entropy.load_state_dict(state)
        self.loss.ent_coef = self.entropy.value

    @property
    def row_band(self) -> tuple[Any, ...] | None:
        """The band the diagnostics read, when one for every sample (no clip actuator, no
        band controller): rows with the same one compute them together
        (:func:`diagnostics_rows`); None: a band per step, this row alone."""
        clip_actuated = self.actuation is not None and self.actuation.knob == "clip"
        if clip_actuated or self.band is not None:
            return None
        b = self.loss.policy.band
        return (b.eps, b.eps_low, b.eps_high) if b.is_scalar else None

    @torch.no_grad()
    def diagnostics(self, batch: Batch, steps: list[StepResult]) -> dict[str, float]:
        """The policy diagnostics (docs/metrics.md) over every sample of every minibatch step."""
        if not steps:
            return {}
        cat, s = step_parts(steps)
        if not bool(torch.isfinite(cat["loss"]).all()):
            raise FloatingPointError(NON_FINITE)
        policy = self.loss.policy
        if self.actuation is not None and self.actuation.knob == "clip":
            policy = _per_sample_band(policy, steps, eps=self.actuation.used)
        if self.band is not None:
            policy = _per_sample_band(policy, steps, edges=self.band.used)
        band = policy.band
        d = diagnostic_stats((band.eps, band.eps_low, band.eps_high), cat, s,
                             batch.logp[cat["idx"]])
        return {k: float(v) for k, v in d.items()}


NON_FINITE = "the PPO loss became non-finite during the update"


def step_parts(steps: list[StepResult], rows: int = 1
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The steps' outputs and loss terms (``cat``) and the per-sample quantities the loss used
    (``s``), each concatenated over the steps; ``steps`` of ``rows`` rows one after another
    (each with as many steps): ``[rows, N]`` each."""
    def one(parts: list) -> torch.Tensor:
        x = _concat(parts)
        return x if rows == 1 else x.reshape(rows, -1)

    first = steps[0]
    cat = {k: one([getattr(r, k) for r in steps]) for k in STEP_OUTPUTS}
    cat.update({k: one([r.terms[k] for r in steps]) for k in first.terms})
    return cat, {k: one([r.samples[k] for r in steps]) for k in first.samples}


def diagnostic_stats(band: tuple[Any, ...], cat: dict[str, torch.Tensor],
                     s: dict[str, torch.Tensor], logp_old: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """The diagnostics of :func:`step_parts` (``[N]``: 0-d each; ``[A, N]``: each row's
    ``[A]``, the numbers of the row alone), with the band ``(eps, eps_low, eps_high)``."""
    rows = cat["logp"].dim() == 2
    dim = -1 if rows else None
    eps, eps_low, eps_high = band
    d = policy_diagnostics(cat["logp"], logp_old, s["advantage"], eps, eps_low, eps_high,
                           s.get("beta_t"), s["ratio"], rows=rows)
    d.update(value_loss=s["value_loss"].mean(dim),
             value_clip_fraction=s["value_clipped"].float().mean(dim),
             entropy=cat["entropy"].mean(dim), kl_analytic=cat["kl"].mean(dim),
             grad_norm=cat["grad_norm"].mean(dim))
    for k in ("loss", "loss_objective", "loss_critic", "loss_entropy", "kl_penalty"):
        if k in cat:
            d[k] = cat[k].mean(dim)
    return d


def _per_sample_band(policy: Any, steps: list[StepResult], eps: list[float] | None = None,
                     edges: list[tuple[float, float]] | None = None) -> Any:
    """A copy of ``policy`` whose band holds, per sample, the eps (clip actuator) or the
    ``(eps_low, eps_high)`` (clip-bound controller) its step used, for the diagnostics."""
    def per_sample(values: list[float]) -> torch.Tensor:
        return torch.cat([torch.full((len(r.idx),), v, dtype=torch.float32)
                          for r, v in zip(steps, values)])

    out = copy.copy(policy)
    if eps is not None:
        out.band = dataclasses.replace(policy.band, eps=per_sample(eps))
    else:
        assert edges is not None
        out.band = dataclasses.replace(policy.band, eps_low=per_sample([e[0] for e in edges]),
                                       eps_high=per_sample([e[1] for e in edges]))
    return out


def _target(target_kl: float | None) -> float:
    """``ppo.target_kl`` where an early stop reads it (validation makes it a number there)."""
    assert target_kl is not None
    return target_kl


def _concat(parts: list) -> torch.Tensor:
    """One tensor from per-step pieces: tensors or numpy arrays are concatenated, scalars
    (0-d tensors or floats) stacked; floats become float32 like ``torch.tensor(x)``."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts) if first.dim() else torch.stack(parts)
    if isinstance(first, np.ndarray):
        return torch.from_numpy(np.concatenate(parts))
    return torch.tensor(parts, dtype=torch.float32)
