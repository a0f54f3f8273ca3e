"""The numpy fast path as one package: the step backend, the rollout runner and what they share.

* :mod:`~klppo.nn.numpy.heads` - each action head's log-prob, entropy, KL and backward, once;
* :mod:`~klppo.nn.numpy.mlp` - the tanh-MLP forward and backward, once;
* :mod:`~klppo.nn.numpy.weights` - the flat weight buffer the torch parameters view, handed to
  the step and the runner;
* :mod:`~klppo.nn.numpy.adam` - global-norm clip and Adam on the flat buffers;
* :mod:`~klppo.nn.numpy.closed_form` - the PPO loss and its per-sample gradient (the core's
  closed forms);
* :mod:`~klppo.nn.numpy.step` - :class:`NumpyStep`, the step backend (``klppo.nn.step``'s
  contract);
* :mod:`~klppo.nn.numpy.runner` - :class:`NumpyRunner`, the rollout runner.
"""

from klppo.nn.numpy.runner import NumpyRunner
from klppo.nn.numpy.step import (
    FastPathUnsupported,
    NumpyStep,
    fast_path_refusal,
    supports_fast_path,
)
from klppo.nn.numpy.weights import FlatWeights, StaleWeights, flat_weights

__all__ = ["NumpyStep", "NumpyRunner", "FlatWeights", "StaleWeights", "flat_weights",
           "FastPathUnsupported", "fast_path_refusal", "supports_fast_path"]
