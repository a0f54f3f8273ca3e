"""One self-contained HTML page: images embedded as base64, no external URL, opens offline."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import yaml

from klppo.report.aggregate import iqm_note
from klppo.report.compare import comparison_html
from klppo.report.grid import shown

__all__ = ["render_html", "img_tag", "machines_html", "CSS"]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em} h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ccc;padding:.3em .7em;
text-align:right} th{background:#f3f3f3} td:nth-child(-n+2){text-align:left}
figure{margin:1em 0} figcaption{font-size:.9em;color:#555} img{max-width:100%}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em}
.ok{color:#1a7f37} .bad{color:#b42318} .muted{color:#666;font-size:.9em}
table.poi td,table.poi th{font-size:.8em;text-align:center} .wide{overflow-x:auto}
"""


def _num(x: float, fmt: str = ".1f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def img_tag(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(Path(path).stem)}" src="data:image/png;base64,{data}">'


def machines_html(machines: list[str]) -> list[str]:
    """The report's 'Measured on' block (nothing when no run recorded its machine)."""
    if not machines:
        return []
    items = "".join(f"<li>{html.escape(m)}</li>" for m in machines)
    return ["<p class='muted'>Measured on (from the runs' metadata.json):</p>"
            f"<ul class='muted'>{items}</ul><p class='muted'>Float results differ across "
            "machines (CPU model, torch build, thread count): the same seed gives the same "
            "numbers on the same machine and software, not necessarily on another.</p>"]


def _policy_cell(row, marl: bool) -> str:
    """The ``policy`` cell of a table with multi-agent rows (``—`` on single-agent rows)."""
    if not marl:
        return ""
    return f"<td style='text-align:left'>{html.escape(row.policy or '—')}</td>"


def _final_table(summaries) -> list[str]:
    e = html.escape
    marl = any(s.policy is not None for s in summaries)
    parts = ["<h2>Final return</h2>" + (
        "<p class='muted'>Multi-agent runs have one row per condition and policy: a "
        "policy's return is the mean over its agents of their episode returns (its "
        "<code>POLICY/episode_return_mean</code>).</p>" if marl else "")
        + "<table><tr><th>env</th><th>condition</th>"
        f"{'<th>policy</th>' if marl else ''}<th>seeds</th>"
        "<th>mean ± std</th><th>IQM [95% CI]</th><th>per seed</th></tr>"]
    for s in summaries:
        per = ", ".join(f"{k}: {_num(v)}" for k, v in sorted(s.per_seed.items()))
        parts.append(f"<tr><td>{e(s.env)}</td><td>{e(shown(s.condition))}</td>"
                     f"{_policy_cell(s, marl)}<td>{s.n}</td>"
                     f"<td>{_num(s.mean)} ± {_num(s.std)}</td><td>{_num(s.iqm)} "
                     f"[{_num(s.ci_low)}, {_num(s.ci_high)}]</td><td>{e(per)}</td></tr>")
    parts.append("</table>")
    return parts


def _equivalence_table(equivalences) -> list[str]:
    e = html.escape
    parts = ["<h2>Equivalence: clip vs per-sample KL (Theorem 1)</h2>"]
    if not equivalences:
        return parts + ["<p class='muted'>No clip run has a per_sample_kl run of the same "
                        "env, seed and settings.</p>"]
    marl = any(q.policy is not None for q in equivalences)
    cols = list(equivalences[0].settings)
    parts.append("<table><tr><th>env</th><th>seed</th>"
                 f"{'<th>policy</th>' if marl else ''}"
                 + "".join(f"<th>{e(c)}</th>" for c in cols)
                 + "<th>iterations</th><th>max |diff| of return curves</th></tr>")
    for q in equivalences:
        cls = "ok" if q.max_abs_diff == 0 else "bad"
        vals = "".join(f"<td>{e(str(q.settings.get(c)))}</td>" for c in cols)
        parts.append(f"<tr><td>{e(q.env)}</td><td>{q.seed}</td>{_policy_cell(q, marl)}"
                     f"{vals}<td>{q.iterations}</td>"
                     f"<td class='{cls}'>{q.max_abs_diff:.3g}</td></tr>")
    keyed = (f"env, seed and {', '.join(cols)} (the settings that differ between pairs)"
             if cols else "env and seed")
    parts.append("</table><p class='muted'>One row per pair of runs that differ only in the "
                 f"objective: the same {keyed}. 0 is expected with power-of-two "
                 "minibatches: the two objectives have bit-identical gradients.</p>")
    return parts


def _comparisons(comparisons, figures) -> list[str]:
    if not comparisons:
        return []
    e = html.escape
    parts = ["<h2>Aggregates over seeds (rliable-style)</h2>",
             "<p class='muted'>Per environment, over the final returns of the table: the "
             "interquartile mean (IQM) with a stratified bootstrap 95% CI, the performance "
             "profile (share of runs whose final return is above tau) and the probability "
             "that a run of one condition ends above a run of another (Agarwal et al. 2021). "
             + e(iqm_note(len(v) for c in comparisons for v in c.scores.values())) + "</p>"]
    for c, (caption, path) in zip(comparisons, figures):
        who = f" / policy {c.policy}" if c.policy is not None else ""
        parts.append(f"<figure>{img_tag(path)}<figcaption>{e(caption)}</figcaption></figure>")
        parts.append(f"<p class='muted'>{e(c.env + who)}: probability of improvement, "
                     "P(row &gt; column) [95% CI]</p>" + comparison_html(c))
    return parts


def _smoothing(windows: dict[str, int]) -> list[str]:
    if not windows:
        return []
    ks = sorted(set(windows.values()))
    if ks == [1]:
        return ["<p class='muted'>Curves are raw (not smoothed; klppo report --smooth K "
                "averages them over K iterations).</p>"]
    what = (f"{ks[0]} iterations" if len(ks) == 1 else ", ".join(
        f"{env}: {k}" for env, k in sorted(windows.items())) + " iterations")
    return [f"<p class='muted'>Curves are trailing moving averages over {what} (klppo report "
            "--smooth K; 1 = raw); each figure states its window. The tables are not "
            "smoothed.</p>"]


def render_html(summaries, equivalences, figures, runs, skipped, notes,
                windows: dict[str, int] | None = None, machines: list[str] | None = None,
                comparisons=(), comparison_figures=(), sections=()) -> str:
    """The report page: tables, aggregates, ``sections`` (a tuning study's), figures
    (embedded), notes and the configs."""
    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             "<title>klppo report</title>", f"<style>{CSS}</style></head><body>",
             "<h1>klppo report</h1>",
             f"<p class='muted'>{len(runs)} runs loaded, {len(skipped)} skipped. Final return: "
             "mean of training-episode returns over the last 10% of environment steps per seed; "
             "mean and population std over seeds; IQM with a bootstrap 95% CI.</p>",
             *machines_html(machines or []), *_final_table(summaries),
             *_equivalence_table(equivalences), *sections,
             *_comparisons(list(comparisons), list(comparison_figures)),
             "<h2>Figures</h2>", *_smoothing(windows or {})]
    for caption, path in figures:
        parts.append(f"<figure>{img_tag(path)}<figcaption>{e(caption)}</figcaption></figure>")
    if skipped or notes:
        parts.append("<h2>Skipped and notes</h2><ul>")
        parts += [f"<li><b>skipped</b> {e(p)}: {e(why)}</li>" for p, why in skipped]
        parts += [f"<li>{e(n)}</li>" for n in notes]
        parts.append("</ul>")
    parts.append("<h2>Run configurations</h2>")
    for r in sorted(runs, key=lambda r: (r.env, r.condition, r.seed)):
        parts.append(f"<details><summary>{e(r.env)} / {e(shown(r.condition))} / seed {r.seed} "
                     f"<span class='muted'>({e(str(r.path))}, status {e(str(r.status))})"
                     f"</span></summary><pre>{e(yaml.safe_dump(r.config, sort_keys=False))}"
                     "</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)
