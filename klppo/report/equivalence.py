"""The clip vs per_sample_kl check (KLip-PPO, Theorem 1): pairs of runs that differ only in the
objective, and the largest difference of their return curves.

Two runs pair when they share env, seed, policy and every setting (:func:`settings`: the whole
config but for the objective and the bookkeeping fields), so a sweep with a grid axis gets one
row per grid point and seed, keyed by the axis values (the table's extra columns). A clip or
per_sample_kl run with no partner is named in a note, never dropped silently.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klppo.report.grid import settings
from klppo.report.load import Run

__all__ = ["Equivalence", "equivalence", "unpaired_notes", "setting_columns",
           "write_equivalence", "has_policies"]


@dataclass
class Equivalence:
    env: str
    seed: int
    max_abs_diff: float
    iterations: int
    policy: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    """the pair's values of the fields that differ between the table's pairs (grid axes and
    condition settings such as ``ppo.lr``); {} when every pair has the same settings"""


def _is_clip_shape_psk(r: Run) -> bool:
    return r.objective == "per_sample_kl" and (r.config.get("ppo") or {}).get(
        "shape", "clip") == "clip"


def _key(r: Run) -> tuple:
    s = settings(r, frozenset({"objective", "seed", "env"}))
    s.setdefault("ppo.shape", "clip")
    return (r.env, r.seed, r.policy or "", tuple(sorted(s.items(), key=lambda kv: kv[0])))


def _pairs(runs: list[Run]) -> dict[tuple, dict[str, list[Run]]]:
    pairs: dict[tuple, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        if r.objective == "clip":
            pairs[_key(r)]["clip"].append(r)
        elif _is_clip_shape_psk(r):
            pairs[_key(r)]["psk"].append(r)
    return pairs


def _max_diff(a: Run, b: Run) -> tuple[float, int]:
    x = [m.get("episode_return_mean") for m in a.metrics]
    y = [m.get("episode_return_mean") for m in b.metrics]
    n = min(len(x), len(y))
    diffs = []
    for u, v in zip(x[:n], y[:n]):
        if u is None and v is None:
            diffs.append(0.0)
        elif u is None or v is None:
            diffs.append(math.inf)
        else:
            diffs.append(abs(u - v))
    return (max(diffs) if diffs else math.nan), n


def setting_columns(keys: list[tuple]) -> list[str]:
    """The settings that differ between pairs: the table's extra columns (a grid's axes)."""
    dicts = [dict(k[3]) for k in keys]
    names = sorted(set().union(*dicts)) if dicts else []
    return [n for n in names if len({d.get(n) for d in dicts}) > 1]


def equivalence(runs: list[Run]) -> list[Equivalence]:
    """Max |difference| of the return curves of each clip and per_sample_kl (clip shape) pair
    (0 expected with power-of-two minibatches: Theorem 1); per policy for multi-agent runs
    (given as :func:`klppo.report.build.units`). Sorted by env, settings, seed, policy."""
    pairs = {k: p for k, p in _pairs(runs).items() if p["clip"] and p["psk"]}
    cols = setting_columns(list(pairs))
    out = []
    for key, p in pairs.items():
        env, seed, policy, items = key
        diff, n = _max_diff(p["clip"][0], p["psk"][0])
        point = {c: dict(items).get(c) for c in cols}
        out.append(Equivalence(env, seed, diff, n, policy or None, point))
    return sorted(out, key=lambda e: (e.env, [str(v) for v in e.settings.values()], e.seed,
                                      e.policy or ""))


def unpaired_notes(runs: list[Run]) -> list[str]:
    """One note per clip or per_sample_kl run that has no partner of the other objective with
    the same env, seed and settings, where its env has runs of both (and per extra run where a
    pair has more than one of a kind: the first found is compared)."""
    pairs = _pairs(runs)
    both = {k[0] for k, p in pairs.items() if p["clip"]} & {
        k[0] for k, p in pairs.items() if p["psk"]}
    notes = []
    for key, p in pairs.items():
        who = f" (policy {key[2]})" if key[2] else ""
        if key[0] in both and not (p["clip"] and p["psk"]):
            kind, other = ("clip", "per_sample_kl") if p["clip"] else ("per_sample_kl", "clip")
            for r in p["clip"] or p["psk"]:
                notes.append(f"{r.path}{who}: a {kind} run with no {other} run of the same "
                             "seed and settings, so it is in no equivalence row")
        for kind in ("clip", "psk"):
            for r in p[kind][1:]:
                notes.append(f"{r.path}{who}: a second run with the same seed and settings; "
                             "the equivalence row compares the first one found")
    return list(dict.fromkeys(notes))


def has_policies(rows: list) -> bool:
    """Whether a table has multi-agent rows, and so a ``policy`` column (``—`` for the
    single-agent rows); single-agent tables are as they always were."""
    return any(r.policy is not None for r in rows)


def write_equivalence(out: Path, eqs: list[Equivalence]) -> None:
    """``equivalence.md`` and ``equivalence.csv``: one row per pair, a column per setting
    that differs between pairs."""
    marl = has_policies(eqs)
    cols = list(eqs[0].settings) if eqs else []
    head = ["env", "seed", *(["policy"] if marl else []), *cols, "iterations"]
    md = ["| " + " | ".join(head) + " | max abs diff of return curves |",
          "|" + "---|" * (len(head) + 1)]
    rows = []
    for e in eqs:
        row = [e.env, e.seed, *([e.policy or "—"] if marl else []),
               *(e.settings.get(c) for c in cols), e.iterations]
        rows.append(row)
        md.append("| " + " | ".join(str(x) for x in row) + f" | {e.max_abs_diff:.3g} |")
    (out / "equivalence.md").write_text("\n".join(md) + "\n")
    with open(out / "equivalence.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*head, "max_abs_diff"])
        for row, e in zip(rows, eqs):
            w.writerow([*("" if x == "—" else x for x in row), e.max_abs_diff])
