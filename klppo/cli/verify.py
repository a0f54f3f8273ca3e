"""``klppo verify``: check Theorems 1 and 2 and the controllers on random data, and which KL
each estimator x placement x correction descends (by exact enumeration)."""

from __future__ import annotations

import argparse

from klppo.cli.errors import FlagError, fail

#: bounds of the flags: a batch costs a few milliseconds (200 batches of 4 sizes: seconds)
MAX_BATCHES = 10_000
MAX_SEED = 2**63 - 1

DESCRIPTION = ("Check the library's identities on random batches it builds itself: Theorem 1 "
               "(the gradient of PPO-Clip equals the gradient of the per-sample KL template), "
               "Theorem 2 (min(wA, clip(w)A) == wA - Phi(w, A)), the partition fractions, and "
               "every controller on one scripted KL trace; and, for every KL estimator x "
               "placement (reward or loss) x importance correction, the expected gradient by "
               "exact enumeration on small categorical policies against the gradients of "
               "KL(pi || pi_ref) and KL(pi_ref || pi), checked against the library's claimed "
               "table. Exit 0 when every check passes.")


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check Theorems 1 and 2, the controllers and the KL gradient "
                                            "table",
                       description=DESCRIPTION)
    p.add_argument("--seed", type=int, default=0,
                   help=f"seed of the random batches, in [0, {MAX_SEED:,}]")
    p.add_argument("--batches", type=int, default=200,
                   help=f"random batches per batch size, 1 to {MAX_BATCHES:,} (200: a few "
                        f"seconds)")
    p.set_defaults(func=cmd_verify)


def check_verify_flags(seed: int, batches: int) -> None:
    """FlagError (one line, before any work) for a seed or a batch count out of range: every
    batch costs a few milliseconds, so 10^9 of them would run for weeks without a word."""
    if not 0 <= seed <= MAX_SEED:
        raise FlagError(f"--seed={seed}: must be in [0, {MAX_SEED:,}]")
    if not 1 <= batches <= MAX_BATCHES:
        raise FlagError(f"--batches={batches}: must be 1 to {MAX_BATCHES:,} (random batches per "
                        f"batch size; 200, the default, takes a few seconds)")


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        check_verify_flags(args.seed, args.batches)
    except FlagError as e:
        return fail("verify", e)
    from klppo.core.verify import verify  # (torch: after the flags are checked)
    from klppo.runs.threads import compute_threads

    with compute_threads(1):  # tiny tensors: one thread is fastest, and the same on every machine
        res = verify(seed=args.seed, batches=args.batches)
    _print_theorems(res)
    f = res.fractions
    print(f"Partition (eps 0.2): in {f['in']:.3f}  pass {f['pass']:.3f}  kill {f['kill']:.3f}")
    print("Controllers on a scripted KL trace (target 0.02 nats per sample):")
    print("  " + f"{'KL':>16}" + "".join(f"{d:>8.4f}" for d in res.kl_trace))
    for name, betas in res.controller_betas.items():
        print("  " + f"{name:>16}" + "".join(f"{b:>8.3f}" for b in betas))
    _print_kl_gradients(res.kl_gradients)
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


_BLOCKS = {"reward": "in the reward (score function)", "loss": "in the loss (differentiated)"}


def _print_kl_gradients(check) -> None:
    from klppo.core.kl_gradients import HORIZONS

    t = check.table
    print("KL gradients: which KL each estimator x placement x correction descends (exact "
          "enumeration)")
    print(f"  against grad KL(pi || pi_ref) (reverse) and grad KL(pi_ref || pi) (forward) on "
          f"{t.instances} random policies")
    print("  (docs/algorithms.md explains the columns; (0): the expected gradient is 0)")
    cells = {(c.combination.horizon, c.combination.placement, c.combination.granularity,
              c.combination.estimator, c.combination.correction): c for c in t.cells}
    for horizon, vocab in HORIZONS.items():
        print(f"  {'one action' if horizon == 1 else f'{horizon} tokens'} ({vocab**horizon} "
              f"{'actions' if horizon == 1 else 'sequences'}):")
        for place in _BLOCKS:
            for gran in ("token", "sequence"):
                _print_block(cells, horizon, place, gran)
    print(f"  check (float64): {len(t.cells)} cells; unbiased ones within max |diff| = "
          f"{check.max_unbiased_diff:.1e} of their KL's gradient,")
    print(f"  'neither' ones at least {check.min_biased_gap:.1e} from both")
    for m in check.mismatches:
        print(f"  MISMATCH {m.combination.describe()}: claimed {m.claimed}, "
              f"enumerated {m.enumerated}")
    print("  claimed classification (klppo.core.kl_gradient_claims): " +
          ("agrees with enumeration" if check.ok else "DISAGREES with enumeration"))
    _print_trl_grpo()


def _print_trl_grpo() -> None:
    """TRL GRPO's settings as cells of the table above (k3 per token, in the loss)."""
    from klppo.integrations.trl_gradients import grpo_settings

    print("TRL GRPO: its KL term (k3 per token in the loss, times beta) per setting, as cells "
          "of the table above")
    print(f"    {'importance_sampling_level':<26}{'use_bias_correction_kl':<24}{'pass':<8}"
          f"{'correction':<21}{'one token':<11}{'3 tokens'}")
    for st in grpo_settings():
        print(f"    {st.importance_sampling_level:<26}{str(st.use_bias_correction_kl):<24}"
              f"{'first' if st.first_pass else 'later':<8}{st.correction:<21}"
              f"{st.one_token:<11}{st.sequence}")
    print("  klppo.integrations.trl.attach refuses sequence level with the correction and warns "
          "where one token is not reverse")


def _print_block(cells: dict, horizon: int, place: str, gran: str) -> None:
    """One placement's rows (estimators) x columns (corrections), if it has cells."""
    from klppo.core.kl_gradients import CORRECTIONS, GRADIENT_ESTIMATORS

    rows = [e for e in GRADIENT_ESTIMATORS if (horizon, place, gran, e, "none") in cells]
    if not rows:
        return
    cols = [c for c in CORRECTIONS if any((horizon, place, gran, e, c) in cells for e in rows)]
    unit = "" if horizon == 1 else (", per token" if gran == "token" else ", sequence log-ratio")
    print(f"   {_BLOCKS[place] + unit}:")
    print(f"    {'':<11}" + "".join(f"{c:>17}" for c in cols))
    for e in rows:
        out = [cells.get((horizon, place, gran, e, c)) for c in cols]
        print(f"    {e:<11}" + "".join(
            f"{'-' if r is None else r.verdict + (' (0)' if r.zero else ''):>17}" for r in out))
