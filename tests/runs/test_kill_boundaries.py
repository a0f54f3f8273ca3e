"""No window without a resume: a run killed (``os._exit``, as kill -9: no handler, no finally)
just before or just after each file write of its first iterations (config, metadata, spaces,
status, each metrics line, each checkpoint: a group's written together) leaves a directory that
resumes to exactly the uninterrupted run's metrics, for a run alone, a group of runs and an
RLHF run. A kill before the run's config exists leaves a directory a new run may take over."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from klppo.rl.trainer import TIMING_KEYS

ROOT = Path(__file__).resolve().parents[2]

#: the child: count the writes, die at the K-th (before or after it), else run to the end and
#: print how many writes there were
CHILD = r"""
import json, os, sys
K, PHASE, KIND, OUT, MODEL = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
from klppo.runs import atomic, checkpoint, lifecycle, loop, metrics, rundir
count = [0]

def boundary(fn):
    def wrapped(*a, **kw):
        count[0] += 1
        if count[0] == K and PHASE == "before":
            os._exit(9)
        out = fn(*a, **kw)
        if count[0] == K and PHASE == "after":
            os._exit(9)
        return out
    return wrapped

rundir.atomic_write_bytes = checkpoint.atomic_write_bytes = boundary(rundir.atomic_write_bytes)
loop.atomic_write_all = lifecycle.atomic_write_all = boundary(atomic.atomic_write_all)
metrics.JsonlSink.write = boundary(metrics.JsonlSink.write)
sys.path.insert(0, os.getcwd())
from tests.runs.test_kill_boundaries import start
start(KIND, OUT, MODEL)
print(json.dumps({"writes": count[0]}))
"""


def _train_config(out, seed=0):
    import dataclasses

    from klppo import rl

    return dataclasses.replace(rl.preset("klip/cartpole"), out=str(out), seed=seed,
                               total_steps=2048, checkpoint_every=2, tensorboard=False)


def _rlhf_config(out, model):
    from klppo.lm.config import RLHFConfig
    from tests.lm.conftest import TINY

    return RLHFConfig(model=str(model), out=str(out), **{**TINY, "iterations": 4,
                                                          "checkpoint_every": 2})


def _dirs(out):
    return [Path(out) / "a", Path(out) / "b"]


def start(kind, out, model):
    """Train ``kind`` (train, group, rlhf) from scratch into ``out``."""
    if kind == "train":
        from klppo import rl

        rl.train(_train_config(out))
    elif kind == "group":
        from klppo.rl.engine.rundirs import train_batched

        train_batched([_train_config(d, seed) for seed, d in enumerate(_dirs(out))])
    else:
        from klppo.lm.rlhf import rlhf

        rlhf(_rlhf_config(out, model), reward=lambda p, r: [float(len(x) % 3) for x in r])


def resume(kind, out, model):
    """Continue ``kind`` in ``out``; its metrics, per run directory."""
    if kind == "train":
        from klppo import rl

        return [rl.resume(out).metrics]
    if kind == "group":
        from klppo.rl.engine.rundirs import train_group

        return [r.metrics for r in train_group(_dirs(out))]
    from klppo.lm.rlhf import resume_rlhf

    return [resume_rlhf(out, reward=lambda p, r: [float(len(x) % 3) for x in r]).metrics]


def _run(k, phase, kind, out, model):
    return subprocess.run([sys.executable, "-c", CHILD, str(k), phase, kind, str(out),
                           str(model)], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _strip(runs):
    from klppo.lm.rlhf import TIMING_KEYS as LM_TIMING

    drop = set(TIMING_KEYS) | set(LM_TIMING)
    return [[{k: v for k, v in m.items() if k not in drop} for m in ms] for ms in runs]


def _created(kind, out):
    """Whether the kill left the run's config (a run to resume) in every run directory."""
    dirs = _dirs(out) if kind == "group" else [Path(out)]
    return all((d / "config.yaml").is_file() for d in dirs)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["train", "group", "rlhf"])
def test_a_kill_at_any_write_boundary_resumes_exactly(kind, tmp_path):
    model = ""
    if kind == "rlhf":
        pytest.importorskip("transformers")
        from tests.lm.conftest import make_tiny_model

        model = make_tiny_model(tmp_path / "model")
    full = _run(10**9, "never", kind, tmp_path / "full", model)
    assert full.returncode == 0, full.stderr[-2000:]
    writes = json.loads(full.stdout.strip().splitlines()[-1])["writes"]
    want = _strip(resume(kind, tmp_path / "full", model))  # a finished run: its metrics
    assert writes >= 8
    for k in range(1, writes + 1):
        for phase in ("before", "after"):
            out = tmp_path / f"k{k}{phase}"
            died = _run(k, phase, kind, out, model)
            assert died.returncode == 9, (k, phase, died.stderr[-2000:])
            assert _strip(recover(kind, out, model)) == want, (k, phase)


def recover(kind, out, model):
    """What the messages tell a user to do after the kill: resume each run directory that holds
    its config (one that has none yet is taken over by a new run); the runs' metrics."""
    if _created(kind, out):
        return resume(kind, out, model)
    if kind != "group":  # killed while the directory was being made
        start(kind, out, model)
        return [[json.loads(x) for x in (Path(out) / "metrics.jsonl").open()]]
    from klppo import rl
    from klppo.rl.engine.rundirs import train_group

    got = {}
    held = [d for d in _dirs(out) if (d / "config.yaml").is_file()]
    for d, r in zip(held, train_group(held) if held else []):
        got[d] = r.metrics
    for seed, d in enumerate(_dirs(out)):
        if d not in got:
            got[d] = rl.train(_train_config(d, seed)).metrics
    return [got[d] for d in _dirs(out)]


def _limited(limit, kind, out, model):
    """``start`` in a child whose files may not grow past ``limit`` bytes (``ulimit -f``: Python
    ignores SIGXFSZ, so the write that would pass it fails with EFBIG)."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    code = ("import sys; sys.path.insert(0, '.'); from tests.runs.test_kill_boundaries import "
            f"start; start({kind!r}, {str(out)!r}, {str(model)!r})")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, preexec_fn=cap)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["train", "group", "rlhf"])
def test_a_file_size_limit_fails_the_run_with_its_reason_and_it_resumes_exactly(kind, tmp_path):
    model = ""
    if kind == "rlhf":
        pytest.importorskip("transformers")
        from tests.lm.conftest import make_tiny_model

        model = make_tiny_model(tmp_path / "model")
    start(kind, tmp_path / "full", model)
    want = _strip(resume(kind, tmp_path / "full", model))
    largest = max(p.stat().st_size for p in (tmp_path / "full").rglob("*") if p.is_file())
    for limit in (2048, largest // 2):
        out = tmp_path / f"limit{limit}"
        failed = _limited(limit, kind, out, model)
        # a run alone raises; a group records each run's failure and returns
        assert (failed.returncode == 0) is (kind == "group"), (limit, failed.stderr[-2000:])
        for d in _dirs(out) if kind == "group" else [out]:
            status = json.loads((d / "status.json").read_text())
            assert status["state"] == "failed" and "File too large" in status["error"], limit
        assert _strip(recover(kind, out, model)) == want, limit
