"""The base of every PPO objective: its settings (band, shape, catalogue knobs) and its contract.

An :class:`Objective` is, per sample, a value to maximise whose gradient is ``c_t grad logp_new``
with ``c_t`` detached: the KLip-PPO template ``w A + beta_t logp_new`` with
``beta_t = c_t - w A``. It says so once:

* :meth:`Objective.term` - the per-sample value in torch, differentiable (what
  :class:`~klppo.core.loss.PPOLoss` and autograd use), with ``beta_t``;
* :meth:`Objective.closed_form` - the value and ``d value / d logp_new`` (``= w A + beta_t``)
  on float32 numpy arrays, what the numpy fast path runs; :class:`NoClosedForm` where there is
  none, and the fast path then refuses the objective;
* class facts read by configs: ``uses_beta`` (a controller's beta), ``penalised`` (its
  ``kl_estimator`` matters), ``shaped`` (its beta_t ``shape`` matters), ``band_knobs`` (which of
  ``eps_low``, ``eps_high``, ``dual_clip`` it reads), ``knobs`` (which :class:`Knobs` it reads,
  with the defaults it uses) and ``level`` (``token``, or ``sequence``: it needs to know which
  tokens form one sequence, so only the language-model loop can run it) and
  ``needs_probabilities`` (it reads ``exp(logp)`` as a probability: discrete actions only).

This module uses numpy as well as torch (the closed forms run on numpy arrays).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch

from klppo.core.band import DEFAULT_EPS, band_edges, kill_mask
from klppo.core.kl import ESTIMATOR_GRADS, ESTIMATORS, Estimator, sampled_kl
from klppo.core.surrogates import SHAPES, ShapeLike, per_sample_beta

__all__ = ["Band", "ShapeSpec", "Knobs", "PolicyTerm", "ClosedForm", "NoClosedForm",
           "Objective", "TemplateObjective", "KL_ESTIMATOR_CHOICES", "BAND_KNOBS", "KNOB_NAMES",
           "numpy_views"]

#: what a penalty objective may use as its per-sample KL(pi_old || pi_new)
KL_ESTIMATOR_CHOICES: tuple[str, ...] = ("analytic", *ESTIMATORS)

#: the band settings beyond ``eps`` that an objective may read (``band_knobs``)
BAND_KNOBS: tuple[str, ...] = ("eps_low", "eps_high", "dual_clip")


@dataclass(frozen=True)
class Band:
    """The trust band ``[1 - lo, 1 + hi]`` of the ratio, and the dual clip ``c > 1`` (or None).

    ``eps`` is the symmetric radius; ``eps_low`` / ``eps_high`` override one side (DAPO: 0.2 /
    0.28). Radii may be floats or per-sample tensors (position-aware clipping)."""

    eps: Any = DEFAULT_EPS
    eps_low: Any = None
    eps_high: Any = None
    dual_clip: float | None = None

    @property
    def lo(self) -> Any:
        return self.eps if self.eps_low is None else self.eps_low

    @property
    def hi(self) -> Any:
        return self.eps if self.eps_high is None else self.eps_high

    @property
    def is_scalar(self) -> bool:
        T = torch.Tensor  # (no generator: this is read per row on every minibatch step)
        return not (isinstance(self.eps, T) or isinstance(self.eps_low, T)
                    or isinstance(self.eps_high, T))


@dataclass(frozen=True)
class ShapeSpec:
    """A beta_t shape of the per-sample template and its softness (see
    :mod:`klppo.core.surrogates`): a name of :data:`~klppo.core.surrogates.SHAPES` or a callable
    ``(ratio, advantage) -> beta_t``."""

    name: ShapeLike = "clip"
    softness: Any = None
    softness_low: Any = None
    softness_high: Any = None


@dataclass(frozen=True)
class Knobs:
    """The catalogue objectives' own settings; None means the objective's default (its paper's
    where the paper states one; see each objective's ``knobs``). Setting one that the objective
    does not read raises ValueError.

    ``tau_pos`` / ``tau_neg``: SAPO's gate temperatures for ``A > 0`` / ``A < 0``; ``tau``: the
    squared log-ratio coefficient; ``delta``: a divergence threshold (DPPO's TV or binary KL,
    trust-region masking's max token KL, nats or probability); ``cov_fraction``: the share of
    tokens Clip-Cov / KL-Cov select; ``cov_low`` / ``cov_high``: Clip-Cov's covariance window;
    ``kl_cov_coef``: KL-Cov's penalty coefficient."""

    tau_pos: float | None = None
    tau_neg: float | None = None
    tau: float | None = None
    delta: float | None = None
    cov_fraction: float | None = None
    cov_low: float | None = None
    cov_high: float | None = None
    kl_cov_coef: float | None = None

    def given(self) -> dict[str, float]:
        """The knobs that are set (not None)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


#: the Knobs fields, in order
KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))


@dataclass(frozen=True)
class PolicyTerm:
    """An objective's torch output: per-sample values to maximise, beta_t where defined (and
    asked for), and the per-sample KL the penalty used."""

    objective: torch.Tensor
    beta_t: torch.Tensor | None
    kl: torch.Tensor | None


@dataclass
class ClosedForm:
    """An objective in closed form on numpy arrays (per sample): ``value`` to maximise,
    ``d_logp`` = d value / d logp_new, ``d_kl`` = d value / d analytic KL (None when the
    analytic KL is not used), ``penalty`` (the per-sample KL the penalty used, or None) and
    ``beta_t`` (the detached per-sample coefficient, None where the objective has none)."""

    value: np.ndarray
    d_logp: np.ndarray
    d_kl: np.ndarray | None
    penalty: np.ndarray | None
    beta_t: np.ndarray | None = None


class NoClosedForm(NotImplementedError):
    """The objective has no closed-form derivative: the numpy fast path cannot serve it."""


def numpy_views(*arrays: Any) -> list[torch.Tensor]:
    """Zero-copy torch views of float32 numpy arrays (contiguous copies where they are not), so
    a closed form can run the core's own torch definition instead of a second one."""
    return [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)) for x in arrays]


def _clip_beta_np(w: np.ndarray, a: np.ndarray, wa: np.ndarray, band: Band) -> np.ndarray:
    """The clip shape's beta_t (``-w A`` on the kill set, else 0) on numpy arrays; equal bit for
    bit to :func:`~klppo.core.surrogates.per_sample_beta` (edges compared in float32 by both)."""
    kill = kill_mask(w, a, band.lo, band.hi)
    if band.dual_clip is not None:
        kill |= (a < 0) & (w > band.dual_clip)
    return np.where(kill, -wa, np.float32(0))


_CLIP = ShapeSpec("clip")
#: the default settings, as shared immutable values (for argument defaults elsewhere)
DEFAULT_BAND, DEFAULT_SHAPE, NO_KNOBS = Band(), ShapeSpec(), Knobs()


class Objective:
    """Base of the PPO objectives; see the module docstring. Subclasses set ``name`` and the
    class facts, implement :meth:`term` and, where they can, :meth:`closed_form`."""

    name: ClassVar[str] = ""
    uses_beta: ClassVar[bool] = False
    penalised: ClassVar[bool] = False  # subtracts beta * KL (so its kl_estimator matters)
    shaped: ClassVar[bool] = False  # its beta_t follows ``shape`` (so the shape matters)
    band_knobs: ClassVar[tuple[str, ...]] = BAND_KNOBS  # which of eps_low/high, dual_clip
    knobs: ClassVar[dict[str, float | None]] = {}  # Knobs it reads -> its default
    level: ClassVar[Literal["token", "sequence"]] = "token"
    needs_probabilities: ClassVar[bool] = False  # reads exp(logp) as a probability
    # its ratio is to the policy that sampled the data (off-policy REINFORCE), not to the
    # policy before the update, where the two differ (stale or lower-precision samplers)
    ratio_to_sampler: ClassVar[bool] = False
    #: the unit of the divergence its controller measures (a KL unless the objective says not)
    penalty_unit: ClassVar[str] = "nats per sample"

    def __init__(self, band: Band = Band(), shape: ShapeSpec = ShapeSpec(),
                 kl_estimator: str = "analytic", knobs: Knobs = Knobs()) -> None:
        if kl_estimator not in KL_ESTIMATOR_CHOICES:
            raise ValueError(f"kl_estimator must be one of {list(KL_ESTIMATOR_CHOICES)}, got "
                             f"kl_estimator={kl_estimator!r}")
        if not callable(shape.name) and shape.name not in SHAPES:
            raise ValueError(f"shape must be one of {list(SHAPES)}, got shape={shape.name!r}")
        for k, v in knobs.given().items():
            if k not in self.knobs:
                raise ValueError(f"objective {self.name!r} does not read {k} (got {k}={v!r})")
        if self.band_knobs:
            band_edges(band.eps, band.eps_low, band.eps_high)  # ValueError naming a bad radius
        self.band, self.shape, self.kl_estimator = band, shape, kl_estimator
        self.settings = {**self.knobs, **knobs.given()}
        self._check_knobs()

    @property
    def clipped(self) -> bool:
        """True when the objective reads a clip band (eps_low, eps_high or the dual clip)."""
        return bool(self.band_knobs)

    def _check_knobs(self) -> None:
        """Validate the settings (subclasses with knobs add their own checks)."""
        for k, v in self.settings.items():
            if v is not None and not (float(v) > 0 and np.isfinite(float(v))) \
                    and k not in ("cov_low", "cov_high"):
                raise ValueError(f"objective {self.name!r}: {k} must be finite and > 0, "
                                 f"got {k}={v!r}")

    def knob(self, name: str) -> float:
        """The value of a knob this objective reads (set, or its default)."""
        return float(cast(float, self.settings[name]))

    @property
    def needs_kl(self) -> bool:
        """True when the caller must pass the analytic per-state KL(pi_old || pi_new)."""
        return self.penalised and self.kl_estimator == "analytic"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.band}, {self.shape}, {self.kl_estimator!r})"

    # ------------------------------------------------------------------ torch
    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True) -> PolicyTerm:
        """Per-sample values (with gradient), beta_t (detached) and the penalty's KL."""
        raise NotImplementedError

    def beta_t(self, ratio: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor | None:
        """Detached per-sample beta_t of the template form where it follows from ``(w, A)``
        alone, or None (:meth:`term` returns it for every objective that has one)."""
        return None

    def _shape_beta(self, ratio, advantage, shape: ShapeSpec) -> torch.Tensor:
        b = self.band
        return per_sample_beta(ratio, advantage, b.eps, shape.name, shape.softness, b.eps_low,
                               b.eps_high, shape.softness_low, shape.softness_high, b.dual_clip)

    def _penalty_kl(self, logp_new, logp_old, kl) -> torch.Tensor:
        if self.kl_estimator == "analytic":
            if kl is None:
                raise ValueError(
                    f"objective {self.name!r} with kl_estimator='analytic' needs kl= (the "
                    "per-state analytic KL(pi_old || pi_new)); pass it or choose a sampled "
                    "estimator")
            return kl
        return sampled_kl(logp_old, logp_new, cast(Estimator, self.kl_estimator))

    # ------------------------------------------------------------------ numpy
    def closed_form(self, w, a, wa, logp, log_w, kl, beta: float, logp_old=None) -> ClosedForm:
        """Value and derivatives on float32 arrays: ``w`` ratio, ``a`` advantage, ``wa = w a``,
        ``logp`` = logp_new, ``log_w`` = logp_new - logp_old, ``kl`` the analytic KL,
        ``logp_old`` (None: ``logp - log_w``)."""
        raise NoClosedForm(f"objective {self.name!r} has no closed-form derivative")

    @property
    def has_closed_form(self) -> bool:
        return type(self).closed_form is not Objective.closed_form

    def rowwise_key(self) -> tuple[Any, ...] | None:
        """What this objective's numpy closed form depends on besides ``beta``, when that form
        is elementwise numpy (each sample's numbers from its own inputs alone): rows of a stack
        whose keys are equal compute it as one ``[A, n]`` call with a per-row ``beta``. None
        (the default) when it is not, or uses torch: such rows compute it one at a time."""
        return None

    def _band_key(self) -> tuple[Any, ...] | None:
        b = self.band
        return (b.lo, b.hi, b.dual_clip) if b.is_scalar else None

    def _shape_beta_np(self, w, a, wa, shape: ShapeSpec) -> np.ndarray:
        if shape.name == "clip" and self.band.is_scalar:
            return _clip_beta_np(w, a, wa, self.band)
        with torch.no_grad():  # the core's shapes, on zero-copy views
            return self._shape_beta(torch.from_numpy(w), torch.from_numpy(np.asarray(a)),
                                    shape).numpy()

    def _clip_value_np(self, w, a, wa) -> np.ndarray:
        lo, hi = self.band.lo, self.band.hi
        value = np.minimum(wa, np.minimum(np.maximum(w, 1 - lo), 1 + hi) * a)
        if self.band.dual_clip is not None:
            value = np.where(a < 0, np.maximum(value, self.band.dual_clip * a), value)
        return value

    def _penalise_np(self, form: ClosedForm, log_w, kl, beta: float) -> ClosedForm:
        """Subtract ``beta * KL`` from a closed form (analytic or sampled estimator)."""
        b = np.float32(beta)
        if self.kl_estimator == "analytic":
            pen = kl
            form.d_kl = np.full(kl.shape, -b, np.float32)
        else:
            pen = ESTIMATORS[self.kl_estimator](log_w)
            form.d_logp = form.d_logp - b * ESTIMATOR_GRADS[self.kl_estimator](log_w)
        form.value, form.penalty = form.value - b * pen, pen
        return form


class TemplateObjective(Objective):
    """A token-level objective stated by its detached coefficient: the gradient of its value is
    ``c_t grad logp_new`` with ``c_t`` = :meth:`coefficient`, so ``beta_t = c_t - w A``. Its
    closed form runs the same torch definitions (value and coefficient) on zero-copy views of
    the numpy arrays: one definition, two paths. :meth:`context` computes once per call what
    both need (a mask, a selection) from detached tensors."""

    def context(self, w, logp_new, logp_old, advantage) -> Any:
        """What value and coefficient share, from detached tensors (default: nothing)."""
        return None

    def value(self, ratio, logp_new, logp_old, advantage, ctx) -> torch.Tensor:
        """The per-sample value to maximise, differentiable in ``logp_new`` / ``ratio``."""
        raise NotImplementedError

    def coefficient(self, w, logp_new, logp_old, advantage, ctx) -> torch.Tensor:
        """``c_t = d value / d logp_new`` from detached tensors."""
        raise NotImplementedError

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        w, lp, lpo, a = ratio.detach(), logp_new.detach(), logp_old.detach(), advantage.detach()
        ctx = self.context(w, lp, lpo, a)
        obj = self.value(ratio, logp_new, logp_old, advantage, ctx)
        bt = self.coefficient(w, lp, lpo, a, ctx) - w * a if want_beta else None
        return PolicyTerm(obj, bt, None)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta, logp_old=None):
        lo = logp - log_w if logp_old is None else logp_old
        tw, ta, tl, tlo = numpy_views(w, a, logp, lo)
        with torch.no_grad():
            ctx = self.context(tw, tl, tlo, ta)
            value = self.value(tw, tl, tlo, ta, ctx).numpy()
            d = self.coefficient(tw, tl, tlo, ta, ctx).numpy()
        return ClosedForm(value, d, None, None, d - wa)
