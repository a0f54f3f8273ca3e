"""How the PID gains of docs/results/trl-grpo-smollm2-pid were chosen: fit a one-line model of the
per-step KL to runs' metrics, then simulate rules on it.

    python tools/pid_gain_model.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR holds a metrics.jsonl with per-step ``kl`` and ``beta`` (the layout of
examples/trl_grpo_adaptive_kl.py). The model: ``log KL[t+1] - log KL[t] = a + c log KL[t] -
b beta[t] + noise`` (least squares over steps with KL in (0.003, 0.6)); then 200 simulated seeds
of 60 steps from KL 0.0012, target 0.05, for each PID rule from a weak start (0.005, held until
the KL reaches the target, as the earlier PID runs were) and a strong one (1.0, no hold): the
share of seeds whose second-half mean KL is within 25% of the target. A guide to the gains, not
a result: the runs themselves are.

The runs the gains were chosen on (2026-11-28, not committed; each README names its command):
the PID runs with ``kp = ki = 1`` per nat (seeds 0-2, and seed 0 with ``kd = 2``), the fixed
weak beta (seeds 0-2) and the lr 5e-4 probes of docs/results/trl-grpo-smollm2. Fitted there:
``d log KL = -0.058 - 0.062 log KL - 0.273 beta`` (residual sd 0.25); PID ``kp, ki`` within 25%
on this share of 200 seeds, weak / strong start: 1, 1: 47% / 34%; 5, 1: 66% / 56%; 10, 2: 94% /
95%; 20, 3: 99% / 99%.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

TARGET = 0.05


def fit(dirs: list[str]) -> tuple[np.ndarray, float]:
    X, Y = [], []
    for d in dirs:
        rows = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines()]
        kl = np.array([r["kl"] for r in rows])
        beta = np.array([r["beta"] for r in rows])
        for t in range(3, len(kl) - 1):
            if 0.003 < kl[t] < 0.6 and kl[t + 1] > 0.003:
                X.append([1.0, np.log(kl[t]), beta[t]])
                Y.append(np.log(kl[t + 1]) - np.log(kl[t]))
    X_, Y_ = np.array(X), np.array(Y)
    coef = np.linalg.lstsq(X_, Y_, rcond=None)[0]
    return coef, float((Y_ - X_ @ coef).std())


def pid(kp: float, ki: float):
    def make(beta0: float):
        state = {"I": beta0}

        def rule(kl: float) -> float:
            e = kl - TARGET
            state["I"] = max(state["I"] + ki * e, 0.0)
            return max(1e-4, kp * e + state["I"])
        return rule
    return make


def within(make, beta0: float, hold: bool, coef: np.ndarray, sd: float, seeds: int = 200) -> float:
    a, c, b = coef
    hits = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        lk, betas, kls, held, rule = np.log(0.0012), [beta0, beta0], [], hold, make(beta0)
        for _ in range(60):
            kl = float(np.exp(lk))
            kls.append(kl)
            held = held and kl < TARGET
            betas.append(betas[-1] if held else rule(kl))
            lk += a + c * lk + b * betas[-2] + sd * rng.standard_normal()  # one step of delay
        hits += abs(np.mean(kls[30:]) / TARGET - 1) <= 0.25
    return hits / seeds


def main() -> None:
    coef, sd = fit(sys.argv[1:])
    print(f"d log KL = {coef[0]:.3f} + {coef[1]:.3f} log KL - {-coef[2]:.3f} beta  (sd {sd:.2f})")
    for kp, ki in ((1, 1), (5, 1), (10, 2), (20, 3), (20, 5)):
        print(f"pid kp={kp} ki={ki}: within 25% on {within(pid(kp, ki), 0.005, True, coef, sd):.0%}"
              f" (weak, held) / {within(pid(kp, ki), 1.0, False, coef, sd):.0%} (strong) of seeds")


if __name__ == "__main__":
    main()
