"""Run directories: layout, effective config, metadata, atomic files.

```
{run_dir}/
  config.yaml        the effective configuration (what actually ran)
  metadata.json      klppo version and git commit, package versions, command line, host, start
  metrics.jsonl      one JSON object per iteration, flushed as written
  checkpoint.pt      latest checkpoint (written atomically: temp file + rename)
  status.json        running / finished / failed (with the error) / interrupted
  events.*           TensorBoard events, when tensorboard is installed
  .lock              held (fcntl.flock) by the one process writing the run; names that process
```
"""

from __future__ import annotations

import errno
import fcntl
import functools
import importlib.metadata
import json
import os
import platform
import socket
import stat
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from klppo.runs.atomic import atomic_write_bytes
from klppo.runs.configfile import InputError, InputFileError, parse_yaml, read_text
from klppo.runs.errors import UserInputError
from klppo.runs.owned import is_run_temp
from klppo.runs.paths import check_writable

__all__ = ["DirBusyError", "DirLock", "default_run_name", "create_run_dir",
           "remove_stale_temp_files", "write_metadata", "record_resume", "write_yaml",
           "read_yaml", "write_json_atomic", "write_status", "read_status", "atomic_write_bytes",
           "write_refused"]


def default_run_name(env: str, objective: str, seed: int) -> str:
    """``{env}__{objective}__{seed}__{time}`` with the env id made filesystem-safe."""
    safe_env = env.replace("/", "-").replace(":", "-")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{safe_env}__{objective}__{seed}__{stamp}"


class DirBusyError(UserInputError, RuntimeError):
    """Another live process holds the directory's lock; the message names it."""


class DirLock:
    """An OS-level exclusive lock on ``directory/.lock`` for one writer at a time.

    ``fcntl.flock`` is released by the kernel when the holder exits, however it exits (a
    SIGKILLed run leaves no stale lock). The file records the holder's pid, command line and
    start time so that a second process can say who holds it. Use as a context manager or call
    :meth:`acquire` / :meth:`release`.
    """

    def __init__(self, directory: str | Path, what: str = "run directory") -> None:
        self.directory = Path(directory)
        self.what = what
        self.path = self.directory / ".lock"
        self._fd: int | None = None

    def acquire(self) -> DirLock:
        try:  # never through a link: a run directory must not make klppo write elsewhere
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
            fd = -1
        if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
            if fd >= 0:
                os.close(fd)
            raise DirBusyError(f"{self.path}: not a plain file (a link, a directory or a "
                               f"device); klppo writes only its own lock file there: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DirBusyError(f"{self.what} {str(self.directory)!r} is in use by {holder}; "
                               f"wait for it to finish or stop it first") from None
        info = (f"pid {os.getpid()} on {socket.gethostname()} ({' '.join(sys.argv)[:300]}), "
                f"since {datetime.now().isoformat(timespec='seconds')}")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode(), 0)
        except OSError as e:  # a full disk: no lock without its holder's name
            os.close(fd)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def create_run_dir(path: str | Path, unique: bool = False) -> Path:
    """Create a run directory; refuse one that already holds a run.

    ``unique`` (default run names): never reuse an existing directory; a name taken by a run
    started in the same second gets a ``-2``, ``-3``, ... suffix (``mkdir`` is atomic, so two
    processes never get the same one).
    """
    p = Path(path)
    check_writable(p)
    if unique:
        p.parent.mkdir(parents=True, exist_ok=True)
        for k in range(1, 10_000):
            candidate = p if k == 1 else p.with_name(f"{p.name}-{k}")
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                continue
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(candidate)) from None
        raise FileExistsError(f"out={str(p)!r}: no free run name")
    check_reusable(p)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(p)) from None
    return p


#: the files of a run directory (any of them: a run lives there)
RUN_FILES = ("metrics.jsonl", "config.yaml", "checkpoint.pt", "metadata.json", "status.json")


def check_reusable(p: Path, keep: tuple[str, ...] = ()) -> None:
    """Refuse (``FileExistsError``, one line) an existing directory that holds a run (even one
    without metrics yet) or anything else that is not ours; allow a new or empty one, or one
    with only the lock and temp files of a start that was killed before it wrote its config
    (and the names in ``keep``: files of the run's own made before it). ``klppo train`` and
    ``klppo rlhf`` check a new run's ``--out`` with it."""
    if not p.is_dir():
        return
    names = sorted(c.name for c in p.iterdir())
    held = [n for n in RUN_FILES if n in names]
    if "metrics.jsonl" in held:
        raise FileExistsError(f"out={str(p)!r} already holds a run; use --resume {p} to continue "
                              f"it or choose another --out")
    if held:
        raise FileExistsError(f"out={str(p)!r} holds a run that has no metrics yet "
                              f"({', '.join(held)}); use --resume {p} to continue it or choose "
                              f"another --out")
    other = [n for n in names if n != ".lock" and n not in keep and not is_run_temp(n)]
    if other:
        raise FileExistsError(f"out={str(p)!r} is not empty ({len(other)} entries, e.g. "
                              f"{other[0][:60]!r}) and not a klppo run; choose a new or empty "
                              f"directory")


def write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, default=str).encode())


def write_yaml(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, yaml.safe_dump(obj, sort_keys=False).encode())


def remove_stale_temp_files(run_dir: Path) -> list[str]:
    """Delete the temp files of writes that a killed process left half done (call only while
    holding the directory's lock: then no live writer owns them). Returns their names."""
    gone = []
    for p in sorted(Path(run_dir).iterdir()):
        if is_run_temp(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            gone.append(p.name)
    return gone


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML file (YAML 1.2 numbers); any problem is a one-line
    :class:`~klppo.runs.configfile.InputFileError` naming ``what`` and the file."""
    name = f"{what}={str(path)!r}"
    try:
        return parse_yaml(read_text(path, what), name)
    except InputError as e:
        raise InputFileError(str(e)) from None


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions(names: tuple[str, ...]) -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def _cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo; elsewhere platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU model, logical CPUs, architecture, and the GPU
    (None when torch is not loaded or has no CUDA device). Float results differ across
    machines, so every run records this."""
    gpu = None
    torch = sys.modules.get("torch")  # never imported here just to ask
    try:
        if torch is not None and torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken CUDA set-up is not the run's problem
        gpu = None
    return {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "arch": platform.machine(),
            "gpu": gpu}


def _klppo_version() -> str | None:
    """The installed klppo's version, from its package metadata (runs/ imports nothing above
    it, so not ``klppo.__version__``)."""
    try:
        return importlib.metadata.version("klppo")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _process_provenance() -> tuple[tuple[str, Any], ...]:
    """What does not change while this process runs, asked once (a group of 20 runs asked the
    package metadata 20 times, 36 ms each)."""
    return (("klppo_version", _klppo_version()), ("git_commit", _git_commit()),
            ("packages", tuple(_versions(("torch", "numpy", "gymnasium", "tyro", "mujoco",
                                          "box2d", "transformers", "trl", "peft")).items())),
            ("python", sys.version.split()[0]), ("host", socket.gethostname()),
            ("platform", platform.platform()))


def _provenance() -> dict[str, Any]:
    """This process: klppo version and commit, package versions, command line, machine."""
    fixed = dict(_process_provenance())
    return {"klppo_version": fixed["klppo_version"], "git_commit": fixed["git_commit"],
            "packages": dict(fixed["packages"]), "python": fixed["python"],
            "command_line": list(sys.argv), "host": fixed["host"],
            "platform": fixed["platform"], "machine": machine()}


def write_metadata(run_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {**_provenance(), "start_time": datetime.now(timezone.utc).isoformat(),
            **(extra or {})}
    write_json_atomic(run_dir / "metadata.json", meta)
    return meta


def record_resume(run_dir: Path, iteration: int, **extra: Any) -> dict[str, Any]:
    """Append this process to ``metadata.json``'s ``resumes`` (the iteration it continues
    from, the time, and the same provenance as the start), so a run that ran part of its
    iterations on another machine or software says so. Returns the metadata."""
    path = run_dir / "metadata.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # unreadable: keep what is known from now on
        meta = {"kind": "train", "note": "metadata.json was unreadable at a resume"}
    meta.setdefault("resumes", []).append(
        {"iteration": int(iteration), "time": datetime.now(timezone.utc).isoformat(),
         **_provenance(), **extra})
    write_json_atomic(path, meta)
    return meta


#: a file of this many bytes (a disk block) kept beside status.json: on a full disk it is
#: deleted to make room for the final status, so status.json itself is plain JSON
STATUS_RESERVE = 4096
RESERVE_FILE = ".status.reserve"


def write_status(run_dir: Path, state: str, **fields: Any) -> None:
    """Write ``status.json`` atomically. On a full disk, delete the run's reserve file
    (:data:`RESERVE_FILE`) and write again; with no reserve left, write the state, iteration and
    error in place over the previous file, within its size."""
    path = run_dir / "status.json"
    record = {"state": state, "time": time.time(), **fields}
    data = json.dumps(record, indent=2, default=str).encode() + b"\n"
    try:
        atomic_write_bytes(path, data)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        if not _release_reserve(run_dir):
            if not path.exists():
                raise
            _overwrite_in_place(path, record)
            return
        atomic_write_bytes(path, data)
    _keep_reserve(run_dir)


def _release_reserve(run_dir: Path) -> bool:
    """Delete the reserve file; whether there was one."""
    try:
        (run_dir / RESERVE_FILE).unlink()
        return True
    except FileNotFoundError:
        return False


def _keep_reserve(run_dir: Path) -> None:
    """Make the reserve file when it is missing and there is room (never an error)."""
    reserve = run_dir / RESERVE_FILE
    if reserve.exists():
        return
    try:
        with open(reserve, "xb") as f:
            f.write(b"\0" * STATUS_RESERVE)
            f.flush()
            os.fsync(f.fileno())
    except FileExistsError:
        return
    except OSError:  # no room (or a file-size limit): no reserve this time
        reserve.unlink(missing_ok=True)


def _overwrite_in_place(path: Path, record: dict[str, Any]) -> None:
    """The state, iteration and error over the previous status, within its size (the rest
    blanked)."""
    room = path.stat().st_size
    short: dict[str, Any] = {k: record[k] for k in ("state", "time", "iteration", "error")
                             if k in record}
    short["note"] = "written in place on a full disk (the traceback is not kept)"
    data = json.dumps(short, default=str)
    if len(data) > room:
        short["error"] = str(short.get("error", ""))[: max(0, room - len(data) - 10)]
        data = json.dumps(short, default=str)
    with open(path, "r+b") as f:
        f.write(data.ljust(room)[:room].encode())
        f.flush()
        os.fsync(f.fileno())


def write_refused(run_dir: Path, error: str) -> None:
    """``status.json`` of a resume refused before it ran: 'failed' with the reason, and the
    iterations the run's last status recorded (its checkpoint is untouched; 0 when unknown)."""
    try:
        prev = read_status(run_dir)
    except OSError:  # a folder named status.json: the write below says so
        prev = None
    kept = {k: prev[k] for k in ("iteration", "checkpoint_iteration")
            if isinstance(prev, dict) and type(prev.get(k)) is int}
    write_status(run_dir, "failed", error=error, **{"iteration": 0, **kept})


def read_status(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / "status.json"
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except (ValueError, RecursionError):
        return None
