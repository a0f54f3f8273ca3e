"""Test helpers for one policy's update outside a trainer."""

from klppo.nn.numpy import mlp
from klppo.rl.engine.advantages import group_gae
from klppo.rl.engine.learn import Rollouts, RunUpdate, policy_kls, update_rows
from klppo.rl.update import Batch, Learner, UpdateResult


def update_one(learner: Learner, batch: Batch) -> tuple[UpdateResult, float]:
    """One policy's update of ``batch`` through :func:`update_rows` (its stack's other rows
    idle), and its rollout KL after it, the iteration-cadence controller updated from it: what
    an iteration of a one-policy run computes after its rollout."""
    u = RunUpdate(learner, batch)
    ro, ws = Rollouts(), mlp.Workspace()
    res = update_rows(u.stack, [u], ro, ws)[0]
    if isinstance(res, BaseException):
        raise res
    kl = policy_kls(u.stack, [u], ro, ws)[0]
    u.sched.after_iteration(kl, len(batch))
    return res, kl


def rollout_batch(unit, buf) -> Batch:
    """``buf``'s GAE (as the engine computes it) and the update's batch of it."""
    err = group_gae([(unit.cfg.ppo, buf)])[0]
    if err is not None:
        raise err
    return unit.batch(buf)
