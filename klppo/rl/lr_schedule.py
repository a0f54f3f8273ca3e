"""The learning-rate schedule of a run: ``ppo.lr``, annealed linearly with ``ppo.anneal_lr``
(CleanRL's schedule), piece by piece when ``klppo train --resume DIR --total-steps`` changed the
run's length. Read by each policy at the start of an iteration (:mod:`klppo.rl.unit`) and by
:func:`klppo.rl.lifecycle.extend_config` when a run's total changes."""

from __future__ import annotations

from klppo.rl.config import TrainConfig

__all__ = ["learning_rate", "lr_fraction"]


def learning_rate(cfg: TrainConfig, it: int) -> float:
    """Iteration ``it``'s learning rate: ``ppo.lr``, annealed linearly with ``ppo.anneal_lr``
    (:func:`lr_fraction`)."""
    return cfg.ppo.lr * lr_fraction(cfg, it) if cfg.ppo.anneal_lr else cfg.ppo.lr


def lr_fraction(cfg: TrainConfig, it: int) -> float:
    """The fraction of ``ppo.lr`` that iteration ``it`` (1-based) learns with.

    A run of N iterations anneals from 1 at iteration 1 to 1/N at iteration N (CleanRL's
    schedule). A run whose total was changed at iteration k by ``klppo train --resume DIR
    --total-steps`` (``lr_anneal_from = (k, f)``) goes on from f at iteration k + 1 to
    f / (N - k) at its new last iteration N: with the default ``--lr-plan replan`` f is
    ``1 - k / N`` (the schedule over the new total), with ``continue`` the fraction of iteration k
    (no jump); a run extended twice is annealed piece by piece. Without ``ppo.anneal_lr``: 1."""
    if not cfg.ppo.anneal_lr:
        return 1.0
    if cfg.lr_anneal_from is None:
        return 1.0 - (it - 1) / cfg.num_iterations
    k, f = int(cfg.lr_anneal_from[0]), float(cfg.lr_anneal_from[1])
    return f if it <= k else f * (1.0 - (it - k - 1) / (cfg.num_iterations - k))
