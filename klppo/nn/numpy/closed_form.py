"""The PPO loss and its per-sample gradient in closed form, on float32 numpy arrays.

The policy part is the objective's own closed form
(:meth:`klppo.core.objectives.Objective.closed_form`: ``d obj / d logp_new = w A + beta_t``,
minus ``beta dk/dlogp_new`` for a sampled KL estimator, and ``d obj / d KL = -beta`` for the
analytic one), the critic part the value loss's (:func:`klppo.core.values.value_loss_closed_form`)
and the entropy bonus ``-ent_coef H``. The same :class:`~klppo.core.loss.PPOLoss` settings drive
it; ``tests/nn/numpy/test_step.py`` compares it with autograd on ``PPOLoss`` for every objective
and value-loss kind.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from klppo.core.advantages import normalize_advantage
from klppo.core.loss import PPOLoss
from klppo.core.values import value_loss_closed_form

__all__ = ["loss_grads", "mean", "rows_key"]


def mean(x: np.ndarray) -> Any:
    """``float(x.mean())`` for a 1-D float array, bit for bit (numpy sums pairwise, divides in
    double and rounds to the array's type), without ``np.mean``'s Python-level overhead; for
    ``[A, n]`` the ``[A]`` float64 array of each row's."""
    if x.ndim == 1:
        return float(x.dtype.type(float(np.add.reduce(x)) / x.shape[0]))
    return (np.add.reduce(x, -1).astype(np.float64) / x.shape[-1]).astype(x.dtype).astype(
        np.float64)


def rows_key(loss: PPOLoss) -> tuple[Any, ...] | None:
    """What :func:`loss_grads` depends on besides its inputs and ``beta``, when it is
    elementwise numpy (the objective's :meth:`~klppo.core.objective_base.Objective.rowwise_key`):
    rows whose keys are equal are one ``[A, n]`` call. None: this loss runs row by row."""
    key = loss.policy.rowwise_key()
    if key is None:
        return None
    return (key, loss.vf_coef, loss.value_loss_kind, loss.value_clip, loss.ent_coef,
            loss.normalize_advantage)


def loss_grads(loss: PPOLoss, logp, logp_old, adv, value, returns, old_values, entropy, kl,
               beta: Any, weight=None):
    """Loss terms and d loss / d (logp_new, value, entropy, analytic KL) per sample.

    Inputs are float32 ``[n]``; ``weight`` (None: 1) multiplies each sample's objective, as
    ``PPOLoss``'s ``sample_weight`` (the critic and entropy terms are not weighted). Several
    rows with one loss at once: inputs ``[A, n]``, ``beta`` ``[A, 1]``, and each term an
    ``[A]`` array of the rows' (each row's numbers as alone: elementwise operations and
    per-row sums, ``tests/nn/numpy/test_step.py``).
    Returns ``(terms, g_logp, g_value, g_entropy, g_kl, samples)``: the loss terms as floats
    (``loss``, ``loss_objective``, ``loss_critic``, ``loss_entropy`` and ``kl_penalty`` for a
    penalty), gradients of the *loss* (minimised), averaged over the ``n`` samples like
    ``PPOLoss`` (``g_entropy`` / ``g_kl`` are None when the loss does not depend on them), and
    the per-sample quantities the gradient used, for the diagnostics
    (:data:`klppo.core.loss.PER_SAMPLE`: ``ratio``, ``advantage``, ``beta_t`` where the
    objective has one, ``value_loss``, ``value_clipped``).
    """
    n = logp.shape[-1]
    inv_n = np.float32(1.0 / n)
    a = (normalize_advantage(adv, rows=adv.ndim == 2) if loss.normalize_advantage == "minibatch"
         else adv)
    log_w = logp - logp_old
    w = np.exp(log_w)
    form = loss.policy.closed_form(w, a, w * a, logp, log_w, kl, beta)
    terms: dict[str, float] = {}
    if form.penalty is not None:
        terms["kl_penalty"] = mean(form.penalty)
    value_obj, d_logp, d_kl = form.value, form.d_logp, form.d_kl
    if weight is not None:
        value_obj, d_logp = weight * value_obj, weight * d_logp
        d_kl = None if d_kl is None else weight * d_kl
    g_logp = (-inv_n * d_logp).astype(np.float32)
    g_kl = None if d_kl is None else -inv_n * d_kl
    v_loss, g_v, v_clipped = value_loss_closed_form(value, returns, old_values, loss.value_clip,
                                         loss.value_loss_kind)
    g_val = (np.float32(loss.vf_coef) * inv_n * g_v).astype(np.float32)
    # no entropy bonus: no entropy gradient (adding its zeros would change nothing)
    g_ent = (np.full(logp.shape, -np.float32(loss.ent_coef) * inv_n, np.float32)
             if loss.ent_coef else None)
    loss_obj = -mean(value_obj)
    loss_critic = loss.vf_coef * mean(v_loss)
    loss_ent = -loss.ent_coef * mean(entropy)
    terms.update(loss_objective=loss_obj, loss_critic=loss_critic, loss_entropy=loss_ent,
                 loss=loss_obj + loss_critic + loss_ent)
    samples = {"ratio": w, "advantage": a, "value_loss": v_loss, "value_clipped": v_clipped}
    if form.beta_t is not None:
        samples["beta_t"] = form.beta_t
    return terms, g_logp, g_val, g_ent, g_kl, samples
