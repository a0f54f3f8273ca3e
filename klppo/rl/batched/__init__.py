"""The batched engine: many runs of one environment trained in one process, stacked.

R runs of one env id and one network shape (different seeds, objectives, controllers, learning
rates...) share one stacked policy forward per env step and one stacked minibatch step, while
each keeps its own env, normalisers, RNG streams, loss, controller, Adam state and run directory.
Every run computes the numbers the ordinary engine computes for it, bit for bit
(``tests/rl/test_batched.py``). ``klppo sweep --engine batched`` groups a spec's runs with
:func:`group_key` and trains each group with :func:`train_group`; runs the engine cannot serve
(:func:`refusal`) train in the ordinary engine.
"""

from klppo.rl.batched.engine import BatchedGroup, train_batched, train_group
from klppo.rl.batched.serve import check_group, device_refusal, group_key, refusal

__all__ = ["train_group", "train_batched", "BatchedGroup", "refusal", "device_refusal",
           "group_key", "check_group"]
