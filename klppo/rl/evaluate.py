"""``klppo eval``: run a trained policy for N episodes, optionally recording videos.

Episodes use their own seeds (``seed + k`` for episode ``k``), the run's observation
normalisation frozen at its checkpointed statistics, and deterministic actions (the mode) unless
asked to sample. The result is written to ``RUN_DIR/eval.json`` (the next free
``RUN_DIR/eval-N.json`` when that exists: an evaluation never overwrites another silently), or to
``out``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from klppo.rl.envs import make_env
from klppo.rl.policy import Policy, load, run_dir_of
from klppo.runs.errors import InputError
from klppo.runs.install import install_hint
from klppo.runs.owned import owned_reason
from klppo.runs.paths import check_writable
from klppo.runs.rundir import write_json_atomic
from klppo.runs.threads import compute_threads

__all__ = ["EvalResult", "RenderingUnavailable", "evaluate", "eval_path", "read_eval",
           "episodes_text", "run_episodes", "EVAL_FILE", "EVAL_SEED"]

#: the first episode's seed of an evaluation (klppo eval's default, and every evaluation during
#: training): far from any training seed
EVAL_SEED = 1_000_000

EVAL_FILE = "eval.json"


class RenderingUnavailable(RuntimeError):
    """Videos cannot be recorded here; the message says what is missing."""


@dataclass
class EvalResult:
    episodes: int
    deterministic: bool
    seed: int
    returns: list[float]
    lengths: list[int]
    mean: float
    std: float
    videos: list[str]
    path: str = ""
    """where the result was written (not part of the file)"""

    def to_json(self) -> dict:
        """The file's contents."""
        return {k: v for k, v in asdict(self).items() if k != "path"}


def _make_env(policy: Policy, video_dir: Path | None) -> gym.Env:
    cfg = policy.config
    env_id = cfg.env
    if video_dir is None:
        return make_env(env_id, cfg.env_kwargs)
    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise RenderingUnavailable(f"--video needs moviepy: {install_hint('video')}") from None
    try:
        env = make_env(env_id, cfg.env_kwargs, render_mode="rgb_array")
        env.reset(seed=0)
        frame = env.render()
    except Exception as e:  # noqa: BLE001 - any renderer can fail its own way (no GL, no display)
        raise RenderingUnavailable(f"{env_id} cannot render here ({type(e).__name__}: {e}); "
                                   f"for MuJoCo try MUJOCO_GL=egl or MUJOCO_GL=osmesa") from None
    if frame is None:
        raise RenderingUnavailable(f"{env_id} renders no rgb_array frames")
    return gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda k: True,
                                    name_prefix="eval", disable_logger=True)


def run_episodes(env: gym.Env, policy: Policy, episodes: int, seed: int,
                 deterministic: bool = True,
                 gen: torch.Generator | None = None) -> tuple[list[float], list[int]]:
    """The returns and lengths of ``episodes`` episodes of ``policy`` on ``env``, episode ``k``
    reset with ``seed + k``: the one definition of an evaluation (``klppo eval`` and the
    evaluations during training, ``eval_every``)."""
    gen = gen if gen is not None else torch.Generator().manual_seed(seed)
    runs = [_episode(env, policy, seed + k, deterministic, gen) for k in range(episodes)]
    return [r for r, _ in runs], [n for _, n in runs]


def _episode(env: gym.Env, policy: Policy, seed: int, deterministic: bool,
             gen: torch.Generator) -> tuple[float, int]:
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        action = policy.act(obs[None], deterministic, gen)[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        total, steps = total + float(reward), steps + 1
        done = terminated or truncated
    return total, steps


def eval_path(run_dir: str | Path, out: str | Path | None = None, force: bool = False) -> Path:
    """Where the result goes, checked before any episode runs; an existing file is never
    overwritten silently:

    * ``out`` given: that file; one that exists is refused unless ``force``;
    * else ``RUN_DIR/eval.json``, or when that exists the first free ``RUN_DIR/eval-N.json``
      (N = 2, 3, ...): every evaluation is kept; ``force`` overwrites ``eval.json`` instead.

    :class:`~klppo.runs.errors.InputError` naming the path when it exists (``out`` without
    ``force``), is a directory, or its folder is missing or not writable (a read-only run
    directory: write elsewhere with ``out``); and, whatever ``force`` says, when it is a file
    that a run or sweep owns (its checkpoint, metrics, config, ...; see
    :func:`klppo.runs.owned.owned_reason`): ``force`` replaces only an earlier evaluation."""
    if out is not None:
        path, what = Path(out), "out"
    else:
        path, what = _free_name(Path(run_dir), force), "eval.json"
    reason = owned_reason(path, what=what)
    if reason is not None:
        raise InputError(reason)
    if path.is_dir():
        raise InputError(f"{what}={str(path)!r}: is a directory")
    if out is not None and path.exists() and not force:
        raise InputError(f"out={str(path)!r}: exists; --force overwrites it (or name another "
                         f"file)")
    if not path.parent.is_dir():
        raise InputError(f"{what}={str(path)!r}: {str(path.parent)!r} is not a directory")
    try:
        check_writable(path.parent, what)
    except OSError as e:
        hint = "" if out is not None else "; write it elsewhere with --out FILE"
        raise InputError(f"{what}={str(path)!r}: {str(e).partition(': ')[2]}{hint}") from None
    return path


def _free_name(run_dir: Path, force: bool) -> Path:
    """``eval.json`` (always, with ``force``), else the first of eval-2.json, eval-3.json, ...
    that does not exist yet."""
    first = run_dir / EVAL_FILE
    if force or not (first.exists() or first.is_symlink()):
        return first
    n = 2
    while (run_dir / f"eval-{n}.json").exists() or (run_dir / f"eval-{n}.json").is_symlink():
        n += 1
    return run_dir / f"eval-{n}.json"


def episodes_text(n: int) -> str:
    """``1 episode``, ``2 episodes``."""
    return f"{n:,} episode" + ("" if n == 1 else "s")


@compute_threads(torch_threads=1)  # one small network per step: more threads only contend
def evaluate(run_dir: str | Path, episodes: int = 10, deterministic: bool = True,
             seed: int = EVAL_SEED, video_dir: str | Path | None = None,
             out: str | Path | None = None, force: bool = False,
             write: bool = True) -> EvalResult:
    """Run ``episodes`` episodes of the run's policy and write the result (``out``, else
    ``RUN_DIR/eval.json`` or the next free ``eval-N.json``; see :func:`eval_path`); the
    result's ``path`` says where (``write`` False: no file, ``path`` empty). Deterministic
    actions (the mode) by default, as Stable-Baselines3's ``evaluate_policy``; the training
    return is measured with sampled actions, so compare it with ``deterministic=False``."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes={episodes!r}: must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    policy = load(run_dir)
    run_dir = run_dir_of(run_dir)
    path = eval_path(run_dir, out, force) if write else None
    if video_dir is not None:
        reason = owned_reason(video_dir, ("eval-episode-*.mp4",), "--video")
        if reason is not None:
            raise InputError(reason)
        try:
            check_writable(video_dir, "--video")
        except OSError as e:
            raise ValueError(str(e)) from None
    vdir = None if video_dir is None else Path(video_dir)
    env = _make_env(policy, vdir)
    try:
        returns, lengths = run_episodes(env, policy, episodes, seed, deterministic)
    finally:
        env.close()
    videos = sorted(str(p) for p in vdir.glob("*.mp4")) if vdir is not None else []
    result = EvalResult(episodes, deterministic, seed, returns, lengths,
                        float(np.mean(returns)), float(np.std(returns)), videos,
                        str(path or ""))
    if path is not None:
        write_json_atomic(path, result.to_json())
    return result


def read_eval(path: str | Path) -> EvalResult:
    """An evaluation written by :func:`evaluate` (a run directory: its ``eval.json``)."""
    p = Path(path)
    p = p / EVAL_FILE if p.is_dir() else p
    return EvalResult(**json.loads(p.read_text()), path=str(p))
