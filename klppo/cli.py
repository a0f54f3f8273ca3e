"""The ``klppo`` command (argparse for the sub-commands; tyro for training configs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

# Thread counts are not set here: every run sets its BLAS and torch pools inside the process
# (klppo.runs.threads), so the CLI and the Python API compute the same numbers.


def _cmd_verify(args: argparse.Namespace) -> int:
    from klppo.core.verify import verify

    res = verify(seed=args.seed, batches=args.batches)
    print("Theorem 1: grad of mean PPO-Clip == grad of mean per-sample KL template (float32)")
    print(f"  {'batch':>6} {'batches':>8} {'bit-identical':>14} {'max |diff|':>12} {'max rel':>10}")
    for c in res.theorem1:
        print(f"  {c.batch_size:>6} {c.batches:>8} {c.bit_identical_batches:>14} "
              f"{c.max_abs_diff:>12.3e} {c.max_rel_diff:>10.2e}")
    print("  (power-of-two batch sizes cancel bit for bit; others leave ~1 ulp residuals)")
    print("Theorem 2: min(wA, clip(w)A) == wA - Phi(w, A) on 100,000 samples")
    print(f"  float32: max |diff| = {res.theorem2_max_abs_diff:.3e} "
          f"(max {res.theorem2_max_rel_diff:.2e} of |wA|, i.e. rounding)")
    print(f"  float64: max |diff| = {res.theorem2_max_abs_diff_f64:.3e}   "
          f"min Phi = {res.theorem2_min_phi:.3e} (Phi >= 0)")
    f = res.fractions
    print(f"Partition (eps 0.2): in {f['in']:.3f}  pass {f['pass']:.3f}  kill {f['kill']:.3f}")
    print("Controllers on a scripted KL trace (target 0.02 nats per sample):")
    print("  " + f"{'KL':>16}" + "".join(f"{d:>8.4f}" for d in res.kl_trace))
    for name, betas in res.controller_betas.items():
        print("  " + f"{name:>16}" + "".join(f"{b:>8.3f}" for b in betas))
    print("verify: OK" if res.ok else "verify: FAILED")
    return 0 if res.ok else 1


def build_parser() -> argparse.ArgumentParser:
    from klppo.cli_common import OneLineParser

    parser = OneLineParser(prog="klppo", description="KL-controlled policy optimisation toolkit.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="train PPO on a Gymnasium env (klppo train --help)",
                   add_help=False)
    sub.add_parser("lm", help="language model: klppo lm pretrain (needs the lm extra)",
                   add_help=False)
    sub.add_parser("rlhf", help="RLHF-style PPO on a LM; `klppo rlhf compare` runs fixed vs "
                                "adaptive arms (needs the lm extra)", add_help=False)
    p = sub.add_parser("verify", help="check Theorems 1 and 2 and the controllers on random data")
    p.add_argument("--seed", type=int, default=0, help="seed of the random batches")
    p.add_argument("--batches", type=int, default=200, help="random batches per batch size")
    p.set_defaults(func=_cmd_verify)
    from klppo.cli_eval import add_parser as add_eval
    from klppo.cli_experiments import add_parsers
    from klppo.cli_replay import add_parser as add_replay

    add_parsers(sub)
    add_replay(sub)
    add_eval(sub)
    return parser


#: sub-commands with their own argument parsing (the rest of argv is passed through)
PASSTHROUGH: dict[str, str] = {"train": "klppo.cli_train:run_train",
                               "lm": "klppo.cli_lm:run_lm", "rlhf": "klppo.cli_lm:run_rlhf"}


def main(argv: list[str] | None = None) -> int:
    import importlib
    import logging

    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if argv and argv[0] in PASSTHROUGH:
            module, _, func = PASSTHROUGH[argv[0]].partition(":")
            return getattr(importlib.import_module(module), func)(argv[1:])
        parser = build_parser()
        args = parser.parse_args(argv)
        run: Callable[[argparse.Namespace], int] = args.func
        return run(args)
    except KeyboardInterrupt:  # Ctrl-C before a command took over the signal (imports, parsing)
        name = argv[0] if argv and not argv[0].startswith("-") else "klppo"
        print(f"klppo {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
