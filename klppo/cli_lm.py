"""``klppo lm pretrain``, ``klppo rlhf`` and ``klppo rlhf compare``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path


def run_lm(argv: list[str]) -> int:
    import tyro

    if not argv or argv[0] != "pretrain":
        print("usage: klppo lm pretrain [--out DIR] [--steps N] ... (--help for all)",
              file=sys.stderr)
        return 2
    from klppo.lm.pretrain import PretrainConfig, pretrain

    cfg = tyro.cli(PretrainConfig, args=argv[1:], prog="klppo lm pretrain")
    print(f"pretraining a small GPT-2 on the Austen train split ({cfg.steps} steps) ...",
          flush=True)
    res = pretrain(cfg)
    print(f"held-out perplexity {res['held_out_perplexity']:.1f} (at init "
          f"{res['held_out_perplexity_at_init']:.0f}); {res['parameters']:,} parameters; "
          f"{res['train_tokens_per_second']:,.0f} training tokens/s; "
          f"{res['train_seconds']:.0f}s")
    print(f"saved to {cfg.out} (AutoModelForCausalLM / AutoTokenizer format)")
    return 0


def _progress(m: dict) -> None:
    if m["iteration"] % 10 == 0 or m["iteration"] == 1:
        ppl = m.get("held_out_perplexity")
        print(f"iter {m['iteration']:>4}  score {m['score']:+.3f}  KL {m['kl']:.2f} "
              f"({m['kl_unit']})  beta {m['beta']:.4g}" + (f"  ppl {ppl:.1f}" if ppl else ""),
              flush=True)


def run_rlhf(argv: list[str]) -> int:
    import tyro

    from klppo.lm.config import RLHFConfig

    if argv and argv[0] == "compare":
        return run_compare(argv[1:])
    cfg = tyro.cli(RLHFConfig, args=argv, prog="klppo rlhf")
    from klppo.lm.rlhf import rlhf

    try:
        res = rlhf(cfg, on_iteration=_progress)
    except (ValueError, FileNotFoundError) as e:
        print(f"klppo rlhf: {e}", file=sys.stderr)
        return 1
    print(f"run directory: {res.run_dir}")
    return 0


def conclusion(summaries) -> list[str]:
    """Plain statements the numbers support (no claim that adaptive always wins on reward)."""
    s = {x.arm: x for x in summaries}
    lines = []
    for regime in ("strong", "weak"):
        f, a = s.get(f"fixed_{regime}"), s.get(f"adaptive_from_{regime}")
        if not (f and a):
            continue
        lines.append(
            f"{regime} start: adaptive KL {a.kl_second_half:.2f} vs fixed {f.kl_second_half:.2f} "
            f"(target {a.target:g} {a.kl_unit}); |KL - target| {a.kl_abs_error_second_half:.2f} "
            f"vs {f.kl_abs_error_second_half:.2f}; adaptive within 1 nat for every seed: "
            f"{'yes' if a.max_seed_abs_error <= 1 else 'no'} (worst {a.max_seed_abs_error:.2f})"
            f"; score {a.score_second_half:.3f} vs {f.score_second_half:.3f}; held-out "
            f"perplexity {a.final_perplexity:.1f} vs {f.final_perplexity:.1f}.")
    return lines


def run_compare(argv: list[str]) -> int:
    from klppo.lm.compare import arms
    from klppo.lm.compare import run_compare as go
    from klppo.lm.config import RLHFConfig
    from klppo.report.lm import lm_report

    p = argparse.ArgumentParser(prog="klppo rlhf compare",
                                description="fixed vs adaptive KL control, both regimes")
    p.add_argument("--model", default="runs/lm/base", help="pretrained HF model directory")
    p.add_argument("--out", default="runs/rlhf-compare")
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--strong-beta", type=float, default=2.0, help="too-strong fixed beta")
    p.add_argument("--weak-beta", type=float, default=0.04, help="too-weak fixed beta")
    p.add_argument("--adaptive", default="proportional", help="adaptive controller")
    p.add_argument("--target", type=float, default=6.0, help="target KL (nats per sequence)")
    p.add_argument("--workers", type=int, default=2, help="arms in parallel")
    p.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="other RLHFConfig fields, e.g. lr=0.0001 kl_estimator=k3")
    a = p.parse_args(argv)
    import yaml

    over = {}
    for item in a.set:
        k, sep, v = item.partition("=")
        if not sep:
            print(f"--set {item!r}: expected FIELD=VALUE", file=sys.stderr)
            return 2
        over[k] = yaml.safe_load(v)
    try:
        base = dataclasses.replace(RLHFConfig(model=a.model, iterations=a.iterations,
                                              target=a.target), **over)
        configs = arms(base, a.strong_beta, a.weak_beta, a.adaptive, a.seeds)
    except (TypeError, ValueError) as e:
        print(f"klppo rlhf compare: {e}", file=sys.stderr)
        return 2
    if not (Path(a.model) / "config.json").exists():
        print(f"klppo rlhf compare: no model at {a.model}; run `klppo lm pretrain --out "
              f"{a.model}` first", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    print(f"{len(configs)} arms, {a.iterations} iterations each, {a.workers} at a time",
          flush=True)

    def done(name, state, err):
        print(f"  {name}: {state}{'' if err is None else ' (' + err[:200] + ')'} "
              f"({time.perf_counter() - t0:.0f}s)", flush=True)

    results = go(configs, a.out, a.workers, done)
    page, summaries = lm_report(a.out, Path(a.out) / "report")
    print((Path(a.out) / "report" / "summary.md").read_text())
    for line in conclusion(summaries):
        print(line)
    (Path(a.out) / "report" / "conclusion.json").write_text(json.dumps(conclusion(summaries)))
    print(f"report: {page.resolve()}  ({time.perf_counter() - t0:.0f}s)")
    return 0 if all(s == "finished" for s, _ in results.values()) else 1
