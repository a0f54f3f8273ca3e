"""Rollouts of a stack's single-agent runs in lock step, their per-run work as ``[R, ...]`` arrays.

Each run keeps its own :class:`~klppo.rl.rollout.Collector` (its vector env and seeds, buffer,
normalisers, episode bookkeeping, rollout runner and generator: what its checkpoint holds). A
:class:`StackedRollout` gathers their state into arrays with a leading row axis at the start of a
rollout and scatters it back at its end; the buffers are the rows of one stacked buffer (each
collector's buffer views its row). Per env step: one stacked actor and critic forward for every
row, one draw from each run's own generator, then the sampling, the buffer writes, the action
clip, the checks, the episode bookkeeping and the observation and reward normalisation as one
array operation each for all rows; only the env step itself stays one call per run (one call
for the runs of one EnvPool pool, and for CartPoles of equal physics). Every
operation is elementwise per row or reduces one row's own axis as the run's own objects do, so
each run gets the numbers of its own :meth:`Collector.collect`, bit for bit; a run alone is a
stack of one.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import torch

from klppo.nn._rowops import row_cumsum
from klppo.nn.numpy import NumpyRunner
from klppo.nn.numpy.heads import HALF_LOG_2PI, log_softmax
from klppo.rl.cartpole import CartPoleSameStep, physics_key, step_cartpoles_flat
from klppo.rl.engine.norm import StackedStats
from klppo.rl.engine.records import TorchRecords
from klppo.rl.engine.rows import Stack
from klppo.rl.envpool_backend import EnvPoolGroup, EnvPoolSlice
from klppo.rl.normalize import normalized, scaled
from klppo.rl.rollout import Collector, EpisodeStats, NonFiniteEnvError, RolloutBuffer
from klppo.rl.vecenv import SameStepVecEnv

__all__ = ["collect_rows", "StackedRollout"]


def collect_rows(stack: Stack, collectors: dict[int, Collector], iterations: dict[int, int],
                 work: dict[str, Any]) -> dict[int, EpisodeStats | BaseException]:
    """One rollout of each run (``collectors`` by stack row, each at its iteration); per run its
    episodes, or the error that stopped it (its env's). ``work`` keeps the stack's
    :class:`StackedRollout` between calls."""
    ro = work.get("rollout")
    if ro is None or not ro.serves(collectors):
        ro = work["rollout"] = StackedRollout(stack, collectors)
    return ro.collect(collectors, iterations)


def _pooled(live: dict[int, Collector]) -> dict[EnvPoolGroup, dict[int, int]]:
    """Per EnvPool pool, the rows whose envs are its slices (stepped by it in one call) and
    each one's slice index."""
    out: dict[EnvPoolGroup, dict[int, int]] = {}
    for r, c in live.items():
        if isinstance(c.env, EnvPoolSlice) and c.env.pooled:
            out.setdefault(c.env.group, {})[r] = c.env.k
    return out


def _cartpoles(live: dict[int, Collector]) -> list[list[int]]:
    """The rows whose CartPole envs step as one (:func:`~klppo.rl.cartpole.step_cartpoles_flat`):
    groups with equal physics (a group of one too: the array step skips the env's per-call
    action check, which costs more than its physics)."""
    out: dict[Any, list[int]] = {}
    for r, c in live.items():
        key = physics_key(c.env)
        if key is not None:
            out.setdefault(key, []).append(r)
    return list(out.values())


def _rng(c: Collector) -> np.random.Generator:
    """The numpy runner's generator (numpy stacks' rows act with a NumpyRunner)."""
    assert isinstance(c.runner, NumpyRunner)
    return c.runner.rng


def _rows(R: int, values: dict[int, Any], fill: Any, shape: tuple[int, ...] = ()) -> np.ndarray:
    """``[R, *shape]`` from per-row values (rows without one get ``fill``)."""
    out = np.full((R, *shape), fill, np.float64)
    for r, v in values.items():
        out[r] = v
    return out


class StackedRollout:
    """The stacked buffers and per-row settings of one stack's lock-step collectors (see the
    module docstring)."""

    def __init__(self, stack: Stack, collectors: dict[int, Collector]) -> None:
        first = next(iter(collectors.values()))
        self.stack, self.ids = stack, {r: id(c) for r, c in collectors.items()}
        R, self.T, self.N, d = stack.R, first.T, first.N, first.obs_dim
        self.B = {k: np.zeros((R, *a.shape), a.dtype) for k, a in first.np.items()}
        #: the stack's rollout: every run's buffer is a row of it (its GAE and its update read
        #: it whole: :func:`~.advantages.group_gae`, :class:`~.learn.Rollouts`)
        self.buf = RolloutBuffer.of(self.B)
        for r, c in collectors.items():
            c.use_buffers({k: b[r] for k, b in self.B.items()}, (self.buf, r))
        self.box = first.box
        if self.box:
            self.low = _rows(R, {r: c.act_low for r, c in collectors.items()}, -np.inf,
                             first.act_low.shape).astype(np.float32)[:, None]
            self.high = _rows(R, {r: c.act_high for r, c in collectors.items()}, np.inf,
                              first.act_high.shape).astype(np.float32)[:, None]
        obs, rew = ({r: getattr(c, k) for r, c in collectors.items() if getattr(c, k)}
                    for k in ("obs_norm", "reward_scaler"))
        self.norm_obs = np.array([r in obs for r in range(R)])[:, None, None]
        self.norm_rew = np.array([r in rew for r in range(R)])[:, None]
        self.all_obs, self.all_rew = bool(self.norm_obs.all()), bool(self.norm_rew.all())
        self.any_obs, self.any_rew = bool(self.norm_obs.any()), bool(self.norm_rew.any())
        self.clip_obs = _rows(R, {r: n.clip for r, n in obs.items()}, np.inf)[:, None, None]
        self.clip_rew = _rows(R, {r: s.clip for r, s in rew.items()}, np.inf)[:, None]
        self.gamma = _rows(R, {r: s.gamma for r, s in rew.items()}, 0.0)[:, None]
        self.obs_stats, self.rew_stats = StackedStats(R, (d,)), StackedStats(R, ())
        #: a stack of one normalises with its run's own objects (what the stacked statistics
        #: compute for each row, without their broadcasting overhead)
        self.one = first if R == 1 else None
        self.X = np.zeros((R, self.N, d), np.float32)
        self.raw = np.zeros((R, self.N, d), np.float64)
        self.rew = np.zeros((R, self.N), np.float64)
        self.term, self.trunc = (np.zeros((R, self.N), np.bool_) for _ in range(2))
        self.ep_return, self.ret = np.zeros((R, self.N)), np.zeros((R, self.N))
        self.ep_length = np.zeros((R, self.N), np.int64)
        self.into = {r: isinstance(c.env, SameStepVecEnv) and
                     len(c.env.single_observation_space.shape) == 1
                     for r, c in collectors.items()}
        self.draw = np.zeros((R, self.N, *(first.np["actions"].shape[2:] or (1,))), np.float32)
        self.samples = np.arange(R * self.N)  # (each sample's row in the flattened logits)
        #: per live row of a rollout: its generator's draw and the part of ``draw`` it fills
        self.draws: list[tuple[Any, np.ndarray]] = []
        #: a torch stack's records of each step on its device (None for a numpy stack)
        self.records = (None if stack.fast else
                        TorchRecords(self.B, cast(Any, stack).device))

    def serves(self, collectors: dict[int, Collector]) -> bool:
        """Whether these are (some of) the collectors it was built for."""
        return all(self.ids.get(r) == id(c) for r, c in collectors.items())

    # ------------------------------------------------------------------ a rollout
    def collect(self, collectors: dict[int, Collector], iterations: dict[int, int]
                ) -> dict[int, EpisodeStats | BaseException]:
        live = dict(collectors)
        self._gather(live)
        self.draws = []
        self.pooled, self.cartpoles = _pooled(live), _cartpoles(live)
        out: dict[int, EpisodeStats | BaseException] = {}
        for t in range(self.T):
            out_t, values = self.stack.act(self.X)
            env_actions = self._act(t, out_t, values, live)
            self._step(t, env_actions, live, iterations, out)
        self._finish(live, out)
        return out

    def _gather(self, live: dict[int, Collector]) -> None:
        for r, c in live.items():
            c.begin()
            self.X[r], self.ep_return[r], self.ep_length[r] = c.next_obs, c.ep_return, c.ep_length
            if c.reward_scaler is not None:
                self.ret[r] = c.reward_scaler.ret
        if self.one is not None:
            return
        self.obs_stats.gather({r: c.obs_norm.rms for r, c in live.items() if c.obs_norm})
        self.rew_stats.gather({r: c.reward_scaler.rms for r, c in live.items()
                               if c.reward_scaler})

    def _act(self, t: int, out: Any, values: Any, live: dict[int, Collector]) -> np.ndarray:
        """Sample every row's actions from its own generator; write obs, actions, log-probs,
        distribution parameters and values at step ``t``; the env's (clipped) actions."""
        B = self.B
        B["obs"][:, t] = self.X
        if not self.stack.fast:
            self._sample_torch(t, out, values, live)
            action = B["actions"][:, t]
        else:
            action = self._sample_numpy(t, out, live)
            B["values"][:, t] = values
        if self.box:
            return np.minimum(np.maximum(action, self.low), self.high)
        return action

    def _sample_torch(self, t: int, out: Any, values: Any, live: dict[int, Collector]) -> None:
        """Torch rows: each run's :class:`~klppo.nn.runners.TorchRunner` draws on the device
        (:meth:`~klppo.nn.runners.TorchRunner.draw`, its own generator); every row's actions
        reach the CPU together (the envs need them: one transfer per step), their log-probs,
        distribution parameters and values stay in the device records until the rollout ends
        (:class:`~klppo.rl.engine.records.TorchRecords`)."""
        rows = list(live)
        drawn = [cast(Any, c.runner).draw(out[r]) for r, c in live.items()]
        at: Any
        if len(rows) == self.stack.R:  # every row: the stack's own tensors
            at, out_rows, value_rows = slice(None), out, values
        else:
            at, out_rows, value_rows = rows, out[rows], values[rows]
        self.B["actions"][at, t] = torch.stack([a for a, _ in drawn]).cpu().numpy()
        assert self.records is not None  # (a torch stack's)
        self.records.write(at, t, torch.stack([lp for _, lp in drawn]), out_rows, value_rows)

    def _sample_numpy(self, t: int, out: np.ndarray, live: dict[int, Collector]) -> np.ndarray:
        """:meth:`klppo.nn.numpy.heads.Gaussian.act` / ``Categorical.act`` for every row at
        once, from one draw of each run's own generator."""
        B, draw = self.B, self.draw
        if len(self.draws) != len(live):  # (live rows only leave during a rollout)
            self.draws = [((_rng(c).standard_normal if self.box else _rng(c).random),
                           draw[r] if self.box else draw[r, :, 0]) for r, c in live.items()]
        for sample, into in self.draws:  # each run's own generator
            sample(dtype=np.float32, out=into)
        if self.box:
            assert self.stack.layout.log_std is not None  # a Box head's layout has its span
            s, e = self.stack.layout.log_std
            log_std = self.stack.W[:, None, s:e]
            d = out.shape[-1]
            action = B["actions"][:, t]
            np.add(out, np.exp(log_std) * draw, out=action)
            B["params"][:, t, :, :d], B["params"][:, t, :, d:] = out, log_std
            B["logp"][:, t] = (-0.5 * draw * draw - log_std - HALF_LOG_2PI).sum(-1)
            return action
        R, N, k = out.shape
        logits = out.reshape(R * N, k)
        logp_all = log_softmax(logits)[0]
        cdf = row_cumsum(np.exp(logp_all))
        below = draw.reshape(R * N, 1) * cdf[:, -1:] >= cdf
        action = np.zeros(R * N, np.int64)
        for j in range(k - 1):  # the count of edges passed (cdf is monotone)
            action += below[:, j]
        B["actions"][:, t] = action.reshape(R, N)
        B["logp"][:, t] = logp_all[self.samples, action].reshape(R, N)
        B["params"][:, t] = out
        return B["actions"][:, t]

    def _step(self, t: int, env_actions: np.ndarray, live: dict[int, Collector],
              iterations: dict[int, int], out: dict[int, Any]) -> None:
        """Step every run's env, then check, count, normalise and store for all rows."""
        infos: dict[int, Any] = {}
        for pool, rows in self.pooled.items():  # one EnvPool call for the rows of one pool
            rows = {r: k for r, k in rows.items() if r in live}
            try:
                res = pool.step({k: env_actions[r] for r, k in rows.items()})
            except Exception as e:  # noqa: BLE001 - the pool failed: its runs stop
                for r in rows:
                    out[r] = e
                    del live[r]
                continue
            for r, k in rows.items():
                obs, rew, term, trunc, info = res[k]
                self._store(r, obs, rew, term, trunc, info, infos)
        self._step_cartpoles(env_actions, live, infos)
        for r, c in list(live.items()):
            if r in infos:
                continue
            try:
                if self.into[r]:  # klppo's own vector env writes into the stacked arrays
                    assert isinstance(c.env, SameStepVecEnv)
                    infos[r] = c.env.step_into(env_actions[r], self.raw[r], self.rew[r],
                                               self.term[r], self.trunc[r])
                    continue
                obs, rew, term, trunc, info = c.env.step(env_actions[r])
                self._store(r, obs, rew, term, trunc, info, infos)
            except Exception as e:  # noqa: BLE001 - this run's env failed: it alone stops
                out[r] = e
                del live[r]
        self._check(t, live, iterations, out)
        done = self.term | self.trunc
        self.ep_return += self.rew
        self.ep_length += 1
        if done.any():
            self._episodes_end(t, done, live, infos, iterations, out)
        B = self.B
        B["rewards"][:, t] = self._scaled_rewards(done)
        B["terminated"][:, t] = self.term
        B["truncated"][:, t] = self.trunc & ~self.term
        if self.any_obs:
            self.X[...] = self._prep_obs()
        else:  # (the float32 cast of _prep_obs, without its copy)
            self.X[...] = self.raw

    def _step_cartpoles(self, env_actions: np.ndarray, live: dict[int, Collector],
                        infos: dict[int, Any]) -> None:
        """One array step for the CartPoles of several runs (:func:`step_cartpoles_flat`),
        written into the stacked arrays; a group it refuses steps env by env after it (where a
        run's error ends that run alone)."""
        for group in self.cartpoles:
            rows = [r for r in group if r in live]
            if not rows:
                continue
            envs = [cast(CartPoleSameStep, live[r].env) for r in rows]
            at: Any = rows  # the rows in the stacked arrays (a slice when side by side)
            if rows == list(range(rows[0], rows[0] + len(rows))):
                at = slice(rows[0], rows[0] + len(rows))
            try:
                obs, rew, term, trunc, info = step_cartpoles_flat(envs, env_actions[at].ravel())
            except Exception:  # noqa: BLE001 - each steps alone (and fails alone)
                continue
            K, N = len(rows), self.N
            self.raw[at], self.rew[at] = obs.reshape(K, N, -1), rew.reshape(K, N)
            self.term[at], self.trunc[at] = term.reshape(K, N), trunc.reshape(K, N)
            infos.update(zip(rows, info))

    def _store(self, r: int, obs: Any, rew: Any, term: Any, trunc: Any, info: Any,
               infos: dict[int, Any]) -> None:
        """Row ``r``'s step: its observations, rewards and ends into the stacked arrays."""
        self.raw[r] = np.asarray(obs).reshape(self.N, -1)
        self.rew[r], self.term[r], self.trunc[r] = rew, term, trunc
        infos[r] = info

    def _check(self, t: int, live: dict[int, Collector], iterations: dict[int, int],
               out: dict[int, Any]) -> None:
        """:meth:`Collector._check` for every row: one sum is finite when every term is."""
        if math.isfinite(np.add.reduce(self.raw, axis=None)) and \
                math.isfinite(np.add.reduce(self.rew, axis=None)):
            return
        for r, c in list(live.items()):
            try:
                c._check(self.raw[r], self.rew[r], iterations[r], t)
            except NonFiniteEnvError as e:
                out[r] = e
                del live[r]
        self.raw[~np.isfinite(self.raw)] = 0.0  # rows that stopped: no warnings from them
        self.rew[~np.isfinite(self.rew)] = 0.0

    def _episodes_end(self, t: int, done: np.ndarray, live: dict[int, Collector],
                      infos: dict[int, Any], iterations: dict[int, int],
                      out: dict[int, Any]) -> None:
        """The episodes that ended at step ``t``: their returns and lengths, and the final
        observation of each truncated one (for its bootstrap)."""
        for r, c in list(live.items()):
            for i in np.flatnonzero(done[r]):
                c.stats.returns.append(float(self.ep_return[r, i]))
                c.stats.lengths.append(int(self.ep_length[r, i]))
                if self.trunc[r, i] and not self.term[r, i]:
                    final = np.asarray(infos[r]["final_obs"][i], dtype=np.float32).reshape(-1)
                    try:
                        c._check(final, self.rew[r], iterations[r], t)
                    except NonFiniteEnvError as e:
                        out[r] = e
                        del live[r]
                        break
                    c.trunc_final.append((t, int(i), final))
        self.ep_return[done] = 0.0
        self.ep_length[done] = 0

    def _scaled_rewards(self, done: np.ndarray) -> np.ndarray:
        """:class:`~klppo.rl.envs.RewardScaler` of every row that has one (raw rewards for the
        others)."""
        if not self.any_rew:
            return self.rew
        if self.one is not None:
            assert self.one.reward_scaler is not None
            return self.one.reward_scaler(self.rew[0], done[0])[None]
        self.ret = self.ret * self.gamma + self.rew
        self.rew_stats.update(self.ret)
        out = scaled(self.rew, self.rew_stats.var[:, None], self.clip_rew)
        self.ret[done] = 0.0
        return out if self.all_rew else np.where(self.norm_rew, out, self.rew)

    def _prep_obs(self) -> np.ndarray:
        """The observations the policy sees next: float32, normalised (with an update of the
        statistics) in the rows that normalise."""
        obs = self.raw.astype(np.float32)
        if not self.any_obs:
            return obs
        if self.one is not None:
            assert self.one.obs_norm is not None
            return self.one.obs_norm(obs[0], True)[None]
        self.obs_stats.update(obs)
        s = self.obs_stats
        norm = normalized(obs, s.mean[:, None], s.var[:, None], self.clip_obs)
        return norm if self.all_obs else np.where(self.norm_obs, norm, obs)

    def _finish(self, live: dict[int, Collector], out: dict[int, Any]) -> None:
        """Scatter the state back, then bootstrap: V(s_{t+1}) inside the rollout, V(next obs)
        after it (one stacked critic forward), V(final observation) where an episode was
        truncated (each run's runner, on its normalised final observations)."""
        if self.one is None:
            self.obs_stats.scatter({r: c.obs_norm.rms for r, c in live.items() if c.obs_norm})
            self.rew_stats.scatter({r: c.reward_scaler.rms for r, c in live.items()
                                    if c.reward_scaler})
        if self.records is not None:
            self.records.to_cpu()
        _, v_last = self.stack.act(self.X)
        v_last = np.asarray(v_last.cpu() if hasattr(v_last, "cpu") else v_last)
        nv = self.B["next_values"]
        nv[:, :-1] = self.B["values"][:, 1:]
        nv[:, -1] = v_last
        for r, c in live.items():
            c.next_obs = self.X[r].copy()
            c.ep_return, c.ep_length = self.ep_return[r].copy(), self.ep_length[r].copy()
            if c.reward_scaler is not None and self.one is None:
                c.reward_scaler.ret = self.ret[r].copy()
            try:
                c.bootstrap_truncated()
                out[r] = c.stats
            except Exception as e:  # noqa: BLE001 - its env's final observation (bootstrap)
                out[r] = e
