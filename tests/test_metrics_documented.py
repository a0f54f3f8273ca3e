"""docs/metrics.md is complete and true: every key a real short run logs is documented, each
table's dashboard name is the one logged, and its table of CleanRL's and SB3's names is
``klppo.runs.names.ALIASES``."""

import dataclasses
import re
from pathlib import Path

import pytest

import klppo.rl as rl
from klppo.runs.names import ALIASES, namespaced

DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()


def documented(key: str) -> bool:
    """The key (a multi-agent run's without its policy prefix) appears in backticks."""
    return f"`{key.rpartition('/')[2]}`" in DOC


def _keys(metrics: list[dict]) -> set[str]:
    return set().union(*(set(m) for m in metrics))


def test_every_key_of_short_cartpole_runs_is_documented(tmp_path):
    base = dataclasses.replace(rl.preset("klip/cartpole"), total_steps=1024, tensorboard=False)
    keys: set[str] = set()
    for name, changes in {
        "clip": {"eval_every": 1, "eval_episodes": 1},  # beta_t, the partition, evaluations
        "kl_penalty": {"objective": "kl_penalty",  # the controller and the KL monitor
                       "kl": dataclasses.replace(base.kl, controller="proportional",
                                                 target=0.01)},
    }.items():
        cfg = dataclasses.replace(base, out=str(tmp_path / name), **changes)
        keys |= _keys(rl.train(cfg).metrics)
    assert {"kl_alarm_low", "value_target_rms", "beta_t_q90", "kl_observed",
            "eval_return_mean"} <= keys
    missing = sorted(k for k in keys if not documented(k))
    assert not missing, f"docs/metrics.md does not document {missing}"


def test_every_key_of_a_short_multi_agent_run_is_documented(tmp_path):
    pytest.importorskip("mpe2")
    cfg = dataclasses.replace(rl.preset("marl/simple_adversary"), total_steps=1600,
                              out=str(tmp_path / "mpe"), tensorboard=False)
    keys = _keys(rl.train(cfg).metrics)
    assert any(k.startswith("adversary/") for k in keys)
    missing = sorted(k for k in keys if not documented(k))
    assert not missing, f"docs/metrics.md does not document {missing}"


def _cells(line: str) -> list[str]:
    """The cells of a markdown table row (an escaped ``\\|`` is not a separator)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def _tables() -> list[list[list[str]]]:
    """The markdown tables of the document, as rows of cells (header and rule dropped)."""
    tables, rows = [], []
    for line in DOC.splitlines() + [""]:
        if line.startswith("|"):
            rows.append(_cells(line))
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def test_each_dashboard_name_in_the_tables_is_the_name_logged():
    checked = 0
    for table in _tables():
        for row in table:
            keys = re.findall(r"`([a-z0-9_]+)`", row[0])
            names = re.findall(r"`([a-z]+/[a-z0-9_]+)`", row[1]) if len(row) > 1 else []
            if keys and names:
                assert names == [namespaced(k) for k in keys], row
                checked += 1
    assert checked > 25


def test_the_alias_table_is_the_one_in_the_code():
    header = "| klppo key | klppo dashboard name | CleanRL"
    table = DOC.split(header, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    seen: dict[str, dict[str, tuple[str, float]]] = {"cleanrl": {}, "sb3": {}}
    for line in table:
        cells = _cells(line)
        key = cells[0].strip("`")
        assert cells[1] == f"`{namespaced(key)}`", line
        for library, cell in zip(("cleanrl", "sb3"), cells[2:4]):
            m = re.fullmatch(r"`([^`]+)`(?: \(x(-?\d+)\))?", cell)
            if m:
                seen[library][key] = (m.group(1), float(m.group(2) or 1))
            else:
                assert cell == "", line
    assert seen == ALIASES
