"""Experiments over the RL trainer and the RLHF loop: sweeps (local process pool or Ray), their
worker processes, and the RLHF fixed-vs-adaptive comparison. The top layer below the CLI: it
imports ``rl``, ``lm`` and ``runs``; nothing below imports it."""
