"""The batched engine's torch stack (``fast_path: false``: the step a GPU runs), tested on the CPU:
each run follows its ordinary torch run (the stacked ``baddbmm`` rounds differently from
``addmm`` in the last bits, so to a tolerance, not bit for bit); a run is a function of its seed;
its checkpoint is the ordinary engine's format and resumes there; the group shares one stack
(issue #22)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from klppo import rl
from klppo.rl.batched import train_batched
from klppo.rl.batched.engine import _stack
from klppo.rl.batched.torch_stack import TorchRunStack
from tests.rl.test_batched import CARTPOLE, PENDULUM, checkpoint, config, pendulum, strip

CHECKED = ("loss", "loss_objective", "loss_critic", "kl", "rollout_kl", "approx_kl", "beta",
           "grad_norm", "episode_return")


def torch_runs(make, runs, root, prefix):
    return [make(root / f"{prefix}{i}", fast_path=False, **v) for i, v in enumerate(runs)]


def assert_close(batched, ordinary, iterations, rtol):
    """Per run, the first ``iterations`` iterations' metrics agree to ``rtol`` (an early
    divergence of the floats grows over training, as between any two BLAS builds)."""
    for b, o in zip(batched, ordinary):
        assert b.status == o.status == "finished"
        for mb, mo in list(zip(b.metrics, o.metrics))[:iterations]:
            for k in CHECKED:
                if k in mo and mo[k] is not None and math.isfinite(mo[k]):
                    assert mb[k] == pytest.approx(mo[k], rel=rtol, abs=1e-6), k


def test_the_torch_stack_follows_the_ordinary_torch_runs(tmp_path):
    """Controllers at every cadence, both early stops, an entropy bonus, sampled KL (CartPole),
    and a Gaussian policy with normalisation (Pendulum): the torch stack's runs agree with the
    same runs trained alone with torch."""
    cart = torch_runs(config, CARTPOLE[:4], tmp_path, "cb")
    batched = train_batched(cart)
    ordinary = [rl.train(dataclasses.replace(c, out=str(tmp_path / f"co{i}")))
                for i, c in enumerate(cart)]
    assert_close(batched, ordinary, 4, 1e-5)
    pend = torch_runs(pendulum, PENDULUM, tmp_path, "pb")
    batched = train_batched(pend)
    ordinary = [rl.train(dataclasses.replace(c, out=str(tmp_path / f"po{i}")))
                for i, c in enumerate(pend)]
    assert_close(batched, ordinary, 3, 1e-4)


def test_a_torch_stack_run_is_a_function_of_its_seed_and_its_checkpoint_the_ordinary_format(
        tmp_path):
    runs = torch_runs(config, CARTPOLE[:2], tmp_path, "a")
    first = train_batched(runs)
    again = train_batched([dataclasses.replace(c, out=str(tmp_path / f"b{i}"))
                           for i, c in enumerate(runs)])
    assert [strip(r.metrics) for r in first] == [strip(r.metrics) for r in again]
    ordinary = rl.train(dataclasses.replace(runs[0], out=str(tmp_path / "o")))
    ours, theirs = checkpoint(first[0].run_dir), checkpoint(ordinary.run_dir)
    opt_b, opt_o = ours["optimizer"], theirs["optimizer"]
    assert sorted(opt_b) == sorted(opt_o) and opt_b["t"] == opt_o["t"]
    assert np.allclose(opt_b["m"], opt_o["m"], rtol=1e-3, atol=1e-6)
    # the ordinary engine resumes it: extend the finished run by one iteration
    longer = rl.resume(first[0].run_dir, total_steps=runs[0].total_steps + 512)
    assert longer.status == "finished" and len(longer.metrics) == len(first[0].metrics) + 1


def test_the_group_shares_one_stack_whose_rows_the_networks_view(tmp_path):
    cfgs = torch_runs(config, CARTPOLE[:3], tmp_path, "s")
    stack, ops = _stack(cfgs[0], 3)
    assert isinstance(stack, TorchRunStack) and ops.__name__.endswith("torch_step")
    from klppo.rl.trainer import open_new
    from klppo.runs.threads import compute_threads

    with compute_threads(1) as threads:
        opened = [open_new(c, threads, stack.maker(r, c.ppo), {}) for r, c in enumerate(cfgs)]
    try:
        for r, (tr, _life) in enumerate(opened):
            agent = tr.unit.agent
            flat = torch.cat([p.detach().reshape(-1) for p in agent.parameters()])
            assert torch.equal(flat, stack.W[r])
            next(agent.parameters()).data.add_(1.0)  # a view: the stack sees the change
            assert stack.W[r, 0] == flat[0] + 1.0
    finally:
        for tr, life in opened:
            tr.close()
            life.lock.release()
