"""One colour per condition (issue #31): the same set of conditions gets the same colours
whatever order it comes in, klppo's own names keep theirs in every report, names in one figure
never share a colour (up to the palette's size), and a report's learning curves draw each
condition in that colour, also in a report of fewer conditions."""

import itertools

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgb

from klppo.report.colours import FIXED, PALETTE, condition_colours
from klppo.report.curves import learning_curves
from klppo.report.load import load_runs
from tests.report.test_report_grid import fake_sweep

NAMES = ["clip", "per_sample_kl", "kl_fixed", "kl_adaptive", "spo", "cispo", "my_variant"]


def test_the_same_set_gets_the_same_colours_in_any_order():
    first = condition_colours(NAMES)
    for order in itertools.islice(itertools.permutations(NAMES), 50):
        assert condition_colours(order) == first
    assert len(set(first.values())) == len(NAMES)  # distinct in one figure


@pytest.mark.parametrize("subset", [["clip"], ["kl_adaptive", "spo"], ["per_sample_kl"]])
def test_klppo_names_keep_their_colour_in_any_report(subset):
    for name in subset:
        if name in FIXED:
            assert condition_colours(subset)[name] == PALETTE[FIXED[name]]


def test_more_names_than_colours_repeat_but_every_name_gets_one():
    names = [f"c{i}" for i in range(len(PALETTE) + 3)]
    colours = condition_colours(names)
    assert set(colours) == set(names) and len(set(colours.values())) == len(PALETTE)


def _line_colours(fig) -> dict[str, tuple]:
    out = {}
    for lg in fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]:
        for handle, text in zip(lg.legend_handles, lg.get_texts()):
            out[text.get_text().split(" (")[0]] = to_rgb(handle.get_color())
    return out


def test_a_report_of_fewer_conditions_draws_each_in_the_same_colour(tmp_path):
    full = load_runs([fake_sweep(tmp_path / "all", objectives=("clip", "per_sample_kl",
                                                               "kl_penalty"), lrs=[0.001])]).runs
    some = [r for r in full if r.condition.startswith("kl_penalty")]
    a = _line_colours(learning_curves("Env-v0", full))
    b = _line_colours(learning_curves("Env-v0", some))
    plt.close("all")
    assert a["kl_penalty"] == b["kl_penalty"] == PALETTE[FIXED["kl_penalty"]]
    assert a["clip"] == PALETTE[FIXED["clip"]]
