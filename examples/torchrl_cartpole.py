"""Train CartPole-v1 with a TorchRL collector and a klppo loss (the torchrl extra:
``pip install -c constraints.txt -e '.[torchrl]'`` in the clone).

Reads top to bottom in the usual phases: collect (TorchRL's collector on a GymEnv), advantages
(TorchRL's GAE), update (a klppo loss on the TensorDict), controller (for ``--loss klpen``, once
per iteration, outside ``forward``), log. ``--loss clip`` runs TorchRL's own ClipPPOLoss for
comparison; ``--loss klip`` gives the same updates through klppo's per-sample KL template.

    python examples/torchrl_cartpole.py --loss klip --frames 20480
"""

from __future__ import annotations

import argparse
import inspect
import time

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs import GymEnv, RewardSum, TransformedEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from klppo.integrations.torchrl import KLipPPOLoss, KLPENPPOLoss

try:  # TorchRL < 0.14 name; 0.14 calls it Collector
    from torchrl.collectors import SyncDataCollector
except ImportError:
    from torchrl.collectors import Collector as SyncDataCollector


def make_loss(name: str, actor, critic):
    common = dict(entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2")
    if name == "klip":
        return KLipPPOLoss(actor, critic, clip_epsilon=0.2, **common)
    if name == "clip":
        return ClipPPOLoss(actor, critic, clip_epsilon=0.2, **common)
    if name == "klpen":  # beta moved once per iteration, outside forward
        return KLPENPPOLoss(actor, critic, dtarg=0.01, update_beta_in_forward=False, **common)
    raise ValueError(f"loss must be klip, clip or klpen, got {name!r}")


def train(loss: str = "klip", frames: int = 20_480, frames_per_batch: int = 1024,
          epochs: int = 4, minibatch: int = 256, lr: float = 1e-3, seed: int = 0,
          verbose: bool = True) -> list[float]:
    """Train and return the mean return of the episodes that ended in each batch."""
    torch.manual_seed(seed)
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    env.set_seed(seed)
    n_obs, n_act = env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]
    policy_net = nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, n_act))
    actor = ProbabilisticActor(
        TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=OneHotCategorical, spec=env.action_spec,
        return_log_prob=True)
    critic = ValueOperator(nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 1)),
                           in_keys=["observation"])
    loss_module = make_loss(loss, actor, critic)
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True)
    optim = torch.optim.Adam(loss_module.parameters(), lr=lr)
    # the policy needs no env transform; say so (TorchRL 0.14 warns otherwise)
    quiet = ({"auto_register_policy_transforms": False} if "auto_register_policy_transforms"
             in inspect.signature(SyncDataCollector.__init__).parameters else {})
    collector = SyncDataCollector(env, actor, frames_per_batch=frames_per_batch,
                                  total_frames=frames, **quiet)
    returns, start = [], time.perf_counter()
    for i, batch in enumerate(collector):                          # collect
        with torch.no_grad():
            gae(batch)                                             # advantages
        done = batch["next", "done"]
        if done.any():
            returns.append(batch["next", "episode_reward"][done].mean().item())
        data = batch.reshape(-1)
        for _ in range(epochs):                                    # update
            kls = []  # KL(pi_old || pi_new) per minibatch of the last epoch, nats per sample
            for idx in torch.randperm(data.numel()).split(minibatch):
                out = loss_module(data[idx])
                total = sum(v for k, v in out.items() if k.startswith("loss_"))
                optim.zero_grad()
                total.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), 1.0)
                optim.step()
                if "kl" in out.keys():
                    kls.append(out["kl"].mean())
        if kls:                                                    # controller, per iteration
            loss_module.update_beta(torch.stack(kls).mean())
        collector.update_policy_weights_()
        if verbose and returns:                                    # log
            extra = (f"  frac_kill {float(out['frac_kill']):.3f}" if "frac_kill" in out.keys()
                     else f"  beta {float(loss_module.beta):.3g}" if kls else "")
            print(f"batch {i:3d}  frames {(i + 1) * frames_per_batch:6d}  "
                  f"return {returns[-1]:7.1f}{extra}", flush=True)
    collector.shutdown()
    if verbose:
        print(f"{loss}: final return {returns[-1] if returns else float('nan'):.1f} "
              f"({time.perf_counter() - start:.1f} s)")
    return returns


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loss", default="klip", choices=["klip", "clip", "klpen"])
    p.add_argument("--frames", type=int, default=20_480)
    p.add_argument("--frames-per-batch", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    train(a.loss, a.frames, a.frames_per_batch, a.epochs, a.minibatch, a.lr, a.seed)


if __name__ == "__main__":
    main()
