"""The LLM-RL controls of `klppo rlhf` side by side on the Austen loop, several seeds.

Every arm starts from the same pretrained model (`klppo lm pretrain --out runs/lm/base`) with
the adaptive controller (proportional, target 6 nats per sequence) and changes one control:

* where the KL to the reference is priced: in the reward (k1, Ziegler et al.), or in the loss
  as `k1_to_go` (klppo's in-loss default: k1 as per-token returns with PPO's per-token ratio
  and a leave-one-out baseline),
  `k2_sequence` (reverse KL's gradient with the response's ratio) or GRPO's per-token `k3`
  (neither KL's gradient);
* the training-inference mismatch: responses sampled by a bfloat16 copy of the policy, with no
  correction or with truncated importance sampling (TIS);
* stale rollouts (sampled by the policy 2 updates back): no correction, decoupled PPO (TIS on
  the sampler's ratio), M2PO's second-moment mask (on the unclipped objective, as the paper),
  or TOPR's tapered REINFORCE;
* a reference reset every 50 iterations.

    python examples/rlhf_controls.py --out runs/rlhf-controls --seeds 0 1 2

Arms run in the experiments' process pool (`--workers` at a time, one torch thread each);
re-running the command skips finished arms and resumes interrupted ones exactly. It writes
`OUT/report/` (`klppo rlhf compare`'s report: curves, the second-half table, samples) and
`OUT/report/controls.md` (the table below with the mismatch each arm measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from klppo.experiments.rlhf_compare import run_compare
from klppo.lm.config import RLHFConfig
from klppo.lm.config_checks import validate_rlhf
from klppo.report.lm import lm_report
from klppo.runs.metrics import read_metrics

STALE = {"staleness": 2}
ARMS: dict[str, dict] = {
    "reward_k1": {},
    "loss_k1_to_go": {"kl_placement": "loss", "kl_loss": "k1_to_go"},
    "loss_k2_sequence": {"kl_placement": "loss", "kl_loss": "k2_sequence"},
    "loss_k3_grpo": {"kl_placement": "loss", "kl_loss": "k3"},
    "bf16_uncorrected": {"rollout_dtype": "bfloat16"},
    "bf16_tis": {"rollout_dtype": "bfloat16", "mismatch_correction": "tis"},
    "stale2_uncorrected": STALE,
    "stale2_decoupled": {**STALE, "mismatch_correction": "tis"},
    "stale2_m2po": {**STALE, "mismatch_correction": "m2po", "objective": "unclipped"},
    "stale2_topr": {**STALE, "objective": "topr"},
    "ref_reset_50": {"ref_reset_every": 50},
}


def configs(model: str, iterations: int, seeds: list[int]) -> dict[str, RLHFConfig]:
    """``ARM__SEED`` -> its validated config."""
    out = {}
    for seed in seeds:
        for arm, over in ARMS.items():
            out[f"{arm}__{seed}"] = validate_rlhf(dataclasses.replace(
                RLHFConfig(model=model, iterations=iterations, seed=seed), **over))
    return out


def _mean_of(runs: list[list[dict]], key: str) -> float | None:
    vals = [statistics.fmean(r[key] for r in recs if key in r) for recs in runs
            if any(key in r for r in recs)]
    return statistics.fmean(vals) if vals else None


def controls_table(out: Path, summaries) -> str:
    """The second-half table with each arm's measured sampler mismatch (k3, nats per token,
    mean over iterations) and the share of tokens its correction zeroed."""
    lines = ["| arm | seeds | KL (2nd half, nats/seq) | abs(KL - 6) | worst seed "
             "| score (2nd half) | held-out ppl | distinct-2 | sampler mismatch k3 | zeroed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        runs = [read_metrics(d / "metrics.jsonl")[0]
                for d in sorted((out / "runs").glob(f"{s.arm}__*"))]
        mis, zero = _mean_of(runs, "mismatch_kl_k3"), _mean_of(runs, "mismatch_zeroed")
        lines.append(
            f"| {s.arm} | {s.seeds} | {s.kl_second_half:.2f} | {s.kl_abs_error_second_half:.2f} "
            f"| {s.max_seed_abs_error:.2f} | {s.score_second_half:.3f} | "
            f"{s.final_perplexity:.1f} | {s.distinct_2:.3f} | "
            f"{'-' if mis is None else f'{mis:.2e}'} | {'-' if zero is None else f'{zero:.3f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="runs/lm/base", help="klppo lm pretrain's directory")
    p.add_argument("--out", default="runs/rlhf-controls", help="comparison directory")
    p.add_argument("--iterations", type=int, default=150, help="PPO iterations per arm")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds")
    p.add_argument("--workers", type=int, default=2, help="arms in parallel")
    a = p.parse_args(argv)

    def done(name: str, state: str, err: str | None) -> None:
        print(f"{name}: {state}{'' if err is None else ' ' + err}", flush=True)

    results = run_compare(configs(a.model, a.iterations, a.seeds), a.out, a.workers, done)
    out = Path(a.out)
    _, summaries = lm_report(out, out / "report")
    table = controls_table(out, summaries)
    (out / "report" / "controls.md").write_text(table)
    print(table)
    return 0 if all(state == "finished" for state, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
