"""``klppo rlhf compare``: fixed vs adaptive KL control on the RLHF task, both regimes (a
too-strong and a too-weak fixed beta, and the adaptive controller started from each), then the
report."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from klppo.cli.errors import FAILED, REPORTED, FlagError, fail
from klppo.cli.flags import MAX_WORKERS, Once, OneLineParser, name_arg, path_arg, yaml_value
from klppo.cli.progress import Eta, clock


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


def _compare_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="klppo rlhf compare", allow_abbrev=False,
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                      description="fixed vs adaptive KL control, both regimes: four arms per "
                                  "seed (a too-strong and a too-weak fixed beta, and the "
                                  "adaptive controller started from each), then the report")
    p.add_argument("--preset", type=name_arg, default=argparse.SUPPRESS, action=Once,
                   help="start every arm from a `klppo rlhf --preset` (smollm2: SmolLM2-135M, "
                        "lr 1e-5, the PID rule, target 3); the flags below override it "
                        "(default: none, the Austen model's settings)")
    p.add_argument("--model", default=argparse.SUPPRESS,
                   help="pretrained HF model directory (klppo lm pretrain), or smollm2 "
                        "(default: the preset's, else runs/lm/base)")
    p.add_argument("--out", type=path_arg, default="runs/rlhf-compare",
                   help="comparison directory (runs/ and report/)")
    p.add_argument("--iterations", type=int, default=argparse.SUPPRESS,
                   help="PPO iterations per arm (default: the preset's, else 150)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (4 arms each)")
    p.add_argument("--strong-beta", type=float, default=2.0, help="too-strong fixed beta")
    p.add_argument("--weak-beta", type=float, default=0.04, help="too-weak fixed beta")
    p.add_argument("--adaptive", default=argparse.SUPPRESS,
                   help="adaptive controller (default: the preset's, else proportional)")
    p.add_argument("--target", type=float, default=argparse.SUPPRESS,
                   help="target KL, nats per sequence (default: the preset's, else 6)")
    p.add_argument("--workers", type=int, default=2,
                   help=f"arms in parallel (at most {MAX_WORKERS:,})")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                   help="other RLHFConfig fields, e.g. lr=0.0001 kl_estimator=k3")
    return p


#: RLHFConfig fields that compare sets itself (from its own flags, or per arm)
_OWN_FIELDS = {"model": "--model", "out": "--out", "iterations": "--iterations",
               "seed": "--seeds", "beta": "--strong-beta / --weak-beta",
               "controller": "--adaptive", "target": "--target"}


def _set_fields(items: list[str]) -> dict:
    over = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise FlagError(f"--set={item!r}: expected FIELD=VALUE")
        if k.replace("-", "_") in _OWN_FIELDS:
            raise FlagError(f"--set={item!r}: {k} is set by {_OWN_FIELDS[k]}")
        over[k] = yaml_value(v, f"--set={item!r}")
    return over


def _compare_configs(a: argparse.Namespace) -> dict:
    """Every arm's config from the flags; one-line errors naming the flag and the value."""
    import math

    from klppo.core.controllers import CONTROLLERS
    from klppo.experiments.rlhf_compare import ARMS_PER_SEED, arms
    from klppo.experiments.sweep_spec import MAX_RUNS
    from klppo.lm.config import RLHFConfig
    from klppo.lm.config_checks import config_from_dict
    from klppo.lm.model import check_model_dir
    from klppo.lm.presets import rlhf_preset
    from klppo.runs.paths import check_writable

    for flag, v in (("--strong-beta", a.strong_beta), ("--weak-beta", a.weak_beta)):
        if not (math.isfinite(v) and v >= 0):
            raise FlagError(f"{flag}={v!r}: must be finite and >= 0")
    if not 1 <= a.workers <= MAX_WORKERS:
        raise FlagError(f"--workers={a.workers!r}: must be an integer in [1, {MAX_WORKERS:,}]")
    if len(a.seeds) * ARMS_PER_SEED > MAX_RUNS:
        raise FlagError(f"--seeds: {len(a.seeds):,} seeds make {len(a.seeds) * ARMS_PER_SEED:,} "
                        f"arms; at most {MAX_RUNS:,} (as in klppo sweep): at most "
                        f"{MAX_RUNS // ARMS_PER_SEED:,} seeds")
    if len(set(a.seeds)) != len(a.seeds):
        raise FlagError(f"--seeds={a.seeds!r}: must be distinct")
    preset = getattr(a, "preset", None)  # (flags not given are absent: defaults are the base's)
    base = RLHFConfig() if preset is None else rlhf_preset(preset)
    given = {k: getattr(a, k) for k in ("model", "iterations", "target") if hasattr(a, k)}
    base = config_from_dict({**given, **_set_fields(a.set)}, base)
    adaptive = getattr(a, "adaptive", base.controller)
    if adaptive not in CONTROLLERS or adaptive == "fixed":
        raise FlagError(f"--adaptive={adaptive!r}: must be one of "
                        f"{sorted(set(CONTROLLERS) - {'fixed'})}")
    configs = arms(base, a.strong_beta, a.weak_beta, adaptive, a.seeds)
    check_model_dir(base.model)
    check_writable(a.out)
    _check_out(a.out, configs)
    return configs


def _check_out(out: str, configs: dict) -> None:
    """FlagError for an --out that holds something other than a comparison (a run, a sweep, a
    tuning study), or a comparison whose arms were started with other settings (its finished
    arms would be reported as this one's)."""
    import dataclasses

    import yaml

    from klppo.experiments.rlhf_worker import PENDING
    from klppo.runs.owned import inside_owned, kind_of
    from klppo.runs.rundir import read_yaml

    held = kind_of(Path(out).resolve())
    if held is not None:
        raise FlagError(f"--out={out!r}: holds a {held}, not a comparison; choose another --out")
    reason = inside_owned(out, "--out")
    if reason is not None:
        raise FlagError(reason)
    for name, cfg in configs.items():
        pending = Path(out) / "runs" / name / PENDING
        if not pending.is_file():
            continue
        raw = read_yaml(pending, "arm")
        if not isinstance(raw, dict):
            raise FlagError(f"--out={out!r}: {pending} is not an arm's config; choose another "
                            f"--out")
        before = {k: v for k, v in raw.items() if k != "out"}
        now = yaml.safe_load(yaml.safe_dump(dataclasses.asdict(cfg)))
        now.pop("out", None)
        changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        if changed:
            k = changed[0]
            raise FlagError(f"--out={out!r}: its arm {name} was started with {k}="
                            f"{before.get(k)!r}, not {now.get(k)!r}; continue it with the same "
                            f"flags or choose another --out")


def run(argv: list[str]) -> int:
    """``klppo rlhf compare ARGV``: 0 when every arm finished, 1 otherwise, 2 on bad input."""
    a = _compare_parser().parse_args(argv)  # --help exits here, before torch is imported
    from klppo.experiments.rlhf_compare import run_compare as go
    from klppo.report.lm import lm_report

    try:
        configs = _compare_configs(a)
    except REPORTED as e:
        return fail("rlhf compare", e)
    t0 = time.perf_counter()
    iterations = next(iter(configs.values())).iterations
    print(f"{len(configs)} arms, {iterations} iterations each, {a.workers} at a time",
          flush=True)

    eta, ended = Eta(len(configs), from_first=False, wave=a.workers), [0]

    def done(name, state, err):
        ended[0] += 1
        eta.update(ended[0])
        # a stop request ends the runs early: no time is left to estimate
        left = "-" if eta.left is None or state != "finished" else clock(eta.left)
        print(f"  [{ended[0]}/{len(configs)}] {name}: {state}"
              f"{'' if err is None else ' (' + err[:200] + ')'} "
              f"({time.perf_counter() - t0:.0f}s, ETA {left})", flush=True)

    results = go(configs, a.out, a.workers, done)
    page, summaries = lm_report(a.out, Path(a.out) / "report")
    print((Path(a.out) / "report" / "summary.md").read_text())
    for line in conclusion(summaries):
        print(line)
    (Path(a.out) / "report" / "conclusion.json").write_text(json.dumps(conclusion(summaries)))
    print(f"report: {page.resolve()}  ({time.perf_counter() - t0:.0f}s)")
    return 0 if all(s == "finished" for s, _ in results.values()) else FAILED
