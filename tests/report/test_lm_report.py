"""The RLHF comparison report's figures: the legend never covers a curve (#24)."""

import json

import yaml

from klppo.report.lm import lm_report


def _arm(root, name, kls, target=6.0):
    d = root / "runs" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"kind": "rlhf", "controller": "fixed"}))
    with open(d / "metrics.jsonl", "w") as f:
        for i, k in enumerate(kls):
            rec = {"iteration": i + 1, "episodes": 32 * (i + 1), "kl": k, "score": 0.1 * i,
                   "beta": 0.1, "beta_after": 0.1, "kl_target": target,
                   "kl_unit": "nats per sequence", "distinct_2": 0.5,
                   "held_out_perplexity": 60.0 + i}
            f.write(json.dumps(rec) + "\n")


def test_every_legend_is_outside_its_axes(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from klppo.report import lm

    figs = []
    real = lm._curves

    def keep(*a, **k):
        figs.append(real(*a, **k))
        return figs[-1]

    monkeypatch.setattr(lm, "_curves", keep)
    monkeypatch.setattr(plt, "close", lambda fig=None: None)  # keep them to measure
    # KL curves that sit on the target at the top right, where a default legend goes
    _arm(tmp_path, "fixed-2.0__0", [1.0, 3.0, 5.5, 6.0, 6.2, 6.0])
    _arm(tmp_path, "adaptive__0", [2.0, 4.0, 6.5, 6.1, 5.9, 6.0])
    page, summaries = lm_report(tmp_path, tmp_path / "out")
    assert page.exists() and [s.arm for s in summaries] == ["adaptive", "fixed-2.0"]
    assert len(figs) == 4
    for fig in figs:
        fig.canvas.draw()
        (ax,) = fig.axes
        legend = ax.get_legend().get_window_extent()
        assert legend.x0 >= ax.get_window_extent().x1, ax.get_title()
    kl = next(f for f in figs if "KL" in f.axes[0].get_title())
    assert "target 6" in [t.get_text() for t in kl.axes[0].get_legend().get_texts()]
