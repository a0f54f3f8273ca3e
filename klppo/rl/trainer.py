"""``train(config) -> TrainResult``: the PPO loop in visible phases.

collect -> advantages -> update -> controller -> log -> checkpoint, once per iteration. The same
entry point serves the CLI, tests, notebooks and sweeps; ``resume(run_dir)`` continues a run from
its last checkpoint and reproduces the metrics of an uninterrupted run exactly.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.core.advantages import gae
from klppo.core.controllers import make_controller
from klppo.core.values import explained_variance
from klppo.nn.actor_critic import ActorCritic, make_head
from klppo.nn.fastpath import flatten_parameters, supports_fast_path
from klppo.protocol import final_return
from klppo.rl import checkpoint as ckpt
from klppo.rl.config import TrainConfig, from_dict, to_dict, validate
from klppo.rl.envs import ObsNormalizer, RewardScaler, check_env, make_vector_env
from klppo.rl.rollout import Collector, NonFiniteEnvError
from klppo.rl.update import Batch, Learner
from klppo.runs import metrics as M
from klppo.runs import rundir as R

log = logging.getLogger(__name__)

__all__ = ["TrainResult", "TrainingError", "train", "resume", "final_return", "TIMING_KEYS"]

#: metrics that measure wall time; everything else is deterministic for a given seed.
TIMING_KEYS = frozenset({"sps", "time_collect", "time_update", "time_elapsed"})


class TrainingError(RuntimeError):
    """A run stopped on an error; its last good checkpoint is kept."""


@dataclass
class TrainResult:
    run_dir: Path
    metrics: list[dict[str, Any]]
    status: str

    @property
    def final_return(self) -> float:
        """KLip-PPO protocol: mean training-episode return over the last 10% of steps."""
        return final_return(self.metrics)


class _Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        self.cfg = validate(cfg)
        self.run_dir = run_dir
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.env = make_vector_env(cfg.env, cfg.rollout.num_envs, cfg.seed,
                                   cfg.rollout.vectorization)
        head = make_head(self.env.single_action_space)
        obs_dim = int(np.prod(self.env.single_observation_space.shape))
        n = cfg.net
        self.agent = ActorCritic(obs_dim, head, n.hidden, n.shared_trunk, n.separate_losses,
                                 n.log_std_init)
        self.flat = None
        if cfg.fast_path and supports_fast_path(self.agent):
            self.flat = flatten_parameters(self.agent)  # before anything takes views of it
        self.controller = make_controller(cfg.kl.controller, **cfg.kl.controller_options())
        self.uses_beta = cfg.objective in ("kl_penalty", "clip_kl")
        r = cfg.rollout
        self.obs_norm = ObsNormalizer((obs_dim,), r.clip_obs) if r.norm_obs else None
        self.rew_scale = (RewardScaler(r.num_envs, cfg.ppo.gamma, r.clip_reward)
                          if r.norm_reward else None)
        self.collector = Collector(self.env, self.agent, r.num_steps, cfg.seed + 1,
                                   self.obs_norm, self.rew_scale)
        self.learner = Learner(cfg, self.agent, self.controller,
                               torch.Generator().manual_seed(cfg.seed + 2), self.flat)
        self.iteration = 0
        self.global_step = 0
        self.stop_requested = False

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "global_step": self.global_step,
            "agent": self.agent.state_dict(),
            "optimizer": self.learner.optimizer.state_dict(),
            "controller": self.controller.state_dict(),
            "collector": self.collector.state_dict(),
            "shuffle_generator": self.learner.gen.get_state(),
            "obs_norm": None if self.obs_norm is None else self.obs_norm.rms.state_dict(),
            "reward_scaler": None if self.rew_scale is None else self.rew_scale.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "env": ckpt.pickle_env(self.env),
        }

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.iteration, self.global_step = int(s["iteration"]), int(s["global_step"])
        self.agent.load_state_dict(s["agent"])
        self.learner.optimizer.load_state_dict(s["optimizer"])
        self.controller.load_state_dict(s["controller"])
        self.collector.load_state_dict(s["collector"])
        self.learner.gen.set_state(s["shuffle_generator"])
        if self.obs_norm is not None:
            self.obs_norm.rms.load_state_dict(s["obs_norm"])
        if self.rew_scale is not None:
            self.rew_scale.load_state_dict(s["reward_scaler"])
        torch.set_rng_state(s["torch_rng"])
        if s.get("env") is not None:
            self.env.close()
            self.env = ckpt.unpickle_env(s["env"])
            self.collector.env = self.env
        else:
            self.collector.reset(self.cfg.seed + self.iteration)

    # ---------------------------------------------------------------- phases
    def advantages(self) -> Batch:
        b, p = self.collector.buf, self.cfg.ppo
        adv, ret = gae(b.rewards, b.values, b.next_values, b.terminated, b.truncated,
                       p.gamma, p.gae_lambda)
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
        return Batch(flat(b.obs), flat(b.actions), flat(b.logp), flat(b.params), flat(b.values),
                     flat(adv), flat(ret))

    def iterate(self) -> dict[str, Any]:
        cfg = self.cfg
        it = self.iteration + 1
        lr = cfg.ppo.lr * (1.0 - (it - 1) / cfg.num_iterations) if cfg.ppo.anneal_lr \
            else cfg.ppo.lr
        self.learner.set_lr(lr)
        t0 = time.perf_counter()
        episodes = self.collector.collect(it)                                   # 1. collect
        self.global_step += cfg.batch_size
        t1 = time.perf_counter()
        batch = self.advantages()                                              # 2. advantages
        result = self.learner.update(batch)                                    # 3. update
        kl_rollout = self.learner.rollout_kl(batch)
        ctrl_updates = result.controller_updates
        if self.uses_beta and cfg.kl.cadence == "iteration":                   # 4. controller
            d = kl_rollout if cfg.kl.measure == "rollout" else self.learner.measured_kl(batch)
            self.controller.update(d, n_steps=cfg.batch_size)
            ctrl_updates = [self.controller.info.as_dict()]
        t2 = time.perf_counter()
        self.iteration = it
        m: dict[str, Any] = {                                                  # 5. log
            "iteration": it,
            "global_step": self.global_step,
            "episode_return_mean": float(np.mean(episodes.returns)) if episodes.returns
            else None,
            "episode_length_mean": float(np.mean(episodes.lengths)) if episodes.lengths
            else None,
            "episode_count": len(episodes.returns),
            "lr": lr,
            "beta": self.controller.value if self.uses_beta else 0.0,
            "kl_rollout": kl_rollout,
            **result.metrics,
            "explained_variance": float(explained_variance(batch.values, batch.returns)),
            "controller_updates": len(ctrl_updates),
        }
        if ctrl_updates:
            last = ctrl_updates[-1]
            m.update(kl_target=last["target"], kl_observed=last["observed"],
                     kl_relative_error=last["relative_error"],
                     kl_error_clipped=float(last["error_clipped"]),
                     beta_before=last["beta_before"], beta_after=last["beta_after"])
        m.update(time_collect=t1 - t0, time_update=t2 - t1)
        return m


def _sinks(cfg: TrainConfig, run_dir: Path) -> list[M.Sink]:
    sinks: list[M.Sink] = [M.JsonlSink(run_dir / "metrics.jsonl")]
    if cfg.tensorboard:
        try:
            sinks.append(M.TensorBoardSink(run_dir))
        except ImportError:
            pass
    if cfg.track == "wandb":
        sinks.append(M.WandbSink(run_dir, run_dir.name, to_dict(cfg), project="klppo"))
    return sinks


class _SigintGuard:
    """First Ctrl-C asks the loop to checkpoint and stop after the current iteration; a second
    one interrupts at once. Installed only in the main thread, restored on exit."""

    def __init__(self, trainer: _Trainer) -> None:
        self.trainer = trainer
        self.previous = None

    def __enter__(self) -> _SigintGuard:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.trainer.stop_requested:
            raise KeyboardInterrupt
        self.trainer.stop_requested = True
        log.warning("interrupt: finishing this iteration, then checkpointing and stopping")

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _run(tr: _Trainer, on_iteration: Callable[[dict[str, Any]], None] | None) -> TrainResult:
    cfg, run_dir = tr.cfg, tr.run_dir
    writer = M.MetricsWriter(_sinks(cfg, run_dir))
    start, start_step = time.perf_counter(), tr.global_step
    status = "finished"
    R.write_status(run_dir, "running", iteration=tr.iteration)
    try:
        with _SigintGuard(tr):
            while tr.iteration < cfg.num_iterations:
                try:
                    m = tr.iterate()
                except NonFiniteEnvError as e:
                    msg = f"{e}; the last good checkpoint (iteration {_ckpt_iter(run_dir)}) is kept"
                    R.write_status(run_dir, "failed", error=msg, iteration=tr.iteration)
                    raise TrainingError(msg) from None
                elapsed = time.perf_counter() - start
                m["time_elapsed"] = elapsed
                m["sps"] = (tr.global_step - start_step) / max(elapsed, 1e-9)
                writer.write(m)
                log.info("iteration %d/%d step %d return %s kl %.4g", tr.iteration,
                         cfg.num_iterations, tr.global_step, m["episode_return_mean"],
                         m["kl_rollout"])
                if on_iteration is not None:
                    on_iteration(m)
                last = tr.iteration == cfg.num_iterations
                if last or tr.iteration % cfg.checkpoint_every == 0 or tr.stop_requested:
                    ckpt.save_checkpoint(run_dir, tr.state_dict())
                if tr.stop_requested and not last:
                    status = "interrupted"
                    break
    except TrainingError:
        raise
    except BaseException as e:
        R.write_status(run_dir, "failed" if not isinstance(e, KeyboardInterrupt)
                       else "interrupted", error=repr(e), traceback=traceback.format_exc(),
                       iteration=tr.iteration)
        raise
    finally:
        writer.close()
        tr.env.close()
    R.write_status(run_dir, status, iteration=tr.iteration)
    records, _ = M.read_metrics(run_dir / "metrics.jsonl")
    return TrainResult(run_dir, records, status)


def _ckpt_iter(run_dir: Path) -> int:
    try:
        return int(ckpt.load_checkpoint(run_dir)["iteration"])
    except FileNotFoundError:
        return 0


def train(config: TrainConfig,
          on_iteration: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Train from scratch into a new run directory (``config.out`` or a default name)."""
    validate(config)
    check_env(config.env)  # an unknown env or a missing extra fails before any directory exists
    if config.track == "wandb":
        M.require_wandb()
    out = config.out or str(Path(config.runs_root) /
                            R.default_run_name(config.env, config.objective, config.seed))
    run_dir = R.create_run_dir(out)
    R.write_yaml(run_dir / "config.yaml", to_dict(config))
    R.write_metadata(run_dir, {"kind": "train"})
    tr = _Trainer(config, run_dir)
    tr.collector.reset(config.seed)
    return _run(tr, on_iteration)


def resume(run_dir: str | Path,
           on_iteration: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Continue a run from its last checkpoint (or start it, if it never wrote one).

    Metrics written after the checkpoint are discarded and recomputed, so the finished
    metrics.jsonl equals that of an uninterrupted run (timing fields aside).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"resume={str(run_dir)!r}: not a klppo run directory "
                                f"(no config.yaml)")
    try:
        cfg = from_dict(R.read_yaml(run_dir / "config.yaml"))
        tr = _Trainer(cfg, run_dir)
    except Exception as e:
        R.write_status(run_dir, "failed", error=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc(), iteration=0)
        raise
    if not (run_dir / "metadata.json").exists():
        R.write_metadata(run_dir, {"kind": "train"})
    if (run_dir / ckpt.CHECKPOINT).exists():
        tr.load_state_dict(ckpt.load_checkpoint(run_dir))
    else:
        tr.collector.reset(cfg.seed)
    M.truncate_metrics(run_dir / "metrics.jsonl", tr.iteration)
    if tr.iteration >= cfg.num_iterations:
        records, _ = M.read_metrics(run_dir / "metrics.jsonl")
        tr.env.close()
        return TrainResult(run_dir, records, "finished")
    return _run(tr, on_iteration)
