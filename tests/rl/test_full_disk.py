"""A real full disk (a small tmpfs, where this machine lets the tests mount one): whatever write
fails first (a metrics line, a checkpoint, the status), the run ends 'failed' with a one-line
reason naming the file, metrics.jsonl holds whole lines only, no temp file is left, and once
there is room again the run resumes to the uninterrupted run's metrics (issue #19)."""

import dataclasses
import errno
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

import klppo.rl as rl
from klppo.rl.trainer import TIMING_KEYS


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "disk"
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` up to ``leave`` free bytes."""
    filler = disk / f"filler-{uuid.uuid4().hex}"
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave))
            f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def _cfg(out: Path, every: int = 1) -> rl.TrainConfig:
    return dataclasses.replace(rl.preset("klip/cartpole"), total_steps=4096, tensorboard=False,
                               checkpoint_every=every, out=str(out))


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


#: (iteration after which the disk fills, bytes left free, checkpoint_every): the checkpoint
#: write fails (the first three; the fourth and fifth: the first checkpoint, after the first
#: metrics line), or a metrics line half way (the last, before any checkpoint)
CASES = [(2, 0, 1), (2, 4096, 1), (2, 100_000, 1), (1, 0, 1), (1, 4096, 1), (1, 0, 4)]


@pytest.mark.parametrize("at, leave, every", CASES)
def test_a_full_disk_mid_run_fails_cleanly_and_resumes_exactly(small_disk, tmp_path, at, leave,
                                                               every):
    full = _strip(rl.train(_cfg(tmp_path / "full")).metrics)
    run, fillers = small_disk / "run", []

    def fill(m):
        if m["iteration"] == at:
            fillers.append(_fill(small_disk, leave))

    with pytest.raises(rl.TrainingError) as e:
        rl.train(_cfg(run, every), on_iteration=fill)
    msg = str(e.value)
    assert "\n" not in msg and "No space left on device" in msg and str(run) in msg, msg
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and "No space left" in status["error"]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]
    for f in fillers:
        f.unlink()
    assert _strip(rl.resume(run).metrics) == full
    assert (run / ".status.reserve").stat().st_size == 4096  # kept again once there is room
    assert (run / "status.json").read_text().endswith("}\n")  # plain JSON, no padding


def test_a_full_disk_at_start_leaves_nothing_and_names_the_file(small_disk):
    _fill(small_disk, 0)
    with pytest.raises(OSError) as e:
        rl.train(_cfg(small_disk / "run"))
    assert e.value.errno == errno.ENOSPC and str(small_disk / "run") in str(e.value)
    assert not (small_disk / "run").exists()


def test_the_final_status_takes_the_reserved_room_on_a_full_disk(small_disk):
    """status.json is plain JSON; a block kept beside it (``.status.reserve``) is given up for
    the final status when the disk is full, then the previous status is overwritten in place."""
    from klppo.runs.rundir import write_status

    run = small_disk / "run"
    run.mkdir()
    write_status(run, "running", iteration=3)
    assert (run / ".status.reserve").stat().st_size == 4096
    filler = _fill(small_disk, 0)
    error = "OSError: [Errno 28] No space left on device: " + "x" * 300
    write_status(run, "failed", iteration=3, error=error, traceback="Traceback ...")
    status = json.loads((run / "status.json").read_text())
    assert status["error"] == error and status["traceback"] == "Traceback ..."
    (run / ".status.reserve").unlink(missing_ok=True)  # (remade when the old status was freed)
    filler.unlink()
    _fill(small_disk, 0)  # full again, no reserve: the state goes in place, shortened
    write_status(run, "interrupted", iteration=4, error=error)
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "interrupted" and "in place" in status["note"]
