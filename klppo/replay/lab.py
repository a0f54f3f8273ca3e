"""The controller lab: replay a KL trace through controllers, or close the loop on a plant.

Open loop (:func:`open_loop`): feed a logged KL trace (a run's ``metrics.jsonl`` or a CSV column)
to any set of controllers and record the beta each would have produced. The trace does not react
to those betas, so this shows each rule's response to the same inputs.

Closed loop (:func:`closed_loop`): a simulated *plant* answers each beta with the KL a policy
update would reach under it::

    KL_t = scale_t / (beta_t + beta_floor) ** power * exp(noise * e_t - noise**2 / 2)
    scale_t = scale * exp(drift * t / steps),   e_t ~ N(0, 1)

Why this shape: a penalised update maximising ``g.d - (beta / 2) d'Fd`` moves by
``d = F^-1 g / beta``, whose KL is ``g'F^-1 g / (2 beta^2)``: KL falls as beta^-2 (``power``
2). ``beta_floor`` caps the step when beta is tiny (finite epochs, a learning rate, the clip), the
drift models a learning signal that grows or shrinks over training, and the mean-one lognormal
noise models minibatch sampling. With the defaults a beta of about 0.95 meets a 0.02 target at
t = 0, and the beta needed grows by e^(drift/2) over the run, so a fixed beta drifts off target.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from klppo.core.bound_controllers import BalanceStats, BAPOController
from klppo.core.controllers import ControllerName, KLController, make_controller
from klppo.replay.metrics import FLOOR, response_metrics, tracking_metrics
from klppo.runs.configfile import InputFileError, read_text
from klppo.runs.metrics import policies_of

__all__ = ["Plant", "load_trace", "parse_controller", "default_controllers", "open_loop",
           "closed_loop", "tracking_metrics", "response_metrics", "LoopResult", "trace_x_label",
           "FLOOR", "check_finite", "preset_keeps_target", "replay_bounds"]


def load_trace(path: str | Path, column: str | None = None,
               policy: str | None = None) -> tuple[list[float], list[float], float | None]:
    """``(steps, kl, target)`` from a run's ``metrics.jsonl`` (or its directory) or a CSV file.

    metrics.jsonl: ``column`` defaults to ``kl_observed`` (what the run's controller saw), else
    ``kl_rollout``, else ``kl``; steps are ``global_step``; the target is the run's
    ``kl_target`` if any. Records without the column (or with null) are skipped; a torn last
    line (a run killed mid-write) is ignored. CSV: ``column`` defaults to ``kl``; steps come
    from a ``step`` column, else the row index. Anything else (a missing, empty or malformed
    file, a missing column, a value that is not a finite number) raises ``ValueError`` naming
    ``trace``, the file and the line.

    A multi-agent run logs each policy's metrics as ``POLICY/name``: ``policy`` picks one, and
    its ``policy/`` columns are read as above (``column`` without the prefix, the target its
    ``policy/kl_target``). A multi-agent run without ``policy``, and ``policy`` with an unknown
    policy, a single-agent run or a CSV file, raise ``ValueError`` naming the policies.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
        if not p.exists():
            raise InputFileError(f"trace={str(path)!r}: a directory without metrics.jsonl")
    text = read_text(p, "trace")
    if not text.strip():
        raise InputFileError(f"trace={str(p)!r}: empty file")
    if p.suffix == ".jsonl":
        return _trace_jsonl(p, text, column, policy)
    if policy is not None:
        raise InputFileError(f"--policy={policy!r}: trace={str(p)!r} is a CSV file, not a "
                             "multi-agent run's metrics.jsonl")
    return (*_trace_csv(p, text, column), None)


def _policy_prefix(p: Path, records: list[dict[str, Any]], policy: str | None) -> str:
    """``"policy/"`` for a multi-agent trace, ``""`` for a single-agent one; ValueError when
    ``policy`` does not fit the trace."""
    policies = policies_of(records)
    listed = ", ".join(repr(x) for x in policies)
    if policy is None:
        if policies:
            raise InputFileError(f"trace={str(p)!r}: a multi-agent run (policies {listed}): "
                                 "choose one with --policy NAME")
        return ""
    if not policies:
        raise InputFileError(f"--policy={policy!r}: trace={str(p)!r} is a single-agent run "
                             "(no POLICY/kl_rollout metrics)")
    if policy not in policies:
        raise InputFileError(f"--policy={policy!r}: not a policy of trace={str(p)!r} "
                             f"(its policies: {listed})")
    return f"{policy}/"


def trace_x_label(path: str | Path) -> str:
    """What :func:`load_trace`'s steps count, as an axis label."""
    p = Path(path)
    if p.is_dir() or p.suffix == ".jsonl":
        return "environment steps (the run's global_step)"
    header = next(csv.reader(io.StringIO(read_text(p, "trace"))), [])
    return "step (the CSV's step column)" if "step" in header else "row of the CSV file"


def _number(p: Path, where: str, col: str, v: object) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if isinstance(v, str):
        try:
            v, ok = float(v), True
        except ValueError:
            ok = False
    if not ok or not math.isfinite(float(v)):  # type: ignore[arg-type]
        raise InputFileError(f"trace={str(p)!r}: {where}: {col}={v!r} is not a finite number")
    return float(v)  # type: ignore[arg-type]


def _trace_jsonl(p: Path, text: str, column: str | None, policy: str | None = None):
    lines = text.splitlines()
    recs: list[tuple[int, dict[str, Any]]] = []
    for i, line in enumerate(lines, 1):
        try:
            r = json.loads(line) if line.strip() else None
        except (json.JSONDecodeError, RecursionError):
            if i == len(lines) and recs:
                continue  # a torn last line: the run was killed mid-write
            raise InputFileError(f"trace={str(p)!r}: line {i}: not JSON") from None
        if r is not None and not isinstance(r, dict):
            raise InputFileError(f"trace={str(p)!r}: line {i}: not a JSON object")
        if r is not None:
            recs.append((i, r))
    pre = _policy_prefix(p, [r for _, r in recs], policy)
    if pre and column and column.startswith(pre):
        column = column[len(pre):]
    col = pre + (column or next((c for c in ("kl_observed", "kl_rollout", "kl")
                                 if any(pre + c in r for _, r in recs)), "kl_observed"))
    rows = [(i, r) for i, r in recs if r.get(col) is not None]
    if not rows:
        raise InputFileError(f"trace={str(p)!r}: no values in column {col!r}")
    kl = [_number(p, f"line {i}", col, r[col]) for i, r in rows]
    steps = [_number(p, f"line {i}", "global_step", r.get("global_step", r.get("iteration", i)))
             for i, r in rows]
    tk = pre + "kl_target"
    target = next((r[tk] for _, r in rows if r.get(tk) is not None), None)
    if target is not None:
        target = _number(p, tk, tk, target)
    return steps, kl, target


def _trace_csv(p: Path, text: str, column: str | None) -> tuple[list[float], list[float]]:
    col = column or "kl"
    try:
        rows = list(csv.DictReader(io.StringIO(text)))
    except csv.Error as e:
        raise InputFileError(f"trace={str(p)!r}: not CSV ({e})") from None
    if not rows or col not in rows[0]:
        raise InputFileError(f"trace={str(p)!r}: no column {col!r} (columns: "
                             f"{list(rows[0]) if rows else []})")
    kl = [_number(p, f"row {i + 2}", col, r[col]) for i, r in enumerate(rows)]
    steps = [_number(p, f"row {i + 2}", "step", r["step"]) if "step" in r else float(i)
             for i, r in enumerate(rows)]
    return steps, kl


def preset_keeps_target(spec: str) -> bool:
    """Whether a controller spec is a named step preset without ``target=``
    (``step:preset=rllib``): it keeps the preset's own target (rllib 0.01, klip 0.02, ...),
    which the replay's target does not replace."""
    name, options = _spec_options(spec)
    return name == "step" and "preset" in options and "target" not in options


def _spec_options(spec: str) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` of a controller spec; ValueError naming it when malformed."""
    name, _, opts = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, opts.split(",")):
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"controller={spec!r}: expected key=value, got {item!r}")
        if k in options:
            raise ValueError(f"controller={spec!r}: {k} is given twice; give each option once")
        try:
            options[k] = float(v)
        except ValueError:
            options[k] = v
    return name, options


def parse_controller(spec: str, target: float | None = None) -> tuple[str, KLController]:
    """``"step:preset=rllib"`` or ``"proportional:beta=1,horizon=20"`` -> (label, controller).

    ``target`` is applied unless the spec sets its own: ``target=...``, or a named step preset,
    which keeps the preset's (:func:`preset_keeps_target`; the controller's ``target`` says
    which applies). A bad spec raises ``ValueError`` ``controller='spec': why``.
    """
    name, options = _spec_options(spec)
    if target is not None and "target" not in options and not preset_keeps_target(spec):
        options["target"] = target
    try:  # make_controller refuses a name that is not a ControllerName (ValueError)
        return spec, make_controller(cast(ControllerName, name), **options)
    except (ValueError, TypeError) as e:
        raise ValueError(f"controller={spec!r}: {e}") from None


def default_controllers(target: float) -> list[str]:
    """One of each rule, tuned to the same target (nats per sample; the step presets are given
    it explicitly, as they would keep their own)."""
    return ["fixed:beta=1", f"step:preset=ppo_paper,target={target:g}",
            f"step:preset=rllib,beta=1,target={target:g}",
            "proportional:beta=1,horizon=10", "exponential:beta=1,gain=20",
            f"pid:beta=1,kp={0.05 / target:g},ki={0.25 / target:g},p_ema=0.5"]


def open_loop(kl: Sequence[float], controllers: dict[str, KLController]) -> dict[str, list[float]]:
    """The beta after each update of each controller, fed the same KL trace; ValueError
    naming the controller when one fails or its beta is not finite (:func:`check_finite`)."""
    out = {}
    for label, c in controllers.items():
        betas: list[float] = []
        for d in kl:
            betas.append(_update(label, c, d, len(betas)))
        out[label] = check_finite(label, betas)
    return out


def replay_bounds(batches: Sequence[BalanceStats | tuple[Any, Any]],
                  controller: BAPOController) -> list[tuple[float, float]]:
    """The ``(c_low, c_high)`` a clip-bound controller (BAPO, :mod:`klppo.core.bound_controllers`)
    chooses for each batch, fed in order: each a :class:`~klppo.core.bound_controllers.BalanceStats`
    or a ``(ratio, advantage)`` pair of per-sample arrays (what a run's minibatch step read).
    The rule reads per-sample statistics, which a run's ``metrics.jsonl`` does not hold, so
    ``klppo replay`` does not offer it. ValueError names the batch that is refused."""
    out = []
    for t, b in enumerate(batches):
        try:
            stats = b if isinstance(b, BalanceStats) else BalanceStats.from_samples(*b)
        except (TypeError, ValueError) as e:
            raise ValueError(f"batch {t + 1}: {e}") from None
        out.append(controller.update(stats))
    return out


def _update(label: str, c: KLController, d: float, t: int) -> float:
    """``c.update(d)``; an overflow or refusal inside it is a ValueError naming ``label``."""
    try:
        return c.update(d)
    except (ArithmeticError, ValueError) as e:
        raise ValueError(f"controller={label!r}: update {t + 1}: {type(e).__name__}: "
                         f"{e}") from None


def check_finite(label: str, values: list[float], what: str = "beta") -> list[float]:
    """``values``, or ValueError naming the controller, the update and the value when one is
    not finite (options out of range: a gain of 1e308 overflows)."""
    t = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
    if t is not None:
        raise ValueError(f"controller={label!r}: {what}={values[t]!r} at update {t + 1} is "
                         "not finite (an option out of range?)")
    return values


@dataclass
class Plant:
    """The simulated KL response to beta (see the module docstring for the model)."""

    scale: float = 0.018
    """KL (nats per sample) at beta + beta_floor = 1, at t = 0"""
    power: float = 2.0
    """KL ~ (beta + beta_floor) ** -power"""
    beta_floor: float = 0.05
    """caps the KL when beta is tiny"""
    drift: float = 1.0
    """log-change of the scale over the whole run"""
    noise: float = 0.3
    """lognormal sigma of the measurement"""
    seed: int = 0

    #: the largest |drift| and noise: e^100 and a sigma of 10 already leave any KL target;
    #: beyond them the plant's KL overflows a float
    DRIFT_MAX: ClassVar[float] = 100.0
    NOISE_MAX: ClassVar[float] = 10.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.drift) and abs(self.drift) <= self.DRIFT_MAX):
            raise ValueError(f"drift={self.drift!r}: must be finite and within "
                             f"+-{self.DRIFT_MAX:g} (the log-change of the KL over the run)")
        if not (math.isfinite(self.noise) and 0 <= self.noise <= self.NOISE_MAX):
            raise ValueError(f"noise={self.noise!r}: must be finite and in "
                             f"[0, {self.NOISE_MAX:g}] (a lognormal sigma)")

    def kl(self, beta: float, t: int, steps: int, rng: np.random.Generator) -> float:
        scale = self.scale * math.exp(self.drift * t / max(steps, 1))
        e = rng.standard_normal()
        return scale / (beta + self.beta_floor) ** self.power * math.exp(
            self.noise * e - self.noise**2 / 2)


@dataclass
class LoopResult:
    label: str
    kl: list[float]
    beta: list[float]
    metrics: dict[str, float | None]


def closed_loop(label: str, controller: KLController, plant: Plant, steps: int = 200,
                band: float = 0.5) -> LoopResult:
    """Run ``steps`` updates: the plant answers the current beta, the controller reacts."""
    rng = np.random.default_rng(plant.seed)  # the same noise sequence for every controller
    kl, beta = [], []
    for t in range(steps):
        b = controller.value
        try:
            d = plant.kl(b, t, steps, rng)
        except ArithmeticError as e:
            raise ValueError(f"controller={label!r}: update {t + 1}: the plant's KL at "
                             f"beta={b!r}: {type(e).__name__}: {e}") from None
        beta.append(b)
        kl.append(d)
        _update(label, controller, d, t)
    check_finite(label, beta)
    check_finite(label, kl, "KL")
    m = tracking_metrics(kl, beta, controller.target, controller.beta_min, controller.beta_max,
                         band)
    return LoopResult(label, kl, beta, m)
