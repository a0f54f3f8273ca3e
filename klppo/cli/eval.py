"""``klppo eval RUN_DIR|SWEEP_DIR``: evaluate trained policies (and record videos)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from klppo.cli.errors import REPORTED, FlagError, exit_code, say_error
from klppo.cli.flags import Once, int_in, name_arg, path_arg
from klppo.runs.install import install_hint

DESCRIPTION = ("Run the policy of a run directory's last checkpoint for N episodes (the mode "
               "of each action, or samples with --stochastic) and write the returns' mean and "
               "std to RUN_DIR/eval.json (the next free RUN_DIR/eval-N.json when that exists: "
               "an evaluation never overwrites another) or to --out FILE; optionally record "
               "each episode as a video. A sweep directory evaluates each of its runs (or the "
               "one --run names). A multi-agent run reports each policy, trained or acting at "
               "random (--random). The training return is measured with sampled actions: "
               "compare it with --stochastic.")


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="run a trained policy for N episodes (mean +- std, "
                                    "eval.json, optional videos)",
                       description=DESCRIPTION,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", help="a run directory with a checkpoint, or a sweep directory")
    p.add_argument("--episodes", type=int_in(1, 100_000), default=10, help="episodes to run")
    p.add_argument("--stochastic", action="store_true",
                   help="sample actions instead of taking the mode")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=1_000_000,
                   help="seed of episode 0 (episode k uses seed + k)")
    p.add_argument("--video", type=path_arg, metavar="DIR",
                   help="record every episode as mp4 into DIR (a sweep: DIR/RUN_NAME; needs "
                        f"{install_hint('video')})")
    p.add_argument("--out", type=path_arg, metavar="FILE",
                   help="write the result here (a sweep: every run's, in one file) instead of "
                        "in the run directory; an existing FILE is refused unless --force")
    p.add_argument("--force", action="store_true",
                   help="overwrite --out FILE, or RUN_DIR/eval.json, if it exists")
    p.add_argument("--run", type=name_arg, action=Once, metavar="NAME",
                   help="a sweep directory: evaluate only this run (its directory name under "
                        "SWEEP/runs)")
    p.add_argument("--random", nargs="+", metavar="POLICY", default=[],
                   help="multi-agent runs: these policies act uniformly at random (e.g. a "
                        "trained adversary against random good agents)")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    import os

    if args.video:  # MuJoCo renders headless through EGL where it can (set before its import)
        os.environ.setdefault("MUJOCO_GL", "egl")
        # pygame's SDL (classic control, Box2D) draws off-screen into arrays: without a display
        # its default driver prints "error: XDG_RUNTIME_DIR is invalid" on every run
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    from klppo.rl.evaluate import RenderingUnavailable

    reported: tuple[type[BaseException], ...] = (*REPORTED, RenderingUnavailable)
    try:
        runs = _runs(Path(args.run_dir), args.run)
        _check_destinations(args, runs)
        if runs is None:
            if args.run is not None:
                raise FlagError(f"--run {args.run}: only for a sweep directory; "
                                f"{args.run_dir} is a run directory")
            _evaluate(args, Path(args.run_dir), args.out, args.video)
            return 0
        return _eval_sweep(args, runs)
    except reported as e:
        say_error("eval", str(e))
        return exit_code(e)


def _runs(path: Path, only: str | None) -> dict[str, Path] | None:
    """A sweep directory's run directories by name (only ``only`` when given); None for a run
    directory (or anything else, which the run's reader names)."""
    if (path / "config.yaml").exists() or not (path / "runs").is_dir():
        return None
    runs = {p.name: p for p in sorted((path / "runs").iterdir())
            if p.is_dir() and (p / "config.yaml").is_file()}
    if not runs:
        raise FlagError(f"run_dir={str(path)!r}: a sweep directory without runs yet")
    if only is not None:
        if only not in runs:
            names = sorted(runs)
            listed = ", ".join(names[:8]) + (f", ... ({len(names)} runs)" if len(names) > 8
                                             else "")
            raise FlagError(f"--run {only}: not a run of {path} (its runs: {listed})")
        return {only: runs[only]}
    return runs


#: the videos eval records into --video DIR (gymnasium's RecordVideo, name prefix "eval")
VIDEO_FILES = "eval-episode-*.mp4"


def _check_destinations(args: argparse.Namespace, runs: dict[str, Path] | None) -> None:
    """FlagError, before any work, when --out or --video would write a file that a run or
    sweep owns (its checkpoint, metrics, config, ...), whatever --force says."""
    from klppo.runs.owned import owned_reason

    reasons = []
    if args.out:
        reasons.append(owned_reason(args.out, what="--out"))
    if args.video:  # a run's episodes, or a sweep's in VIDEO/RUN_NAME
        own = [VIDEO_FILES] if runs is None else sorted(runs)
        reasons.append(owned_reason(args.video, own, "--video"))
    for reason in reasons:
        if reason is not None:
            raise FlagError(reason)


def _eval_sweep(args: argparse.Namespace, runs: dict[str, Path]) -> int:
    """Each run of a sweep: one line each; the results in each run directory, or all in
    ``--out``. Runs without a checkpoint yet are skipped (and said)."""
    from klppo.rl.evaluate import eval_path
    from klppo.runs.checkpoint import CHECKPOINT
    from klppo.runs.rundir import write_json_atomic

    out = eval_path(args.run_dir, args.out, args.force) if args.out else None
    ready = {n: p for n, p in runs.items() if (p / CHECKPOINT).exists()}
    for name in sorted(set(runs) - set(ready)):
        print(f"skipped {name}: no checkpoint yet")
    if not ready:
        raise FlagError(f"run_dir={args.run_dir!r}: no run of this sweep has a checkpoint yet")
    results: dict[str, Any] = {}
    for name, run in ready.items():
        video = str(Path(args.video) / name) if args.video else None
        if video:
            Path(video).mkdir(parents=True, exist_ok=True)
        print(f"{name}:")
        results[name] = _evaluate(args, run, None, video, own_file=out is None)
    if out is not None:
        write_json_atomic(out, {"sweep": str(args.run_dir), "runs": results})
        print(f"written: {out}")
    return 0


def _evaluate(args: argparse.Namespace, run: Path, out: str | None, video: str | None,
              own_file: bool = True) -> dict[str, Any]:
    """Evaluate one run, print its lines, write its file (``out``, else RUN_DIR/eval.json or
    the next free eval-N.json; none when not ``own_file``: a sweep evaluated into one file)
    and return the result."""
    if _multiagent(run):
        return _eval_policies(args, run, out, own_file)
    if args.random:
        raise FlagError(f"--random {' '.join(args.random)}: only for multi-agent runs")
    from klppo.rl.evaluate import episodes_text, evaluate

    res = evaluate(run, args.episodes, not args.stochastic, args.seed, video, out, args.force,
                   write=own_file)
    mode = "deterministic" if res.deterministic else "sampled"
    last = res.seed + res.episodes - 1
    seeds = f"seed {res.seed}" if res.episodes == 1 else f"seeds {res.seed}..{last}"
    print(f"{episodes_text(res.episodes)} ({mode} actions, {seeds}): "
          f"return {res.mean:.2f} +- {res.std:.2f}")
    print("returns: " + " ".join(f"{r:.1f}" for r in res.returns))
    for v in res.videos:
        print(f"video: {v}")
    if own_file:
        print(f"written: {res.path}")
    return res.to_json()


def _multiagent(run_dir: Path) -> bool:
    from klppo.rl.lifecycle import read_run_config
    from klppo.rl.marl.spec import is_multiagent
    from klppo.rl.policy import run_dir_of

    return is_multiagent(read_run_config(run_dir_of(run_dir), "run_dir").env)


def _eval_policies(args: argparse.Namespace, run: Path, out: str | None,
                   own_file: bool) -> dict[str, Any]:
    """A multi-agent run: each policy trained or random; a table and its eval file."""
    from dataclasses import asdict

    from klppo.rl.evaluate import episodes_text, eval_path
    from klppo.rl.marl.evaluate import evaluate_policies
    from klppo.rl.policy import run_dir_of
    from klppo.runs.rundir import write_json_atomic

    if args.video:
        raise FlagError("--video: not available for multi-agent runs")
    run = run_dir_of(run)
    path = eval_path(run, out, args.force) if own_file else None
    res = evaluate_policies(run, args.episodes, args.seed, args.random,
                            deterministic=not args.stochastic)
    mode = "deterministic" if not args.stochastic else "sampled"
    last = args.seed + args.episodes - 1
    seeds = f"seed {args.seed}" if args.episodes == 1 else f"seeds {args.seed}..{last}"
    print(f"{episodes_text(args.episodes)} ({mode} actions of the trained policies, {seeds}); "
          f"return per episode, mean over a policy's agents:")
    for p, r in res.items():
        print(f"  {p:<16} {r.actor:<8} {r.mean:9.2f} +- {r.std:.2f}")
    result = {"episodes": args.episodes, "deterministic": not args.stochastic, "seed": args.seed,
              "policies": {p: {**asdict(r), "mean": r.mean, "std": r.std}
                           for p, r in res.items()}}
    if path is not None:
        write_json_atomic(path, result)
        print(f"written: {path}")
    return json.loads(json.dumps(result))
