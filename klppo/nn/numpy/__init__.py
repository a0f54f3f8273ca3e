"""The numpy fast path as one package: what the engine's numpy stack computes with.

* :mod:`~klppo.nn.numpy.heads` - each action head's log-prob, entropy, KL and backward, once;
* :mod:`~klppo.nn.numpy.mlp` - the tanh-MLP forward and backward, once (one network or a stack);
* :mod:`~klppo.nn.numpy.weights` - the flat weight buffer the torch parameters view, handed to
  the stack and the runner;
* :mod:`~klppo.nn.numpy.adam` - global-norm clip and Adam on a stack of flat rows;
* :mod:`~klppo.nn.numpy.closed_form` - the PPO loss and its per-sample gradient (the core's
  closed forms);
* :mod:`~klppo.nn.numpy.fastpath` - which networks and objectives the fast path serves;
* :mod:`~klppo.nn.numpy.runner` - :class:`NumpyRunner`, the rollout runner.

The minibatch step itself is :meth:`klppo.rl.engine.numpy_stack.NumpyStack.step`.
"""

from klppo.nn.numpy.fastpath import FastPathUnsupported, fast_path_refusal, supports_fast_path
from klppo.nn.numpy.runner import NumpyRunner
from klppo.nn.numpy.weights import FlatWeights, StaleWeights, flat_weights

__all__ = ["NumpyRunner", "FlatWeights", "StaleWeights", "flat_weights",
           "FastPathUnsupported", "fast_path_refusal", "supports_fast_path"]
