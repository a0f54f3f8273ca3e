"""``klppo rlhf``: RLHF-style PPO on a language model (``klppo rlhf compare``: the fixed vs
adaptive comparison, in :mod:`klppo.cli.rlhf_compare`)."""

from __future__ import annotations

from klppo.cli.errors import INTERRUPTED, REPORTED, FlagError, crashed, fail, say_error
from klppo.cli.flags import OneLineParser, parse_config_flags

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


def run(argv: list[str]) -> int:
    """``klppo rlhf ARGV`` (``klppo rlhf compare ...`` included): 0 when the run finished or
    was interrupted (resumable), 1 when it failed, 2 on bad input."""
    if argv and argv[0] == "compare":
        from klppo.cli.rlhf_compare import run as run_compare

        return run_compare(argv[1:])
    pre = OneLineParser(prog="klppo rlhf", add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--resume")
    known, rest = pre.parse_known_args(argv)
    _quiet_transformers()
    try:
        res = _start(known, rest)
    except REPORTED as e:  # a failed run (RunFailed) exits 1, bad input 2
        return fail("rlhf", e)
    except KeyboardInterrupt:
        say_error("rlhf", "interrupted at once (second signal); resume with --resume")
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - anything else is a failure, still one line
        return crashed("rlhf", e)
    print(f"run directory: {res.run_dir}")
    print(f"status: {res.status}" + (f"; continue with `klppo rlhf --resume {res.run_dir}`"
                                     if res.status == "interrupted" else ""))
    return 0


def _start(known, rest: list[str]):
    """Run (or resume) what the flags ask for; the RLHF result."""
    from klppo.lm.rlhf import resume_rlhf, rlhf

    if known.resume is None:
        return rlhf(_rlhf_config(known.config, rest), on_iteration=_progress)
    if rest or known.config is not None:
        raise FlagError(f"resume={known.resume!r}: takes no other flags (the run's "
                        f"config.yaml is used), got {' '.join(rest) or '--config'}")
    return resume_rlhf(known.resume, on_iteration=_progress)
