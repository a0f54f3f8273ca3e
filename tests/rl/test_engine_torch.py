"""The engine's torch stack (``fast_path: false``, a shared trunk, or a GPU), tested on the CPU:
its step equals plain autograd on the network and torch's Adam (to float rounding: the stacked
``baddbmm`` rounds otherwise than ``nn.Linear``'s ``addmm``; ``tests/rl/test_update_loop.py``
holds a whole update to the numpy stack's), a run is a function of its seed and does not depend
on its group, its checkpoint holds its own weights and resumes exactly after SIGKILL (issues #22,
#29)."""

import copy
import dataclasses
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from klppo import rl
from klppo.core.loss import PPOLoss
from klppo.nn import ActorCritic, CategoricalHead, DiagGaussianHead
from klppo.rl.engine.groups import StackSet
from klppo.rl.engine.rundirs import train_batched, train_group
from klppo.rl.engine.torch_stack import TorchStack
from tests.nn.numpy.test_step import make_batches, reference_steps
from tests.rl.test_engine import (
    CARTPOLE,
    ROOT,
    checkpoint,
    config,
    same_state,
    strip,
)
from tests.rows import OneRow
from tests.waiting import wait_for_lines

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


@pytest.mark.parametrize("net", [{}, {"shared_trunk": True},
                                 {"shared_trunk": True, "separate_losses": True}],
                         ids=["separate", "trunk", "trunk-separate-losses"])
@pytest.mark.parametrize("head", ["categorical", "gaussian"])
@pytest.mark.parametrize("objective, opts", [("clip", {"ent_coef": 0.01}),
                                             ("kl_penalty", {"kl_estimator": "k3"}),
                                             ("sapo", {})])
def test_the_torch_step_equals_autograd_and_adam(head, objective, opts, net):
    """A whole torch-stack step (stacked forward, each row's head and PPOLoss, one backward,
    the stacked clip and Adam) equals autograd on the network and torch.optim.Adam."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    h = CategoricalHead(3) if head == "categorical" else DiagGaussianHead(2)
    agent = ActorCritic(5, h, log_std_init=-0.3, **net)
    ref = copy.deepcopy(agent)
    loss = PPOLoss(objective, **opts)
    batches = make_batches(agent, h, rng, count=4, n=64, obs_dim=5)
    reference_steps(ref, loss, batches, beta=0.7)
    step = OneRow(agent, loss, library="torch")
    for b in batches:
        step.step_arrays(*b, 0.7)
    for (name, p), q in zip(agent.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=2e-6, rtol=1e-5), name


def test_a_torch_stack_run_is_a_function_of_its_seed_and_its_checkpoint_the_numpy_format(
        tmp_path):
    runs = torch_runs(config, CARTPOLE[:2], tmp_path, "a")
    first = train_batched(runs)
    again = train_batched([dataclasses.replace(c, out=str(tmp_path / f"b{i}"))
                           for i, c in enumerate(runs)])
    assert [strip(r.metrics) for r in first] == [strip(r.metrics) for r in again]
    on_numpy = rl.train(dataclasses.replace(runs[0], out=str(tmp_path / "o"), fast_path=True))
    ours, theirs = checkpoint(first[0].run_dir), checkpoint(on_numpy.run_dir)
    opt_b, opt_o = ours["optimizer"], theirs["optimizer"]
    assert sorted(opt_b) == sorted(opt_o) and opt_b["t"] == opt_o["t"]
    # a run alone resumes it: extend the finished run by one iteration
    longer = rl.resume(first[0].run_dir, total_steps=runs[0].total_steps + 512)
    assert longer.status == "finished" and len(longer.metrics) == len(first[0].metrics) + 1


def test_the_group_shares_one_stack_whose_rows_the_networks_view(tmp_path):
    cfgs = torch_runs(config, CARTPOLE[:3], tmp_path, "s")
    stacks = StackSet.of(cfgs)
    (stack,) = stacks.stacks.values()
    assert isinstance(stack, TorchStack) and stack.R == 3
    from klppo.rl.trainer import open_new
    from klppo.runs.threads import compute_threads

    with compute_threads(1) as threads:
        opened = [open_new(c, threads, lambda n, x, r=r: stacks.maker(r, n, x), {})
                  for r, c in enumerate(cfgs)]
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


def test_sigkill_then_resume_of_a_torch_group_is_exact(tmp_path):
    """A torch-stack group killed mid-run resumes (the same group) with the metrics and
    checkpoint of an uninterrupted run."""
    seeds = [0, 1]
    full = train_batched([config(tmp_path / f"full{s}", seed=s, objective="kl_penalty",
                                 steps=4096, checkpoint_every=2, fast_path=False)
                          for s in seeds])
    dirs = [tmp_path / f"killed{s}" for s in seeds]
    code = f"""
import dataclasses, klppo.rl as rl
from klppo.rl.engine.rundirs import train_batched, train_group
def c(out, s):
    x = rl.preset("klip/cartpole")
    return dataclasses.replace(x, out=out, seed=s, objective="kl_penalty", total_steps=4096,
                               tensorboard=False, checkpoint_every=2, fast_path=False)
train_batched([c(d, s) for d, s in zip({[str(d) for d in dirs]!r}, {seeds!r})])
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    wait_for_lines(dirs[0] / "metrics.jsonl", 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= len((dirs[0] / "metrics.jsonl").read_text().splitlines()) < 8
    for r, f in zip(train_group(dirs), full):
        assert r.status == "finished" and strip(r.metrics) == strip(f.metrics)
        same_state(checkpoint(r.run_dir), checkpoint(f.run_dir))


def test_a_torch_runs_numbers_do_not_depend_on_its_group(tmp_path):
    """Same seed, same metrics, alone or beside others (on the CPU: a run stepping alone is
    padded, since bmm's backward for a batch of one rounds otherwise)."""
    seen = []
    for g, seeds in enumerate([[0], [0, 1], [2, 0, 1]]):
        res = train_batched([config(tmp_path / f"g{g}s{s}", seed=s, steps=1536,
                                    fast_path=False) for s in seeds])
        seen.append(strip(res[seeds.index(0)].metrics))
    assert seen[0] == seen[1] == seen[2]


def test_a_torch_runs_checkpoint_holds_its_own_weights_only(tmp_path):
    """The parameters view one stack of every run's weights; the checkpoint must not carry the
    whole stack (torch.save writes a view's storage)."""
    res = train_batched(torch_runs(config, CARTPOLE[:3], tmp_path, "c"))
    own = sum(t.numel() for t in checkpoint(res[0].run_dir)["agent"].values())
    for t in checkpoint(res[0].run_dir)["agent"].values():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    assert (res[0].run_dir / "checkpoint.pt").stat().st_size < 4 * own * 4 + 200_000


def test_read_only_arrays_reach_the_device_without_a_warning():
    # rollout arrays and row indices can be read-only views (seen on CUDA as PyTorch's
    # "non-writable tensors" warning); the stack copies them instead
    import warnings

    from klppo.rl.engine.torch_stack import _dev

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    x.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = _dev(x, torch.device("cpu"))
    assert t.tolist() == x.tolist()
    t += 1  # a copy: the read-only array is untouched
    assert x[0, 0] == 0


def failing_torch_group(tmp_path, seeds=(0, 1, 2)):
    env = "tests.rl.envs_for_tests:KlppoTest/NaNForSeedWide-v0"
    cfgs = [config(tmp_path / f"r{s}", env=env, seed=s, steps=1024, fast_path=False,
                   rollout=dict(num_envs=1, num_steps=128, vectorization="sync"))
            for s in seeds]
    return cfgs, train_batched(cfgs)


def test_a_torch_groups_runs_go_on_when_one_fails(tmp_path):
    """Run 1's env fails at iteration 3: runs 0 and 2 keep collecting as a subset of the stack's
    rows (their draws reach the CPU together) and finish with the numbers they have in the same
    rows of a group where no run fails (seed 3 in row 1)."""
    _, res = failing_torch_group(tmp_path / "a")
    assert [r.status for r in res] == ["finished", "failed", "finished"]
    assert [len(r.metrics) for r in res] == [8, 2, 8]
    _, whole = failing_torch_group(tmp_path / "b", seeds=(0, 3, 2))
    for i in (0, 2):
        assert strip(res[i].metrics) == strip(whole[i].metrics)


def test_a_torch_groups_surviving_runs_equal_their_runs_alone(tmp_path):
    cfgs, res = failing_torch_group(tmp_path)
    for i in (0, 2):
        alone = rl.train(dataclasses.replace(cfgs[i], out=str(tmp_path / f"alone{i}")))
        assert strip(res[i].metrics) == strip(alone.metrics)


def test_a_torch_run_on_a_truncating_env_equals_itself_alone(tmp_path):
    """Pendulum truncates every episode at 200 steps: the values bootstrapped there and the
    rollout KL after the update (a single row's forward, padded as the step pads it) must not
    depend on the run's row or on how many rows are computed beside it (seed 1 in row 1)."""
    def pendulum(out, seed):
        return config(out, preset="klip/hopper", env="Pendulum-v1", seed=seed, steps=4096,
                      fast_path=False)
    alone = train_batched([pendulum(tmp_path / "alone", 1)])[0]
    group = train_batched([pendulum(tmp_path / f"g{s}", s) for s in (0, 1, 2)])
    assert strip(alone.metrics) == strip(group[1].metrics)


def test_a_torch_run_with_one_env_does_not_depend_on_its_row(tmp_path):
    """One env per run: the collection's forward with one observation per row (torch's
    matrix-vector kernel rounds by the weights' place in memory); seed 1 in rows 0, 1 and 2."""
    seen = []
    for g, seeds in enumerate([[1], [0, 1], [2, 0, 1]]):
        res = train_batched([config(tmp_path / f"g{g}s{s}", seed=s, steps=512, fast_path=False,
                                    rollout=dict(num_envs=1, num_steps=128))
                             for s in seeds])
        seen.append(strip(res[seeds.index(1)].metrics))
    assert seen[0] == seen[1] == seen[2]


def test_a_torch_steps_results_reach_the_cpu_once_per_quantity_not_per_row(monkeypatch):
    """Three rows' step outputs: one transfer per quantity (a device sync each on a GPU),
    whatever the number of rows; each row gets its own numbers, names and dtypes (a term only
    some rows have stays theirs)."""
    from klppo.rl.engine import torch_stack

    moved = []
    real = torch_stack._cpu
    monkeypatch.setattr(torch_stack, "_cpu", lambda t: moved.append(t.shape) or real(t))
    n, A = 5, 3
    g = torch.Generator().manual_seed(0)
    outs = [(torch.randn(n, generator=g), torch.randn(n, generator=g),
             torch.randn(n, generator=g), torch.randn(n, generator=g),
             {"loss": torch.tensor(float(a)), "per_sample/ratio": torch.randn(n, generator=g),
              **({"kl_penalty": torch.tensor(7.0)} if a == 1 else {}),
              "per_sample/value_clipped": torch.arange(n) % 2 == a % 2})
            for a in range(A)]
    adv, norms = torch.randn(A, n, generator=g), torch.tensor([1.0, 2.0, 3.0])
    idx = np.arange(A * n).reshape(A, n)
    res = torch_stack._results(idx, adv, norms, outs)
    assert len(moved) == 4 + 2 + 2 + 2  # logp values entropy kl, adv norms, 2 terms, 2 samples
    for a, r in enumerate(res):
        for got, want in zip((r.logp, r.values, r.entropy, r.kl), outs[a][:4]):
            assert torch.equal(got, want)
        assert torch.equal(r.adv, adv[a]) and float(r.grad_norm) == a + 1.0
        assert r.idx.tolist() == idx[a].tolist()
        assert list(r.terms) == (["loss", "kl_penalty"] if a == 1 else ["loss"])
        assert r.samples["value_clipped"].dtype == torch.bool
        assert torch.equal(r.samples["value_clipped"], outs[a][4]["per_sample/value_clipped"])


@pytest.mark.parametrize("failing", [False, True], ids=["all-rows", "a-row-fails"])
def test_records_kept_on_the_device_until_the_rollout_ends_change_no_number(
        tmp_path, monkeypatch, failing):
    """On a GPU the torch stack keeps each step's log-probs, distribution parameters and values
    on the device and sends them to the CPU once per rollout; that path, run here on the CPU,
    gives every run the numbers of the default one (views of the buffers), with every row live
    and with a subset of rows still collecting after one run's env failed."""
    from klppo.rl.engine import records

    def group(root):
        if failing:
            return failing_torch_group(root)[1]
        return train_batched([config(root / f"r{s}", seed=s, steps=1024, fast_path=False,
                                     rollout=dict(num_envs=2, num_steps=128))
                              for s in (0, 1)])

    default = group(tmp_path / "views")
    monkeypatch.setattr(records, "APART_ON_CPU", True)
    apart = group(tmp_path / "apart")
    assert [r.status for r in apart] == [r.status for r in default]
    for a, d in zip(apart, default):
        assert strip(a.metrics) == strip(d.metrics) and a.metrics


def test_a_torch_familys_rows_step_as_one_and_each_equals_itself_alone(tmp_path, monkeypatch):
    """Rows with one loss setting compute their heads and losses as one ``[F, n]`` call
    (``PPOLoss(rows=True)``), each with its own beta (fixed ones and an adaptive one); each run
    of the group equals itself alone (beta 0.3 in row 1, the adaptive beta in row 2)."""
    from klppo.rl.engine import torch_stack

    sizes: list[tuple[int, ...]] = []
    real = torch_stack.loss_families
    monkeypatch.setattr(torch_stack, "loss_families",
                        lambda *a: sizes.append(tuple(map(len, real(*a)))) or real(*a))

    def run(out, seed, beta, controller="fixed"):
        return config(out, seed=seed, steps=2048, fast_path=False, objective="kl_penalty",
                      ppo=dict(kl_estimator="k3"),
                      kl=dict(controller=controller, beta=beta, target=0.001,
                              cadence="minibatch", measure="last_minibatch"))
    group = train_batched([run(tmp_path / "g0", 0, 0.1), run(tmp_path / "g1", 1, 0.3),
                           run(tmp_path / "g2", 2, 0.1, "proportional"),
                           run(tmp_path / "g3", 3, 0.1)])
    assert set(sizes) == {(4,)}
    betas = {m["beta"] for m in group[2].metrics}
    assert len(betas) > 1  # the adaptive row's beta moved
    for i, alone in ((1, run(tmp_path / "a1", 1, 0.3)),
                     (2, run(tmp_path / "a2", 2, 0.1, "proportional"))):
        assert strip(group[i].metrics) == strip(train_batched([alone])[0].metrics)
