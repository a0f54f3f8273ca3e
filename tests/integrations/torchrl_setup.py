"""Small TorchRL actors, critics and batches shared by the TorchRL integration tests.

Import only after ``pytest.importorskip("torchrl")``.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import IndependentNormal, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.modules.distributions import TruncatedNormal

OBS, ACT = 4, 2
#: distribution kinds: Categorical (discrete), Normal, TanhNormal (closed-form KL through the
#: tanh), TruncatedNormal (no closed-form KL: TorchRL samples it)
KINDS = ("categorical", "normal", "tanh_normal", "truncated_normal")


def make_actor_critic(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "categorical":
        net = nn.Sequential(nn.Linear(OBS, 16), nn.Tanh(), nn.Linear(16, 3))
        module = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
        actor = ProbabilisticActor(module, in_keys=["logits"],
                                   distribution_class=torch.distributions.Categorical,
                                   return_log_prob=True)
    else:
        net = nn.Sequential(nn.Linear(OBS, 16), nn.Tanh(), nn.Linear(16, 2 * ACT),
                            NormalParamExtractor())
        module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
        dist = {"normal": IndependentNormal, "tanh_normal": TanhNormal,
                "truncated_normal": TruncatedNormal}[kind]
        actor = ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=dist,
                                   return_log_prob=True, spec=Bounded(-1.0, 1.0, (ACT,)))
    critic = ValueOperator(nn.Sequential(nn.Linear(OBS, 16), nn.Tanh(), nn.Linear(16, 1)),
                           in_keys=["observation"])
    return actor, critic


def collect(actor, critic, n: int, seed: int) -> TensorDict:
    """A batch as a collector plus GAE would leave it: actions, their log-probs and the
    distribution's parameters under the current policy, values, advantages, targets."""
    g = torch.Generator().manual_seed(seed)
    td = TensorDict({"observation": torch.randn(n, OBS, generator=g)}, [n])
    torch.manual_seed(seed)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        actor(td)
        critic(td)
    td["advantage"] = torch.randn(n, 1, generator=g)
    td["value_target"] = td["state_value"] + torch.randn(n, 1, generator=g)
    return td


def perturb(module: nn.Module, scale: float, seed: int) -> None:
    """Move the parameters away from the behaviour policy (ratios spread, some get clipped)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def twins(kind: str, seed: int = 0):
    """Two identical (actor, critic) pairs with separate parameters."""
    actor, critic = make_actor_critic(kind, seed)
    return (actor, critic), (copy.deepcopy(actor), copy.deepcopy(critic))


def total(out: TensorDict) -> torch.Tensor:
    return sum(v.sum() for k, v in out.items() if k.startswith("loss_"))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()
