"""THE training engine: one engine whose unit is a group of R runs (R = 1 is ``klppo train``).

Every policy of every run is a row of a stack of networks of one shape, numpy
(:mod:`~klppo.rl.engine.numpy_stack`) or torch on any device (:mod:`~klppo.rl.engine.torch_stack`):
one minibatch step and one Adam per array library, each over the leading row axis. A group
(:mod:`~klppo.rl.engine.group`) computes one iteration of its runs: lock-step collection
(:mod:`~klppo.rl.engine.collect`), the one PPO update loop (:mod:`~klppo.rl.engine.learn`), the
rollout KLs and controllers. Which policies share a stack and which runs a group is
:mod:`~klppo.rl.engine.groups`; training groups of run directories is
:mod:`~klppo.rl.engine.rundirs` (``klppo.rl.train_group``, ``klppo.rl.train_batched``). A run's
numbers do not depend on its group or on R (``tests/rl/test_engine.py``).
"""

from klppo.rl.engine.group import Group
from klppo.rl.engine.groups import StackKey, StackSet, check_group, group_key, stack_keys

# klppo.rl.engine.rundirs (train_group, train_batched) sits above klppo.rl.trainer, which builds
# a run alone on this package: import it from there, or from klppo.rl

__all__ = ["Group", "StackKey", "StackSet", "check_group", "group_key", "stack_keys"]
