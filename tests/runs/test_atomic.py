"""Atomic writes (klppo.runs.atomic): every file whole or its previous version, never a temp
file left, one file's failure its own, and a batch's fsyncs side by side."""

import threading

import pytest

from klppo.runs import atomic


def files(tmp_path, n, text=b"new"):
    return [(tmp_path / f"f{k}", text + b"%d" % k) for k in range(n)]


def sets(tmp_path, n):
    """One file per set (per run), as a group's checkpoints."""
    return [[f] for f in files(tmp_path, n)]


def leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.rglob(".*.tmp*"))


def test_every_file_is_written_over_its_previous_version(tmp_path):
    for p, _ in files(tmp_path, 3):
        p.write_bytes(b"old")
    assert atomic.atomic_write_all(sets(tmp_path, 3)) == [None] * 3
    assert [p.read_bytes() for p, _ in files(tmp_path, 3)] == [b"new0", b"new1", b"new2"]
    assert leftovers(tmp_path) == []


def test_a_file_that_cannot_be_written_fails_alone_naming_its_path(tmp_path):
    batch = sets(tmp_path, 3)
    batch[1] = [(tmp_path / "missing" / "f1", b"x")]
    errors = atomic.atomic_write_all(batch)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], OSError) and errors[1].filename == str(tmp_path / "missing" / "f1")
    assert (tmp_path / "f0").read_bytes() == b"new0" and (tmp_path / "f2").read_bytes() == b"new2"
    with pytest.raises(OSError, match="missing"):
        atomic.atomic_write_bytes(tmp_path / "missing" / "f", b"x")


def test_a_failed_fsync_keeps_the_previous_file_and_no_temp_file(tmp_path, monkeypatch):
    for p, _ in files(tmp_path, 2):
        p.write_bytes(b"old")
    real = atomic._sync

    def sync(tmp):
        if tmp.name.startswith(".f1."):
            raise OSError(28, "No space left on device")
        real(tmp)

    monkeypatch.setattr(atomic, "_sync", sync)
    errors = atomic.atomic_write_all(sets(tmp_path, 2))
    assert errors[0] is None and errors[1].errno == 28
    assert (tmp_path / "f0").read_bytes() == b"new0" and (tmp_path / "f1").read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_an_interruption_leaves_the_previous_files_and_no_temp_file(tmp_path, monkeypatch):
    for p, _ in files(tmp_path, 3):
        p.write_bytes(b"old")

    def sync(tmp):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "_sync", sync)
    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write_all(sets(tmp_path, 3))
    assert [p.read_bytes() for p, _ in files(tmp_path, 3)] == [b"old"] * 3
    assert leftovers(tmp_path) == []


def test_a_batchs_fsyncs_are_in_flight_together(tmp_path, monkeypatch):
    """Each fsync waits until three are in flight at once: one after another would never
    get there (the barrier breaks after 10 s)."""
    barrier, real = threading.Barrier(3, timeout=10), atomic._sync

    def sync(tmp):
        barrier.wait()
        real(tmp)

    monkeypatch.setattr(atomic, "_sync", sync)
    assert atomic.atomic_write_all(sets(tmp_path, 3)) == [None] * 3


def test_a_set_whose_file_fails_keeps_all_its_previous_files(tmp_path):
    """A run's files are renamed only when every one of them was written and synced."""
    (tmp_path / "a").write_bytes(b"old")
    errors = atomic.atomic_write_all([[(tmp_path / "a", b"new"),
                                       (tmp_path / "missing" / "b", b"new")],
                                      [(tmp_path / "c", b"new")]])
    assert errors[0].filename == str(tmp_path / "missing" / "b") and errors[1] is None
    assert (tmp_path / "a").read_bytes() == b"old" and (tmp_path / "c").read_bytes() == b"new"
    assert leftovers(tmp_path) == []


def test_without_threads_the_fsyncs_run_one_after_another(tmp_path, monkeypatch):
    """A pid or thread limit (the pool cannot start a thread): every file is still written."""
    class NoThreads:
        def __init__(self, *a, **kw):
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(atomic, "ThreadPoolExecutor", NoThreads)
    assert atomic.atomic_write_all(sets(tmp_path, 3)) == [None] * 3
    assert [p.read_bytes() for p, _ in files(tmp_path, 3)] == [b"new0", b"new1", b"new2"]
