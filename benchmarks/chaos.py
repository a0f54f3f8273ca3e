"""Chaos benchmark: kill training runs with SIGKILL at random points, resume, compare.

For every preset, one uninterrupted reference run, then one run that is killed ``--kills`` times
(alternately at a random moment and a few milliseconds after an iteration's metrics line, while
its checkpoint is being written) and restarted as a user would (``klppo train --resume``, or the
first command while the run directory holds no config yet), then run to the end. The finished
``metrics.jsonl`` must equal the reference's in every non-timing field.

    python benchmarks/chaos.py --kills 10                  # cartpole, lunarlander, hopper
    python benchmarks/chaos.py --presets klip/hopper --kills 20 --seed 3

Prints one line per preset and the totals; exits 1 when any run differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMING = {"sps", "time_collect", "time_update", "time_elapsed"}
#: preset -> total steps of the chaos runs (several iterations, seconds each here)
STEPS = {"klip/cartpole": 32_768, "klip/lunarlander": 65_536, "klip/hopper": 24_576,
         "klip/halfcheetah": 16_384, "klip/walker2d": 16_384, "klip/ant": 8_192,
         "klip/humanoid": 8_192}

#: steps per iteration of each preset (num_envs * num_steps)
STEPS_PER_ITER = {"klip/cartpole": 512, "klip/lunarlander": 16_384}


def _cmd(preset: str, steps: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "klppo", "train", "--preset", preset, "--total-steps",
            str(steps), "--checkpoint-every", "1", "--no-tensorboard", "--out", str(out)]


def _metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines if x]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _kill_when(proc: subprocess.Popen, run_dir: Path, delay: float, rng: random.Random,
               at_checkpoint: bool) -> str:
    """SIGKILL ``proc`` after ``delay`` s, or (``at_checkpoint``) 0-20 ms after its next metrics
    line, when the iteration's checkpoint is being written. Return 'random' or 'checkpoint',
    or 'ended' if the process ended first."""
    t_end = time.perf_counter() + delay
    metrics, size0 = run_dir / "metrics.jsonl", _size(run_dir / "metrics.jsonl")
    while proc.poll() is None:
        if at_checkpoint and _size(metrics) > max(size0, 0):
            time.sleep(rng.uniform(0.0, 0.02))
            t_end = 0.0
        if time.perf_counter() >= t_end:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return "checkpoint" if at_checkpoint else "random"
        time.sleep(0.0005)
    return "ended"


def _command(preset: str, steps: int, run: Path) -> list[str]:
    """What a user would type next: resume once the run directory holds a config."""
    if (run / "config.yaml").exists():
        return [sys.executable, "-m", "klppo", "train", "--resume", str(run)]
    return _cmd(preset, steps, run)


def chaos_run(preset: str, steps: int, kills: int, rng: random.Random, root: Path) -> dict:
    ref = root / "ref"
    t0 = time.perf_counter()
    subprocess.run(_cmd(preset, steps, ref), check=True, capture_output=True, env=_env())
    wall = time.perf_counter() - t0
    run = root / "chaos"
    counts = {"random": 0, "checkpoint": 0, "ended": 0, "mid_write": 0, "starts": 0}
    for k in range(kills):
        proc = subprocess.Popen(_command(preset, steps, run), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=_env())
        counts["starts"] += 1
        done = len(_metrics(run)) if (run / "metrics.jsonl").exists() else 0
        left = max(0.05, 1 - done * STEPS_PER_ITER.get(preset, 2048) / steps)
        counts[_kill_when(proc, run, rng.uniform(0.0, wall * left), rng, k % 2 == 1)] += 1
        counts["mid_write"] += any(run.glob(".checkpoint.pt.tmp*"))
    final = subprocess.run(_command(preset, steps, run), capture_output=True, text=True,
                           env=_env())
    counts["starts"] += 1
    same = final.returncode == 0 and _metrics(run) == _metrics(ref)
    left = sorted(p.name for p in run.glob(".*tmp*"))
    return {"preset": preset, "steps": steps, "reference_s": wall, "identical": same,
            "temp_files_left": left,
            "error": None if final.returncode == 0 else final.stderr.strip()[-300:], **counts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+",
                    default=["klip/cartpole", "klip/lunarlander", "klip/hopper"])
    ap.add_argument("--kills", type=int, default=10, help="kills per preset (>= 1)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill times")
    ap.add_argument("--out", help="keep the run directories here (default: a temp dir)")
    args = ap.parse_args()
    if args.kills < 1:
        ap.error(f"--kills={args.kills}: must be >= 1")
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out or tmp)
        for preset in args.presets:
            r = chaos_run(preset, STEPS.get(preset, 16_384), args.kills, rng,
                          base / preset.replace("/", "-"))
            results.append(r)
            print(f"{preset:18} {r['steps']:>6} steps ({r['reference_s']:.0f} s)  kills: "
                  f"{r['random']} random + {r['checkpoint']} at a checkpoint "
                  f"({r['mid_write']} mid-write; {r['ended']} too late)  starts {r['starts']}  "
                  f"identical: {r['identical']}  temp files left: {len(r['temp_files_left'])}"
                  + (f"  error: {r['error']}" if r["error"] else ""), flush=True)
    bad = [r for r in results if not r["identical"] or r["temp_files_left"]]
    kills = sum(r["random"] + r["checkpoint"] for r in results)
    print(f"chaos: {len(results)} presets, {kills} kills, {len(bad)} runs differ")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
