"""One rollout layout end to end: a stack's runs collect into the rows of one stacked buffer,
GAE reads and writes that buffer whole, and the update reads it without a copy; what a run
changes for its update (a stale rollout's proximal policy and weights, advantages normalised
over the rollout: a call per run, whose float sums torch splits by its threads for a long
rollout) is copied, and only that."""

import numpy as np
import pytest

from klppo import rl
from klppo.rl.engine import learn
from klppo.rl.engine.rundirs import train_batched
from tests.rl.test_engine import assert_engines_agree, config

PLAIN = dict(objective="clip", ppo=dict(norm_adv="minibatch"))
STALE = dict(objective="clip", ppo=dict(norm_adv="none", staleness=1,
                                        mismatch_correction="tis"))
ROLLOUT_NORM = dict(objective="kl_penalty", ppo=dict(norm_adv="rollout"))  # (the presets')


def _spy(monkeypatch) -> list[dict[str, bool]]:
    """Per update of a stack: per field, whether its arrays are the stacked rollout's."""
    seen: list[dict[str, bool]] = []
    fill = learn.Rollouts.fill

    def spy(self, R, updates, stacked=None):
        fill(self, R, updates, stacked)
        assert stacked is not None  # single-agent runs: their rollouts are a stack's rows
        seen.append({name: np.shares_memory(self.arrays[name], getattr(
            stacked, learn.Rollouts.STACKED[name]).numpy()) for name in learn.Rollouts.FIELDS})
    monkeypatch.setattr(learn.Rollouts, "fill", spy)
    return seen


@pytest.mark.parametrize("runs, copied", [
    ([PLAIN, PLAIN], set()),
    ([PLAIN], set()),
    ([PLAIN, STALE], {"logp", "params"}),
    ([ROLLOUT_NORM, PLAIN], {"adv"}),
], ids=["group", "alone", "stale", "rollout-norm"])
def test_the_update_reads_the_collected_rollout_itself(tmp_path, monkeypatch, runs, copied):
    seen = _spy(monkeypatch)
    res = train_batched([config(tmp_path / f"r{i}", seed=i, steps=1536, **v)
                         for i, v in enumerate(runs)])
    assert all(r.status == "finished" for r in res) and len(seen) == 3
    for fields in seen[1:]:  # (a stale run's first rollout is its current policy's)
        assert {name for name, same in fields.items() if not same} == copied


def test_runs_that_copy_part_of_the_rollout_train_in_a_group_as_alone(tmp_path):
    """A stale run's proximal log-probabilities and a run's rollout-normalised advantages
    reach the update beside runs that read the stacked rollout itself."""
    runs = [PLAIN, STALE, ROLLOUT_NORM]
    grouped = train_batched([config(tmp_path / f"g{i}", seed=i, steps=2048, **v)
                             for i, v in enumerate(runs)])
    alone = [rl.train(config(tmp_path / f"a{i}", seed=i, steps=2048, **v))
             for i, v in enumerate(runs)]
    assert_engines_agree(grouped, alone)
