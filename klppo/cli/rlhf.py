"""``klppo rlhf``: RLHF-style PPO on a language model (``klppo rlhf compare``: the fixed vs
adaptive comparison, in :mod:`klppo.cli.rlhf_compare`)."""

from __future__ import annotations

import signal

from klppo.cli.errors import REPORTED, FlagError, crashed, fail, signal_exit, stopped_at_once
from klppo.cli.flags import Once, OneLineParser, name_arg, parse_config_flags, path_arg
from klppo.cli.progress import Bar, Closes, Part, no_tqdm_bars, quiet_hf_progress

RLHF_USAGE = """klppo rlhf [--preset NAME] [--config FILE.yaml] [FLAGS...]
       klppo rlhf --resume RUN_DIR
       klppo rlhf compare [FLAGS...]

PPO on a language model kept near a frozen reference by a KL penalty (the RLHF recipe of
Ziegler et al.), scored by a sentiment reward. The PPO and KL flags have `klppo train`'s names
(--ppo.lr, --kl.controller, --kl.target, ...); the older names (--lr, --controller, ...) still
work.

--preset: start from named settings measured to hold a KL target: smollm2 (SmolLM2-135M, lr
1e-5, the PID rule, target 3 nats per sequence; the defaults below are the 1M-parameter Austen
model's, whose lr 1e-4 no beta holds on a pretrained LM). --config: a YAML mapping of the
fields below, over the preset (flags override both). --resume continues a run from its last
checkpoint exactly (the run's config.yaml is used; no other flags)."""


class RLHFProgress(Closes):
    """The RLHF bar, updated every iteration (a line per iteration off a terminal): score, KL
    in its unit, beta, the held-out perplexity when measured, elapsed time and ETA."""

    def __init__(self, iterations: int, file=None) -> None:
        self.bar = Bar(iterations, every=1, file=file)

    def __call__(self, m: dict) -> None:
        it, n = m["iteration"], self.bar.total
        parts = [Part.of(10, f"iter {it:>{len(str(n))}}/{n}", f"{it}/{n}", shorten=4),
                 Part.of(7, f"score {m['score']:+.3f}"),
                 Part.of(7, f"KL {m['kl']:.2f} ({m['kl_unit']})", f"KL {m['kl']:.2f}",
                         shorten=4),
                 Part.of(7, f"beta {m['beta']:.4g}")]
        if m.get("held_out_perplexity"):
            parts.append(Part.of(5, f"ppl {m['held_out_perplexity']:.1f}"))
        self.bar.update(it, parts)

    def close(self) -> None:
        self.bar.close()



def _rlhf_config(preset: str | None, config: str | None, rest: list[str]):
    """The config from --preset, --config (YAML) over it and the flags over both, validated."""
    from klppo.lm.config import ConfigError, RLHFConfig
    from klppo.lm.presets import rlhf_preset

    base = RLHFConfig() if preset is None else rlhf_preset(preset)
    if config is not None:
        from klppo.lm.config_checks import config_from_dict
        from klppo.runs.configfile import read_config_file

        try:
            base = config_from_dict(read_config_file(config, "config"), base)
        except ConfigError as e:
            raise ConfigError(f"{e} (in {config})") from None
    cfg = parse_config_flags(RLHFConfig, rest, "klppo rlhf", default=base,
                             description=RLHF_USAGE)
    from klppo.runs.owned import inside_owned

    reason = inside_owned(cfg.out) if cfg.out else None
    if reason is not None:
        raise ConfigError(reason)
    return cfg


def _pre_parser() -> OneLineParser:
    """The flags read before the config: --preset, --config and --resume (each at most once)."""
    pre = OneLineParser(prog="klppo rlhf", add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", type=name_arg, action=Once)
    pre.add_argument("--config", type=path_arg, action=Once)
    pre.add_argument("--resume", type=path_arg, action=Once)
    return pre


def run(argv: list[str]) -> int:
    """``klppo rlhf ARGV`` (``klppo rlhf compare ...`` included): 0 when the run finished, 1
    when it failed, 2 on bad input, 128 + the signal (130 SIGINT, 143 SIGTERM) when a signal
    stopped it (the resume command is printed)."""
    no_tqdm_bars()
    if argv and argv[0] == "compare":
        from klppo.cli.rlhf_compare import run as run_compare

        return run_compare(argv[1:])
    known, rest = _pre_parser().parse_known_args(argv)
    try:
        res = _start(known, rest)
    except REPORTED as e:  # a failed run (RunFailed) exits 1, bad input 2
        return fail("rlhf", e)
    except KeyboardInterrupt as e:
        return stopped_at_once("rlhf", e)
    except Exception as e:  # noqa: BLE001 - anything else is a failure, still one line
        return crashed("rlhf", e)
    print(f"run directory: {res.run_dir}")
    print(f"status: {res.status}")
    if res.status == "interrupted":
        sig = signal.Signals(res.stop_signal or signal.SIGINT).name
        done = res.metrics[-1]["iteration"] if res.metrics else 0
        print(f"stopped by {sig} after iteration {done:,} (checkpointed); resume with: "
              f"klppo rlhf --resume {res.run_dir}", flush=True)
        return signal_exit(res.stop_signal)
    return 0


def _start(known, rest: list[str]):
    """Run (or resume) what the flags ask for; the RLHF result."""
    if known.resume is None:
        # --help exits here, before torch is imported
        cfg = _rlhf_config(known.preset, known.config, rest)
        from klppo.lm.rlhf import rlhf

        quiet_hf_progress()
        with RLHFProgress(cfg.iterations) as progress:
            return rlhf(cfg, on_iteration=progress)
    if rest or known.config is not None or known.preset is not None:
        given = ' '.join(rest) or ('--config' if known.config is not None else '--preset')
        raise FlagError(f"resume={known.resume!r}: takes no other flags (the run's "
                        f"config.yaml is used), got {given}")
    from klppo.lm.rlhf import read_run_config, resume_rlhf

    quiet_hf_progress()
    with RLHFProgress(read_run_config(known.resume).iterations) as progress:
        return resume_rlhf(known.resume, on_iteration=progress)
