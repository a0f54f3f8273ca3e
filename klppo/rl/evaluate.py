"""``klppo eval``: run a trained policy for N episodes, optionally recording videos.

Episodes use their own seeds (``seed + k`` for episode ``k``), the run's observation
normalisation frozen at its checkpointed statistics, and deterministic actions (the mode) unless
asked to sample. The result is written to ``RUN_DIR/eval.json`` (or ``out``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from klppo.rl.policy import Policy, load
from klppo.runs.paths import check_writable
from klppo.runs.rundir import write_json_atomic
from klppo.runs.threads import compute_threads

__all__ = ["EvalResult", "RenderingUnavailable", "evaluate", "eval_path", "EVAL_FILE"]

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


def _make_env(policy: Policy, video_dir: Path | None) -> gym.Env:
    env_id = policy.config.env.partition(":")[2] or policy.config.env
    if video_dir is None:
        return gym.make(env_id)
    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise RenderingUnavailable("--video needs moviepy: pip install 'klppo[video]'") from None
    try:
        env = gym.make(env_id, render_mode="rgb_array")
        env.reset(seed=0)
        frame = env.render()
    except Exception as e:  # noqa: BLE001 - any renderer can fail its own way (no GL, no display)
        raise RenderingUnavailable(f"{env_id} cannot render here ({type(e).__name__}: {e}); "
                                   f"for MuJoCo try MUJOCO_GL=egl or MUJOCO_GL=osmesa") from None
    if frame is None:
        raise RenderingUnavailable(f"{env_id} renders no rgb_array frames")
    return gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda k: True,
                                    name_prefix="eval", disable_logger=True)


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


def eval_path(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Where eval.json goes (``out``, else ``RUN_DIR/eval.json``), checked before any episode
    runs: ValueError naming the path when it is a directory or its folder is not writable (a
    read-only run directory: write elsewhere with ``out``)."""
    path = Path(out) if out is not None else Path(run_dir) / EVAL_FILE
    what = "out" if out is not None else "eval.json"
    if path.is_dir():
        raise ValueError(f"{what}={str(path)!r}: is a directory")
    if not path.parent.is_dir():
        raise ValueError(f"{what}={str(path)!r}: {str(path.parent)!r} is not a directory")
    try:
        check_writable(path.parent, what)
    except OSError as e:
        hint = "" if out is not None else "; write it elsewhere with --out FILE"
        raise ValueError(f"{what}={str(path)!r}: {str(e).partition(': ')[2]}{hint}") from None
    return path


@compute_threads(torch_threads=1)  # one small network per step: more threads only contend
def evaluate(run_dir: str | Path, episodes: int = 10, deterministic: bool = True,
             seed: int = 1_000_000, video_dir: str | Path | None = None,
             out: str | Path | None = None) -> EvalResult:
    """Run ``episodes`` episodes of the run's policy and write ``out`` (default
    ``RUN_DIR/eval.json``, see :func:`eval_path`)."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes={episodes!r}: must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    policy = load(run_dir)
    path = eval_path(run_dir, out)
    if video_dir is not None:
        try:
            check_writable(video_dir, "--video")
        except OSError as e:
            raise ValueError(str(e)) from None
    vdir = None if video_dir is None else Path(video_dir)
    env = _make_env(policy, vdir)
    gen = torch.Generator().manual_seed(seed)
    try:
        runs = [_episode(env, policy, seed + k, deterministic, gen) for k in range(episodes)]
    finally:
        env.close()
    returns = [r for r, _ in runs]
    videos = sorted(str(p) for p in vdir.glob("*.mp4")) if vdir is not None else []
    result = EvalResult(episodes, deterministic, seed, returns, [n for _, n in runs],
                        float(np.mean(returns)), float(np.std(returns)), videos)
    write_json_atomic(path, asdict(result))
    return result


def read_eval(run_dir: str | Path) -> EvalResult:
    d = json.loads((Path(run_dir) / EVAL_FILE).read_text())
    return EvalResult(**d)
