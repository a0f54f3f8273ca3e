"""`klppo rlhf --objective clip_cov --cov-selection random`: the paper's uniform draw of the
tokens that lose their gradient, from the run's sampling generator (so a resume is exact);
`top` (klppo's choice) draws nothing."""

import pytest

pytest.importorskip("transformers")

from klppo.core import covariance  # noqa: E402
from klppo.lm.config import ConfigError, RLHFConfig  # noqa: E402
from klppo.lm.config_checks import validate_rlhf  # noqa: E402
from klppo.lm.rlhf import RLHFError, resume_rlhf, rlhf  # noqa: E402
from tests.lm.conftest import TINY  # noqa: E402
from tests.lm.test_resume import Crash, reward, strip  # noqa: E402

#: a covariance window wide enough that every token is a candidate, a tenth of them chosen
WIDE = {"objective": "clip_cov", "cov_low": -1e9, "cov_high": 1e9, "cov_fraction": 0.1}


def _cfg(model, out, **kw):
    return RLHFConfig(model=str(model), out=str(out), **{**TINY, "iterations": 6, **WIDE, **kw})


@pytest.fixture
def draws(monkeypatch):
    seen = []
    select = covariance.select_top

    def spy(score, candidates, k, generator=None):
        mask = select(score, candidates, k, generator)
        top = select(score, candidates, k)
        seen.append((generator, bool((mask != top).any())))
        return mask

    monkeypatch.setattr(covariance, "select_top", spy)
    return seen


def test_random_draws_from_the_runs_generator_and_top_draws_nothing(tiny_model_dir, tmp_path,
                                                                    draws):
    rlhf(_cfg(tiny_model_dir, tmp_path / "top", iterations=2), reward=reward)
    assert draws and all(g is None for g, _ in draws)
    draws.clear()
    rlhf(_cfg(tiny_model_dir, tmp_path / "random", iterations=2, cov_selection="random"),
         reward=reward)
    assert draws and all(g is not None for g, _ in draws)
    assert any(differs for _, differs in draws)  # not the top-covariance tokens every time


def test_a_resume_with_the_random_draw_is_exact(tiny_model_dir, tmp_path):
    full = rlhf(_cfg(tiny_model_dir, tmp_path / "full", cov_selection="random"), reward=reward)
    run = tmp_path / "run"

    def crash(m):
        if m["iteration"] == 5:
            raise Crash("simulated crash")

    with pytest.raises(RLHFError):
        rlhf(_cfg(tiny_model_dir, run, cov_selection="random"), reward=reward,
             on_iteration=crash)
    assert strip(resume_rlhf(run, reward=reward).metrics) == strip(full.metrics)


def test_cov_selection_is_refused_where_nothing_reads_it():
    with pytest.raises(ConfigError, match=r"cov_selection='random': objective='clip' would "
                                          r"ignore it"):
        validate_rlhf(RLHFConfig(cov_selection="random"))
