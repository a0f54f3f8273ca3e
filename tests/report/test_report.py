import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from klppo.report import make_report
from klppo.report.stats import bootstrap_iqm_ci, iqm

ROOT = Path(__file__).resolve().parents[2]


def fake_run(root: Path, name: str, env: str, objective: str, seed: int,
             returns: list[float | None], counts: list[int] | None = None, steps: int = 100,
             extra: dict | None = None, kl: dict | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    cfg = {"env": env, "objective": objective, "seed": seed, "ppo": {"shape": "clip"},
           "kl": kl or {"controller": "fixed"}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    counts = counts or [1] * len(returns)
    with open(d / "metrics.jsonl", "w") as f:
        for i, (r, n) in enumerate(zip(returns, counts)):
            rec = {"iteration": i + 1, "global_step": (i + 1) * steps,
                   "episode_return_mean": r, "episode_count": n if r is not None else 0,
                   "frac_kill": 0.1, "frac_pass": 0.2, "frac_in": 0.7, "beta_t_q50": 0.0,
                   "beta_t_q90": 0.5, "beta_t_q99": 1.0, "kl_rollout": 0.01, "beta": 1.0,
                   **(extra or {})}
            f.write(json.dumps(rec) + "\n")
    (d / "status.json").write_text(json.dumps({"state": "finished"}))
    return d


def test_final_return_table_matches_hand_computation(tmp_path):
    # 20 iterations of 100 steps: the last 10% of steps are iterations 19 and 20 (> 1800)
    per_seed = {}
    for seed in range(8):
        rets = [float(i) for i in range(18)] + [100.0 + seed, 200.0 + seed]
        counts = [1] * 18 + [1, 3]
        fake_run(tmp_path, f"c{seed}", "Env-v0", "clip", seed, rets, counts)
        per_seed[seed] = ((100 + seed) * 1 + (200 + seed) * 3) / 4
    rep = make_report([tmp_path], tmp_path / "out")
    (s,) = rep.summaries
    vals = np.array(list(per_seed.values()))
    assert s.n == 8 and s.per_seed == pytest.approx(per_seed)
    assert s.mean == pytest.approx(vals.mean())
    assert s.std == pytest.approx(math.sqrt(((vals - vals.mean()) ** 2).mean()))  # population
    srt = np.sort(vals)
    assert s.iqm == pytest.approx(srt[2:6].mean())  # middle 50% of 8 seeds
    assert s.ci_low <= s.iqm <= s.ci_high and srt[0] <= s.ci_low and s.ci_high <= srt[-1]
    md = (tmp_path / "out" / "final_returns.md").read_text()
    assert f"{vals.mean():.1f} ± {vals.std():.1f}" in md
    rows = (tmp_path / "out" / "final_returns.csv").read_text().splitlines()
    assert rows[0].startswith("env,condition,seeds,mean,std,iqm")


def test_iqm_and_bootstrap_by_hand():
    assert iqm(np.arange(1, 9)) == pytest.approx(4.5)
    assert bootstrap_iqm_ci(np.full(5, 7.0)) == (7.0, 7.0)
    assert bootstrap_iqm_ci(np.arange(10.0), seed=1) == bootstrap_iqm_ci(np.arange(10.0), seed=1)


def test_equivalence_panel(tmp_path):
    same = [1.0, None, 3.0, 4.0]
    fake_run(tmp_path, "a", "Env-v0", "clip", 0, same)
    fake_run(tmp_path, "b", "Env-v0", "per_sample_kl", 0, same)
    fake_run(tmp_path, "c", "Env-v0", "clip", 1, [1.0, 2.0, 3.0, 4.0])
    fake_run(tmp_path, "d", "Env-v0", "per_sample_kl", 1, [1.0, 2.5, 3.0, 3.0])
    rep = make_report([tmp_path], tmp_path / "out")
    eq = {e.seed: e.max_abs_diff for e in rep.equivalences}
    assert eq == {0: 0.0, 1: 1.0}


def test_bad_input_is_skipped_with_reasons_and_envs_are_not_mixed(tmp_path):
    fake_run(tmp_path, "ok1", "EnvA-v0", "clip", 0, [1.0] * 10)
    fake_run(tmp_path, "ok2", "EnvB-v0", "clip", 0, [5.0] * 10)
    trunc = fake_run(tmp_path, "trunc", "EnvA-v0", "kl_penalty", 0, [2.0] * 10,
                     extra={"kl_observed": 0.02, "kl_target": 0.02},
                     kl={"controller": "step"})
    with open(trunc / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 11, "global_st')  # killed mid-write
    nometrics = tmp_path / "nometrics"
    nometrics.mkdir()
    (nometrics / "config.yaml").write_text("env: EnvA-v0\n")
    junk = tmp_path / "junk"
    junk.mkdir()
    rep = make_report([tmp_path / "ok1", tmp_path / "ok2", trunc, nometrics, junk,
                       tmp_path / "missing"], tmp_path / "out")
    reasons = dict(rep.skipped)
    assert "no metrics.jsonl" in reasons[str(nometrics)]
    assert "neither a run directory nor a sweep" in reasons[str(junk)]
    assert reasons[str(tmp_path / "missing")] == "does not exist"
    assert any("malformed" in n for n in rep.notes)
    assert {(s.env, s.condition) for s in rep.summaries} == {
        ("EnvA-v0", "clip"), ("EnvA-v0", "kl_penalty[step]"), ("EnvB-v0", "clip")}
    html = rep.html.read_text()
    assert "skipped" in html and "kl_penalty[step]" in html


def test_html_is_self_contained_and_figures_exist(tmp_path):
    fake_run(tmp_path, "a", "Env-v0", "clip", 0, [1.0, 2.0, 3.0])
    fake_run(tmp_path, "k", "Env-v0", "kl_penalty", 0, [1.0, 2.0, 3.0],
             extra={"kl_observed": 0.03, "kl_target": 0.02}, kl={"controller": "step"})
    rep = make_report([tmp_path], tmp_path / "out")
    html = rep.html.read_text()
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", html)
    assert html.count("data:image/png;base64,") == len(rep.figures) >= 3
    for _, png in rep.figures:
        assert png.exists() and png.with_suffix(".svg").exists()


def test_report_package_does_not_import_torch(tmp_path):
    fake_run(tmp_path, "a", "Env-v0", "clip", 0, [1.0, 2.0])
    code = ("import sys; from klppo.report import make_report; "
            f"make_report([{str(tmp_path)!r}], {str(tmp_path / 'o')!r}); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_report_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    fake_run(tmp_path, "a", "Env-v0", "clip", 0, [1.0, 2.0, 3.0])
    rep = make_report([tmp_path], tmp_path / "out")
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,1600", rep.html.resolve().as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000
