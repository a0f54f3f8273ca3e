"""``klppo verify``: check Theorems 1 and 2 and the controllers on random data."""

from __future__ import annotations

import argparse

DESCRIPTION = ("Check the library's identities on random batches it builds itself: Theorem 1 "
               "(the gradient of PPO-Clip equals the gradient of the per-sample KL template), "
               "Theorem 2 (min(wA, clip(w)A) == wA - Phi(w, A)), the partition fractions, and "
               "every controller on one scripted KL trace. Exit 0 when every check passes.")


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check Theorems 1 and 2 and the controllers on random data",
                       description=DESCRIPTION)
    p.add_argument("--seed", type=int, default=0, help="seed of the random batches")
    p.add_argument("--batches", type=int, default=200, help="random batches per batch size")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    from klppo.core.verify import verify

    res = verify(seed=args.seed, batches=args.batches)
    _print_theorems(res)
    f = res.fractions
    print(f"Partition (eps 0.2): in {f['in']:.3f}  pass {f['pass']:.3f}  kill {f['kill']:.3f}")
    print("Controllers on a scripted KL trace (target 0.02 nats per sample):")
    print("  " + f"{'KL':>16}" + "".join(f"{d:>8.4f}" for d in res.kl_trace))
    for name, betas in res.controller_betas.items():
        print("  " + f"{name:>16}" + "".join(f"{b:>8.3f}" for b in betas))
    print("verify: OK" if res.ok else "verify: FAILED")
    return 0 if res.ok else 1


def _print_theorems(res) -> None:
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
