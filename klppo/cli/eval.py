"""``klppo eval RUN_DIR``: evaluate a trained policy (and record videos)."""

from __future__ import annotations

import argparse

from klppo.cli.errors import REPORTED, FlagError, exit_code, say_error
from klppo.cli.flags import int_in, path_arg

DESCRIPTION = ("Run the policy of a run directory's last checkpoint for N episodes (the mode "
               "of each action, or samples with --stochastic) and write the returns' mean and "
               "std to RUN_DIR/eval.json; optionally record each episode as a video. A "
               "multi-agent run reports each policy, trained or acting at random (--random).")


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="run a trained policy for N episodes (mean +- std, "
                                    "eval.json, optional videos)",
                       description=DESCRIPTION,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", help="a run directory with a checkpoint")
    p.add_argument("--episodes", type=int_in(1, 100_000), default=10, help="episodes to run")
    p.add_argument("--stochastic", action="store_true",
                   help="sample actions instead of taking the mode")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=1_000_000,
                   help="seed of episode 0 (episode k uses seed + k)")
    p.add_argument("--video", type=path_arg, metavar="DIR",
                   help="record every episode as mp4 into DIR (needs pip install "
                        "'klppo[video]')")
    p.add_argument("--out", type=path_arg, metavar="FILE",
                   help="write the result here instead of RUN_DIR/eval.json (a read-only "
                        "run directory)")
    p.add_argument("--random", nargs="+", metavar="POLICY", default=[],
                   help="multi-agent runs: these policies act uniformly at random (e.g. a "
                        "trained adversary against random good agents)")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    import os

    if args.video:  # MuJoCo renders headless through EGL where it can (set before its import)
        os.environ.setdefault("MUJOCO_GL", "egl")
    from klppo.rl.evaluate import RenderingUnavailable, eval_path, evaluate

    try:
        if _multiagent(args.run_dir):
            return _eval_policies(args)
        if args.random:
            raise FlagError(f"--random {' '.join(args.random)}: only for multi-agent runs")
        res = evaluate(args.run_dir, args.episodes, not args.stochastic, args.seed, args.video,
                       args.out)
    except (*REPORTED, RenderingUnavailable) as e:  # a run directory is named by run_dir here
        say_error("eval", str(e).replace("resume=", "run_dir="))
        return exit_code(e)
    mode = "deterministic" if res.deterministic else "sampled"
    last = res.seed + res.episodes - 1
    print(f"{res.episodes} episodes ({mode} actions, seeds {res.seed}..{last}): "
          f"return {res.mean:.2f} +- {res.std:.2f}")
    print("returns: " + " ".join(f"{r:.1f}" for r in res.returns))
    for v in res.videos:
        print(f"video: {v}")
    print(f"written: {eval_path(args.run_dir, args.out)}")
    return 0


def _multiagent(run_dir: str) -> bool:
    from klppo.rl.lifecycle import read_run_config
    from klppo.rl.marl.spec import is_multiagent

    return is_multiagent(read_run_config(run_dir).env)


def _eval_policies(args: argparse.Namespace) -> int:
    """A multi-agent run: each policy trained or random; a table and eval.json."""
    from dataclasses import asdict

    from klppo.rl.evaluate import eval_path
    from klppo.rl.marl.evaluate import evaluate_policies
    from klppo.runs.rundir import write_json_atomic

    if args.video:
        raise FlagError("--video: not available for multi-agent runs")
    path = eval_path(args.run_dir, args.out)
    res = evaluate_policies(args.run_dir, args.episodes, args.seed, args.random,
                            deterministic=not args.stochastic)
    mode = "deterministic" if not args.stochastic else "sampled"
    print(f"{args.episodes} episodes ({mode} actions of the trained policies, seeds "
          f"{args.seed}..{args.seed + args.episodes - 1}); return per episode, mean over a "
          f"policy's agents:")
    for p, r in res.items():
        print(f"  {p:<16} {r.actor:<8} {r.mean:9.2f} +- {r.std:.2f}")
    out = {"episodes": args.episodes, "deterministic": not args.stochastic, "seed": args.seed,
           "policies": {p: {**asdict(r), "mean": r.mean, "std": r.std} for p, r in res.items()}}
    write_json_atomic(path, out)
    print(f"written: {path}")
    return 0
