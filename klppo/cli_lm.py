"""``klppo lm pretrain``, ``klppo rlhf`` and ``klppo rlhf compare``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from klppo import cli_common
from klppo.cli_common import BAD_INPUT, FAILED, OneLineParser, parse_config_flags, say_error

LM_USAGE = """usage: klppo lm pretrain [FLAGS...]

Language-model commands (they need the lm extra: pip install -e '.[lm]'):
  pretrain   train the BPE tokenizer and the small GPT-2 reference on the Austen train split
             and save both in the Hugging Face format (klppo lm pretrain --help: every flag)

The RLHF experiment on such a model: klppo rlhf --help, klppo rlhf compare --help."""

RLHF_USAGE = """klppo rlhf [--config FILE.yaml] [FLAGS...]
       klppo rlhf --resume RUN_DIR
       klppo rlhf compare [FLAGS...]

--config: a YAML mapping of the fields below (flags override it). --resume continues a run
from its last checkpoint exactly (the run's config.yaml is used; no other flags)."""


def _quiet_transformers() -> None:
    """No per-save progress bars from transformers on the CLI's stderr."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def _input_errors() -> tuple[type[BaseException], ...]:
    """What bad input raises: printed as one line, exit status 2."""
    from klppo.runs.rundir import DirBusyError

    return (ValueError, OSError, DirBusyError)


class PretrainProgress:
    """One line every ``every`` steps (and the first and last) with loss, elapsed time, ETA."""

    def __init__(self, steps: int, lines: int = 20) -> None:
        self.every = max(1, steps // lines)
        self.t0 = time.perf_counter()

    def __call__(self, m: dict) -> None:
        step, steps = m["step"], m["steps"]
        if step % self.every and step not in (1, steps):
            return
        times = cli_common.elapsed_eta(time.perf_counter() - self.t0, step, steps - step)
        print(f"step {step:>{len(str(steps))}}/{steps}  loss {m['loss']:.3f}  lr {m['lr']:.2e}  "
              f"{times}", flush=True)


def run_lm(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(LM_USAGE)
        return 0
    if not argv or argv[0] != "pretrain":
        what = f"unknown command {argv[0]!r}; " if argv else ""
        print(f"klppo lm: {what}usage: klppo lm pretrain [FLAGS...] (klppo lm --help)",
              file=sys.stderr)
        return BAD_INPUT
    from klppo.lm.pretrain import PretrainConfig, pretrain, validate_pretrain

    try:
        cfg = validate_pretrain(parse_config_flags(PretrainConfig, argv[1:],
                                                   "klppo lm pretrain"))
    except _input_errors() as e:
        say_error("lm pretrain", e)
        return BAD_INPUT
    print(f"pretraining a small GPT-2 on the Austen train split ({cfg.steps} steps) ...",
          flush=True)
    try:
        res = pretrain(cfg, on_step=PretrainProgress(cfg.steps))
    except Exception as e:  # noqa: BLE001 - a failed run is one line, exit 1
        say_error("lm pretrain", f"failed: {type(e).__name__}: {e}")
        return FAILED
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


def _rlhf_config(config: str | None, rest: list[str]):
    """The config from --config (YAML) and the flags over it, validated."""
    from klppo.lm.config import ConfigError, RLHFConfig, config_from_dict
    from klppo.runs.configfile import read_config_file

    base = RLHFConfig()
    if config is not None:
        try:
            base = config_from_dict(read_config_file(config, "config"))
        except ConfigError as e:
            raise ConfigError(f"{e} (in {config})") from None
    return parse_config_flags(RLHFConfig, rest, "klppo rlhf", default=base,
                              description=RLHF_USAGE)


def run_rlhf(argv: list[str]) -> int:
    if argv and argv[0] == "compare":
        return run_compare(argv[1:])
    pre = OneLineParser(prog="klppo rlhf", add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--resume")
    known, rest = pre.parse_known_args(argv)
    from klppo.lm.rlhf import RLHFError, resume_rlhf, rlhf

    _quiet_transformers()

    try:
        if known.resume is not None:
            if rest or known.config is not None:
                raise ValueError(f"resume={known.resume!r}: takes no other flags (the run's "
                                 f"config.yaml is used), got {' '.join(rest) or '--config'}")
            res = resume_rlhf(known.resume, on_iteration=_progress)
        else:
            cfg = _rlhf_config(known.config, rest)
            res = rlhf(cfg, on_iteration=_progress)
    except RLHFError as e:
        say_error("rlhf", e)
        return FAILED
    except _input_errors() as e:
        say_error("rlhf", e)
        return BAD_INPUT
    except KeyboardInterrupt:
        say_error("rlhf", "interrupted at once (second signal); resume with --resume")
        return 130
    except Exception as e:  # noqa: BLE001 - anything else is a failure, still one line
        say_error("rlhf", f"failed: {type(e).__name__}: {e}")
        return FAILED
    print(f"run directory: {res.run_dir}")
    print(f"status: {res.status}" + (f"; continue with `klppo rlhf --resume {res.run_dir}`"
                                     if res.status == "interrupted" else ""))
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


def _compare_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="klppo rlhf compare",
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                      description="fixed vs adaptive KL control, both regimes: four arms per "
                                  "seed (a too-strong and a too-weak fixed beta, and the "
                                  "adaptive controller started from each), then the report")
    p.add_argument("--model", default="runs/lm/base",
                   help="pretrained HF model directory (klppo lm pretrain)")
    p.add_argument("--out", default="runs/rlhf-compare",
                   help="comparison directory (runs/ and report/)")
    p.add_argument("--iterations", type=int, default=150, help="PPO iterations per arm")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (4 arms each)")
    p.add_argument("--strong-beta", type=float, default=2.0, help="too-strong fixed beta")
    p.add_argument("--weak-beta", type=float, default=0.04, help="too-weak fixed beta")
    p.add_argument("--adaptive", default="proportional", help="adaptive controller")
    p.add_argument("--target", type=float, default=6.0, help="target KL (nats per sequence)")
    p.add_argument("--workers", type=int, default=2, help="arms in parallel")
    p.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="other RLHFConfig fields, e.g. lr=0.0001 kl_estimator=k3")
    return p


#: RLHFConfig fields that compare sets itself (from its own flags, or per arm)
_OWN_FIELDS = {"model": "--model", "out": "--out", "iterations": "--iterations",
               "seed": "--seeds", "beta": "--strong-beta / --weak-beta",
               "controller": "--adaptive", "target": "--target"}


def _set_fields(items: list[str]) -> dict:
    from klppo.lm.config import ConfigError
    from klppo.runs.configfile import parse_yaml

    over = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ConfigError(f"--set={item!r}: expected FIELD=VALUE")
        if k.replace("-", "_") in _OWN_FIELDS:
            raise ConfigError(f"--set={item!r}: {k} is set by {_OWN_FIELDS[k]}")
        over[k] = parse_yaml(v, f"--set={item!r}")
    return over


def _compare_configs(a: argparse.Namespace) -> dict:
    """Every arm's config from the flags; one-line errors naming the flag and the value."""
    import math

    from klppo.core.controllers import CONTROLLERS
    from klppo.experiments.rlhf_compare import arms
    from klppo.lm.config import ConfigError, RLHFConfig, config_from_dict
    from klppo.lm.model import check_model_dir
    from klppo.runs.paths import check_writable

    for flag, v in (("--strong-beta", a.strong_beta), ("--weak-beta", a.weak_beta)):
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"{flag}={v!r}: must be finite and >= 0")
    if a.adaptive not in CONTROLLERS:
        raise ConfigError(f"--adaptive={a.adaptive!r}: must be one of {sorted(CONTROLLERS)}")
    if a.workers < 1:
        raise ConfigError(f"--workers={a.workers!r}: must be an integer >= 1")
    if len(set(a.seeds)) != len(a.seeds):
        raise ConfigError(f"--seeds={a.seeds!r}: must be distinct")
    base = config_from_dict(_set_fields(a.set), RLHFConfig(
        model=a.model, iterations=a.iterations, target=a.target))
    configs = arms(base, a.strong_beta, a.weak_beta, a.adaptive, a.seeds)
    check_model_dir(a.model)
    check_writable(a.out)
    return configs


def run_compare(argv: list[str]) -> int:
    from klppo.experiments.rlhf_compare import run_compare as go
    from klppo.report.lm import lm_report

    a = _compare_parser().parse_args(argv)
    try:
        configs = _compare_configs(a)
    except _input_errors() as e:
        say_error("rlhf compare", e)
        return BAD_INPUT
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
    return 0 if all(s == "finished" for s, _ in results.values()) else FAILED
