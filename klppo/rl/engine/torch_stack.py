"""The torch stack: R policies' networks as one float32 tensor ``W [R, P]`` on a device (the CPU
or a GPU), and their one minibatch step with autograd.

A policy trains here when the numpy fast path cannot serve it (``fast_path: false``, a shared
trunk, an objective without a closed-form derivative or a per-sample band) or when it trains on a
GPU. Row r holds policy r's parameters in ``agent.parameters()`` order and the agent's parameters
are views of it, so its checkpoint, its rollout runner (:class:`klppo.nn.runners.TorchRunner`)
and the stacked forward read the same numbers. Each row's optimiser state is its row of a
:class:`klppo.rl.optim.TorchAdam`.

:meth:`TorchStack.step` is THE torch minibatch step (a plain run is a stack of one): one stacked
forward of every network (``baddbmm`` over ``[A, n, in]``, tanh between layers; a shared trunk
feeds the actor and critic layers); the heads (log-probability, entropy, analytic KL) and
:class:`~klppo.core.loss.PPOLoss` of the policies that share a head and a loss setting (each its
own beta) as one ``[F, n]`` computation (``PPOLoss(rows=True)``: each row's numbers those of its own
call), a policy in no such family on its own; one backward of the policies' summed losses
(they share no parameter, so each row's gradient is its own loss's); one :class:`TorchAdam`
step. A row that steps alone is padded with a copy that has
no loss: torch's ``bmm`` backward rounds a batch of one otherwise than a batch of two or more, and
a policy's numbers must not depend on how many rows step beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from klppo.core.loss import PER_SAMPLE, PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.step import StepResult
from klppo.rl.config import PPOConfig
from klppo.rl.engine.rows import TERMS, Layout, Minibatch, RowSlot, loss_families, seat_row
from klppo.rl.optim import TorchAdam
from klppo.runs.device import resolve_device

__all__ = ["TorchStack", "TorchSlot"]


class TorchSlot(RowSlot):
    """Policy r's backend in a torch stack (see :class:`RowSlot`), its rollout on the stack's
    device."""

    fast = False

    def __init__(self, stack: TorchStack, row: int, agent: ActorCritic, loss: PPOLoss) -> None:
        self.stack, self.row, self.agent, self.loss = stack, row, agent, loss
        self.head, self.device = agent.head, stack.device


def _mlp(layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor,
         tanh_last: bool) -> torch.Tensor:
    """Stacked layers ``(W [A, out, in], b [A, out])`` over ``x [A, n, in]``, tanh between them
    (and after the last with ``tanh_last``: a shared trunk's features)."""
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        x = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
        if i < last or tanh_last:
            x = torch.tanh(x)
    return x


def _dev(x: np.ndarray, device: torch.device) -> torch.Tensor:
    x = np.ascontiguousarray(x)
    return torch.from_numpy(x if x.flags.writeable else x.copy()).to(device)


def _one_step_sequences(loss: PPOLoss, logp: torch.Tensor) -> torch.Tensor | None:
    """Each sample its own sequence, for a sequence-level objective that means something on
    one step (TOPR: ``one_step``); None for the token-level ones."""
    if loss.policy.level != "sequence":
        return None
    return torch.arange(logp.shape[0], device=logp.device)


def _losses(head: Any, loss: PPOLoss, beta: Any, params: torch.Tensor, values: torch.Tensor,
            f: dict[str, Any], rows: bool) -> tuple[Any, ...]:
    """A policy's head (log-probability, entropy, analytic KL) and :class:`PPOLoss` on its
    minibatch ``f``, or those of a family's rows as ``[F, n]`` (``rows``: ``PPOLoss(rows=True)``,
    each row's numbers those of its own call)."""
    needs_kl = loss.needs_analytic_kl
    logp = head.log_prob(params, f["actions"])
    with torch.set_grad_enabled(loss.ent_coef > 0):
        entropy = head.entropy(params)
    with torch.set_grad_enabled(needs_kl):
        kl = head.kl(f["params"], params)
    out = loss(logp, f["logp"], f["adv"], values, f["returns"], f["values"], entropy,
               kl if needs_kl else None, beta, diagnostics=False, per_sample=True,
               sequence_ids=None if rows else _one_step_sequences(loss, logp),
               sample_weight=f["weight"], rows=rows)
    return logp, entropy, kl, out


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu()


def _results(idx: np.ndarray, adv: torch.Tensor, norms: torch.Tensor,
             outs: list[tuple[Any, ...]]) -> list[StepResult]:
    """Each row's :class:`StepResult` from its ``(logp, values, entropy, kl, loss output)``:
    every quantity reaches the CPU once for all the rows that have it (one transfer, a device
    sync on a GPU, per quantity and step; not one per row), stacked per name so that no
    quantity changes its dtype."""
    A = len(outs)
    with torch.no_grad():
        logp, values, entropy, kl = (_cpu(torch.stack(q)) for q in zip(*(o[:4] for o in outs)))
    adv, norms = _cpu(adv), _cpu(norms)

    def by_name(keys: list[tuple[str, str]]) -> list[dict[str, torch.Tensor]]:
        rows: list[dict[str, torch.Tensor]] = [{} for _ in range(A)]
        for name, key in keys:
            have = [a for a in range(A) if key in outs[a][4]]
            if have:
                with torch.no_grad():
                    moved = _cpu(torch.stack([outs[a][4][key] for a in have]))
                for j, a in enumerate(have):
                    rows[a][name] = moved[j]
        return rows

    terms = by_name([(k, k) for k in TERMS])
    samples = by_name([(k, f"per_sample/{k}") for k in PER_SAMPLE])
    return [StepResult(torch.from_numpy(idx[a]), logp[a], values[a], entropy[a], kl[a], adv[a],
                       norms[a], terms[a], samples[a]) for a in range(A)]


class TorchStack:
    """R networks of one shape stacked row by row on one device (see the module docstring)."""

    fast = False
    #: the weights, Adam and the rows' layout: made when the first row joins
    W: torch.Tensor
    adam: TorchAdam
    layout: Layout

    def __init__(self, runs: int, device: str) -> None:
        self.R, self.device = runs, resolve_device(device)
        self.slots: list[TorchSlot | None] = [None] * runs

    def maker(self, row: int, ppo: PPOConfig) -> Callable[[ActorCritic, PPOLoss], TorchSlot]:
        """The ``make_step`` of the policy in row ``row`` (:class:`klppo.rl.unit.PolicyUnit`)."""
        return lambda agent, loss: self._join(row, agent, loss, ppo)

    def _join(self, row: int, agent: ActorCritic, loss: PPOLoss, ppo: PPOConfig) -> TorchSlot:
        params = list(agent.parameters())
        total = sum(p.numel() for p in params)
        if not hasattr(self, "W"):  # the first row to join
            self.W = torch.zeros(self.R, total, dtype=torch.float32, device=self.device)
            self.adam = TorchAdam(self.W)
        spans, at = {}, 0
        for p in params:  # the parameters become views of row `row`
            n = p.numel()
            self.W[row, at:at + n] = p.detach().reshape(-1).to(self.device)
            p.data = self.W[row, at:at + n].view(p.shape)
            spans[id(p)] = (at, at + n)
            at += n
        seat_row(self, row, Layout(agent, lambda p: spans[id(p)]), ppo)
        slot = self.slots[row] = TorchSlot(self, row, agent, loss)
        return slot

    # ------------------------------------------------------------------ forward
    def nets(self, W: torch.Tensor, obs: torch.Tensor, critic: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Distribution parameters ``[A, n, param_dim]`` (the actor's output, and the log-std of
        each row for a Gaussian head) and values ``[A, n]`` of the rows of ``W`` for ``obs``."""
        lay = self.layout
        actor_in = critic_in = obs
        if lay.trunk:
            actor_in = _mlp(lay.stacked(W, "trunk"), obs, tanh_last=True)
            critic_in = actor_in.detach() if lay.detach_trunk else actor_in
        out = _mlp(lay.stacked(W, "actor"), actor_in, tanh_last=False)
        if lay.log_std is not None:
            s, e = lay.log_std
            out = torch.cat([out, W[:, None, s:e].expand(-1, out.shape[1], -1)], -1)
        values = (_mlp(lay.stacked(W, "critic"), critic_in, tanh_last=False)[..., 0]
                  if critic else None)
        return out, values

    # ------------------------------------------------------------------ the step
    def step(self, rows: np.ndarray, mb: Minibatch, losses: list[PPOLoss], betas: list[float],
             ws: Any = None, log: Any = None) -> list[StepResult]:
        """One minibatch step of each policy in ``rows``; per policy its detached per-sample
        outputs and loss terms, on the CPU. ``ws`` is unused (the numpy stack's workspace);
        the torch stack keeps no step log (``log`` must be None)."""
        if log is not None:
            raise ValueError("the torch stack keeps no step log (the numpy stack's)")
        dev, slots = self.device, [self.slots[r] for r in rows]
        r_idx = torch.tensor(rows, device=dev)  # a copy: rows may be a read-only view
        f: dict[str, torch.Tensor | None] = {
            k: _dev(getattr(mb, k), dev)
            for k in ("obs", "actions", "params", "logp", "adv", "returns", "values")}
        f["weight"] = None if mb.weight is None else _dev(mb.weight, dev)
        obs, adv = cast(torch.Tensor, f["obs"]), cast(torch.Tensor, f["adv"])
        lone = len(rows) == 1  # padded with a copy that has no loss (see the module docstring)
        W = self.W[r_idx.repeat(2) if lone else r_idx].requires_grad_(True)  # the leaf: a copy
        params, values = self.nets(W, obs.repeat(2, 1, 1) if lone else obs)
        assert values is not None  # (the critic was computed)
        total, outs = W.new_zeros(()), cast(list[Any], [None] * len(rows))
        for fam in loss_families(losses):
            if len(fam) == 1:  # its own head and loss
                a = fam[0]
                logp, entropy, kl, out = _losses(
                    slots[a].head, losses[a], betas[a], params[a], values[a],
                    {k: None if x is None else x[a] for k, x in f.items()}, False)
                outs[a] = (logp, values[a], entropy, kl, out)
                total = total + out["loss"]
                continue
            sel: Any = (slice(fam[0], fam[-1] + 1) if fam == list(range(fam[0], fam[-1] + 1))
                        else torch.tensor(fam, device=dev))
            loss = losses[fam[0]]
            beta: Any = (torch.tensor([betas[a] for a in fam], dtype=torch.float64, device=dev)
                         if loss.policy.uses_beta else betas[fam[0]])
            logp, entropy, kl, out = _losses(
                slots[fam[0]].head, loss, beta, params[sel], values[sel],
                {k: None if x is None else x[sel] for k, x in f.items()}, True)
            for j, a in enumerate(fam):
                outs[a] = (logp[j], values[a], entropy[j], kl[j], {k: v[j] for k, v in out.items()})
            total = total + out["loss"].sum()
        (G,) = torch.autograd.grad(total, W)
        norms = self.adam.step(self.W, G[:len(rows)], r_idx)
        return _results(mb.idx, adv, norms, outs)

    def probe_k3(self, rows: np.ndarray, idx: np.ndarray, mb: Minibatch) -> list[float]:
        """Per row of ``rows``, the mean k3 KL(rollout || current policy) on its minibatch
        (sample indices ``idx``), before stepping on it: each row's own probe
        (:meth:`~klppo.rl.engine.rows.RowSlot.k3`)."""
        return [cast(Any, self.slots[r]).k3(torch.from_numpy(np.array(idx[a])))
                for a, r in enumerate(rows.tolist())]

    @torch.no_grad()
    def policy_kl(self, rows: np.ndarray, obs: np.ndarray, old_params: np.ndarray,
                  ws: Any = None) -> list[float]:
        """Per row of ``rows``, the mean analytic KL(rollout policy || current policy) over its
        rollout (nats per sample)."""
        params = self._actors(rows, _dev(obs, self.device))
        old = _dev(old_params, self.device)
        return [float(self.slots[r].head.kl(old[a], params[a]).mean()) for a, r in enumerate(rows)]

    def _actors(self, rows: np.ndarray, x: torch.Tensor) -> torch.Tensor:
        """The distribution parameters of ``rows`` at ``x [A, B, obs_dim]``, computed on a copy
        of their weights, a single row padded to two as in :meth:`step`: a row's numbers depend
        neither on its place in the stack nor on how many rows are computed beside it."""
        r_idx = torch.tensor(rows, device=self.device)
        if len(rows) == 1:
            params, _ = self.nets(self.W[r_idx.repeat(2)], x.repeat(2, 1, 1), critic=False)
            return params[:1]
        return self.nets(self.W[r_idx], x, critic=False)[0]

    @torch.no_grad()
    def log_prob(self, row: int, obs: np.ndarray, actions: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s distribution parameters ``[B, param_dim]`` and log-probabilities
        ``[B]`` of ``actions`` at ``obs [B, obs_dim]`` (numpy, on the CPU)."""
        dev = self.device
        params = self._actors(np.array([row]), _dev(obs, dev)[None])
        slot = self.slots[row]
        assert slot is not None  # (a row joined before its rollouts)
        logp = slot.head.log_prob(params[0], _dev(actions, dev))
        return _cpu(params[0]).numpy(), _cpu(logp).numpy()

    @torch.inference_mode()
    def act(self, obs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The distribution parameters ``[R, N, param_dim]`` and values ``[R, N]`` of every row
        for ``obs [R, N, obs_dim]``, on the stack's device, as each row's :class:`TorchRunner`
        computes them before sampling (:meth:`TorchRunner.sample` draws from them). One env per
        run (``N = 1``) is computed as two copies of its observation: a product with one row
        takes torch's matrix-vector kernel on the CPU, whose rounding depends on where the
        weights lie in memory (a run's stack row), the matrix kernel's does not."""
        x = _dev(obs, self.device)
        if x.shape[1] != 1:
            return self.nets(self.W, x)
        out, values = self.nets(self.W, x.repeat(1, 2, 1))
        return out[:, :1], None if values is None else values[:, :1]
