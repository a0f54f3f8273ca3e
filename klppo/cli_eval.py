"""``klppo eval RUN_DIR``: evaluate a trained policy (and record videos)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="run a trained policy for N episodes (mean +- std, "
                                    "eval.json, optional videos)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", help="a run directory with a checkpoint")
    p.add_argument("--episodes", type=int, default=10, help="episodes to run")
    p.add_argument("--stochastic", action="store_true",
                   help="sample actions instead of taking the mode")
    p.add_argument("--seed", type=int, default=1_000_000,
                   help="seed of episode 0 (episode k uses seed + k)")
    p.add_argument("--video", metavar="DIR", help="record every episode as mp4 into DIR "
                                                   "(needs pip install 'klppo[video]')")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    import os

    if args.video:  # MuJoCo renders headless through EGL where it can (set before its import)
        os.environ.setdefault("MUJOCO_GL", "egl")
    from klppo.rl.evaluate import RenderingUnavailable, evaluate
    from klppo.rl.lifecycle import ResumeError
    from klppo.runs.checkpoint import CheckpointError
    from klppo.runs.configfile import InputError

    try:
        res = evaluate(args.run_dir, args.episodes, not args.stochastic, args.seed, args.video)
    except (ResumeError, CheckpointError, InputError, RenderingUnavailable, ValueError,
            FileNotFoundError) as e:
        msg = str(e).replace("resume=", "run_dir=")
        print(f"klppo eval: {msg}", file=sys.stderr)
        return 2
    mode = "deterministic" if res.deterministic else "sampled"
    last = res.seed + res.episodes - 1
    print(f"{res.episodes} episodes ({mode} actions, seeds {res.seed}..{last}): "
          f"return {res.mean:.2f} +- {res.std:.2f}")
    print("returns: " + " ".join(f"{r:.1f}" for r in res.returns))
    for v in res.videos:
        print(f"video: {v}")
    print(f"written: {args.run_dir}/eval.json")
    return 0
