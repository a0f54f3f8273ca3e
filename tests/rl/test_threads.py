"""Same seed, same metrics, however klppo is started (issue #19): the CLI and ``klppo.rl.train``
from a process that imported numpy first with several BLAS threads give identical metrics, and
a run leaves the caller's thread counts as it found them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from klppo.rl.presets import PRESETS
from klppo.rl.trainer import TIMING_KEYS
from klppo.runs.threads import compute_threads

ROOT = Path(__file__).resolve().parents[2]

#: preset -> flags that keep the run short but long enough to diverge under other threads
CASES = {
    "cartpole": ["--preset", "klip/cartpole", "--total-steps", "3072"],
    "marl": ["--preset", "marl/simple_adversary", "--total-steps", "3200"],
}


def _env(**threads: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return {**env, "PYTHONPATH": str(ROOT), **threads}


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def _api_code(flags: list[str], out: Path) -> str:
    """A user's script: numpy imported (and its BLAS pool started) before klppo is."""
    return ("import numpy as np; a = np.ones((256, 256)); a @ a\n"
            "from klppo.cli.train import parse_train\n"
            "import klppo.rl as rl\n"
            f"cfg = parse_train({[*flags, '--no-tensorboard', '--out', str(out)]!r})\n"
            "rl.train(cfg)\n")


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow if c == "marl" else ())
                                  for c in sorted(CASES)])  # marl: in the slow suite
def test_api_with_two_blas_threads_equals_the_cli(case, tmp_path):
    if case == "marl":
        pytest.importorskip("mpe2")
    _compare(CASES[case], tmp_path)


def _compare(flags: list[str], tmp_path: Path) -> None:
    cli = subprocess.run([sys.executable, "-m", "klppo", "train", *flags, "--no-tensorboard",
                          "--out", str(tmp_path / "cli")], env=_env(), cwd=tmp_path,
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    api = subprocess.run([sys.executable, "-c", _api_code(flags, tmp_path / "api")],
                         env=_env(OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2"), cwd=tmp_path,
                         capture_output=True, text=True)
    assert api.returncode == 0, api.stderr
    assert _metrics(tmp_path / "api") == _metrics(tmp_path / "cli")
    meta = json.loads((tmp_path / "api" / "metadata.json").read_text())
    assert meta["threads"]["torch"] == 1
    assert all(lib["num_threads"] == 1 for lib in meta["threads"]["blas"])


def _short_flags(name: str) -> list[str]:
    """Three iterations of a preset, rollouts cut to keep a MuJoCo run to seconds."""
    from klppo.rl.presets import preset

    c = preset(name)
    steps = min(c.rollout.num_steps, 256 if not name.startswith("marl/") else 50)
    return ["--preset", name, "--rollout.num-steps", str(steps),
            "--total-steps", str(3 * steps * c.rollout.num_envs)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_gives_the_cli_numbers_from_the_api(name, tmp_path):
    pytest.importorskip("Box2D" if name == "klip/lunarlander" else
                        "mpe2" if name.startswith("marl/") else
                        "gymnasium" if name == "klip/cartpole" else "mujoco")
    _compare(_short_flags(name), tmp_path)


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_compute_threads_sets_and_restores_both_pools():
    np.ones(2) @ np.ones(2)  # numpy's BLAS is loaded
    before_torch = torch.get_num_threads()
    with threadpool_limits(limits=2, user_api="blas"):
        outer = _blas_threads()
        with compute_threads(torch_threads=1) as record:
            assert torch.get_num_threads() == 1
            assert set(_blas_threads()) == {1}
            assert record["torch"] == 1 and record["blas"]
        assert _blas_threads() == outer
    assert torch.get_num_threads() == before_torch


def test_a_run_computes_on_one_blas_thread_whatever_the_caller_set(tmp_path):
    """In-process: the caller's BLAS pool has two threads; every iteration runs on one, and
    the caller gets its two back."""
    import dataclasses

    import klppo.rl as rl

    np.ones(2) @ np.ones(2)
    seen: list[list[int]] = []
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), total_steps=1024, tensorboard=False,
                              out=str(tmp_path / "r"))
    with threadpool_limits(limits=2, user_api="blas"):
        rl.train(cfg, on_iteration=lambda m: seen.append(_blas_threads()))
        assert set(_blas_threads()) == {2}
    assert seen and all(set(s) == {1} for s in seen)
