"""``klppo lm pretrain``: the BPE tokenizer and the small GPT-2 reference for ``klppo rlhf``."""

from __future__ import annotations

import textwrap

from klppo.cli.errors import BAD_INPUT, INTERRUPTED, REPORTED, crashed, fail, say_error
from klppo.cli.flags import parse_config_flags
from klppo.cli.progress import Bar, Part, no_tqdm_bars, quiet_hf_progress

LM_USAGE = """usage: klppo lm pretrain [FLAGS...]

Language-model commands (they need the lm extra: pip install -e '.[lm]'):
  pretrain   train the BPE tokenizer and the small GPT-2 reference on the Austen train split
             and save both in the Hugging Face format (klppo lm pretrain --help: every flag)

The RLHF experiment on such a model: klppo rlhf --help, klppo rlhf compare --help."""


PRETRAIN_DESCRIPTION = textwrap.fill(
    "Train a byte-level BPE tokenizer and a small GPT-2 on the Austen train split (shipped "
    "with klppo; nothing is downloaded), report the held-out perplexity, and save both in the "
    "Hugging Face format into --out: the reference model of `klppo rlhf --model`.", 88)


class PretrainProgress:
    """The pretraining bar (a line every ``steps / lines`` steps off a terminal): step, loss,
    learning rate, elapsed time and ETA (from the steps after the first)."""

    def __init__(self, steps: int, lines: int = 20, file=None) -> None:
        self.bar = Bar(steps, lines=lines, file=file)

    def __call__(self, m: dict) -> None:
        step, steps = m["step"], m["steps"]
        self.bar.update(step, [Part.of(10, f"step {step:>{len(str(steps))}}/{steps}"),
                               Part.of(8, f"loss {m['loss']:.3f}"),
                               Part.of(4, f"lr {m['lr']:.2e}")])

    def close(self) -> None:
        self.bar.close()


def run(argv: list[str]) -> int:
    """``klppo lm ARGV``: ``pretrain`` is the one command."""
    no_tqdm_bars()
    if argv and argv[0] in ("-h", "--help"):
        print(LM_USAGE)
        return 0
    if not argv or argv[0] != "pretrain":
        what = f"unknown command {argv[0]!r}; " if argv else ""
        say_error("lm", f"{what}usage: klppo lm pretrain [FLAGS...] (klppo lm --help)")
        return BAD_INPUT
    from klppo.lm.pretrain_config import PretrainConfig, validate_pretrain

    try:
        cfg = validate_pretrain(parse_config_flags(PretrainConfig, argv[1:],
                                                   "klppo lm pretrain",
                                                   description=PRETRAIN_DESCRIPTION))
    except REPORTED as e:
        return fail("lm pretrain", e)
    from klppo.lm.pretrain import pretrain

    quiet_hf_progress()
    print(f"pretraining a small GPT-2 on the Austen train split ({cfg.steps} steps; the "
          f"tokenizer first) ...", flush=True)
    progress = PretrainProgress(cfg.steps)
    try:
        res = pretrain(cfg, on_step=progress)
    except KeyboardInterrupt:
        progress.close()
        say_error("lm pretrain", "interrupted (nothing is saved before the last step)")
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a failed run is one line, exit 1
        progress.close()
        return crashed("lm pretrain", e)
    progress.close()
    print(f"held-out perplexity {res['held_out_perplexity']:.1f} (at init "
          f"{res['held_out_perplexity_at_init']:.0f}); {res['parameters']:,} parameters; "
          f"{res['train_tokens_per_second']:,.0f} training tokens/s; "
          f"{res['train_seconds']:.0f}s")
    print(f"saved to {cfg.out} (AutoModelForCausalLM / AutoTokenizer format)")
    return 0
