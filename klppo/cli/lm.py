"""``klppo lm pretrain``: the BPE tokenizer and the small GPT-2 reference for ``klppo rlhf``."""

from __future__ import annotations

import time

from klppo.cli.errors import BAD_INPUT, REPORTED, crashed, fail, say_error
from klppo.cli.flags import parse_config_flags
from klppo.cli.progress import elapsed_eta

LM_USAGE = """usage: klppo lm pretrain [FLAGS...]

Language-model commands (they need the lm extra: pip install -e '.[lm]'):
  pretrain   train the BPE tokenizer and the small GPT-2 reference on the Austen train split
             and save both in the Hugging Face format (klppo lm pretrain --help: every flag)

The RLHF experiment on such a model: klppo rlhf --help, klppo rlhf compare --help."""


class PretrainProgress:
    """One line every ``every`` steps (and the first and last) with loss, elapsed time, ETA."""

    def __init__(self, steps: int, lines: int = 20) -> None:
        self.every = max(1, steps // lines)
        self.t0 = time.perf_counter()

    def __call__(self, m: dict) -> None:
        step, steps = m["step"], m["steps"]
        if step % self.every and step not in (1, steps):
            return
        times = elapsed_eta(time.perf_counter() - self.t0, step, steps - step)
        print(f"step {step:>{len(str(steps))}}/{steps}  loss {m['loss']:.3f}  lr {m['lr']:.2e}  "
              f"{times}", flush=True)


def run(argv: list[str]) -> int:
    """``klppo lm ARGV``: ``pretrain`` is the one command."""
    if argv and argv[0] in ("-h", "--help"):
        print(LM_USAGE)
        return 0
    if not argv or argv[0] != "pretrain":
        what = f"unknown command {argv[0]!r}; " if argv else ""
        say_error("lm", f"{what}usage: klppo lm pretrain [FLAGS...] (klppo lm --help)")
        return BAD_INPUT
    from klppo.lm.pretrain import PretrainConfig, pretrain, validate_pretrain

    try:
        cfg = validate_pretrain(parse_config_flags(PretrainConfig, argv[1:],
                                                   "klppo lm pretrain"))
    except REPORTED as e:
        return fail("lm pretrain", e)
    print(f"pretraining a small GPT-2 on the Austen train split ({cfg.steps} steps) ...",
          flush=True)
    try:
        res = pretrain(cfg, on_step=PretrainProgress(cfg.steps))
    except Exception as e:  # noqa: BLE001 - a failed run is one line, exit 1
        return crashed("lm pretrain", e)
    print(f"held-out perplexity {res['held_out_perplexity']:.1f} (at init "
          f"{res['held_out_perplexity_at_init']:.0f}); {res['parameters']:,} parameters; "
          f"{res['train_tokens_per_second']:,.0f} training tokens/s; "
          f"{res['train_seconds']:.0f}s")
    print(f"saved to {cfg.out} (AutoModelForCausalLM / AutoTokenizer format)")
    return 0
