"""Bridges from klppo's core to other ecosystems; each lives behind an optional extra.

* :mod:`klppo.integrations.torchrl` (the torchrl extra): drop-in replacements for
  TorchRL's ``KLPENPPOLoss`` and ``ClipPPOLoss`` whose KL penalty, beta controller and
  per-sample KL template come from :mod:`klppo.core`.
* :mod:`klppo.integrations.trl` (the trl extra): a ``TrainerCallback`` that drives
  the KL coefficient of TRL's ``GRPOTrainer`` / ``RLOOTrainer`` from a klppo controller.

This package imports only ``klppo.core`` and ``klppo.nn`` (see ``tests/test_layers.py``);
importing it does not import any third-party ecosystem (each subpackage imports its own).
"""
