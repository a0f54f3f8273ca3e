"""A policy alone as a stack of one row, stepped from plain arrays (what tests of one step,
one Adam and the probes need of the engine's stacks)."""

import numpy as np

from klppo.nn.numpy import mlp
from klppo.rl.config import PPOConfig
from klppo.rl.engine.numpy_stack import NumpyStack
from klppo.rl.engine.rows import Minibatch
from klppo.rl.engine.torch_stack import TorchStack


class OneRow:
    """``agent`` and ``loss`` in row 0 of a one-row numpy or torch stack."""

    def __init__(self, agent, loss, lr=3e-4, eps=1e-5, max_norm=0.5, library="numpy",
                 device="cpu"):
        self.stack = NumpyStack(1) if library == "numpy" else TorchStack(1, device)
        ppo = PPOConfig(lr=lr, adam_eps=eps, max_grad_norm=max_norm)
        self.slot = self.stack.maker(0, ppo)(agent, loss)
        self.loss, self.ws = loss, mlp.Workspace()

    def step_arrays(self, obs, actions, old_params, logp_old, adv, returns, old_values, beta):
        n = len(obs)
        mb = Minibatch(np.arange(n)[None], *(np.asarray(x)[None] for x in (
            obs, actions, old_params, logp_old, adv, returns, old_values)))
        return self.stack.step(np.array([0]), mb, [self.loss], [beta], self.ws)[0]

    def policy_kl_arrays(self, obs, old_params):
        return self.stack.policy_kl(np.array([0]), np.asarray(obs)[None],
                                    np.asarray(old_params)[None], self.ws)[0]
