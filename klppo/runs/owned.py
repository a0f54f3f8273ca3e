"""What a run, sweep or tuning-study directory owns, and the check every command that writes
files makes before any work: a destination that would replace (or create inside) a file that
a run or sweep owns is refused in one line, whatever ``--force`` says (``--force`` replaces only
the command's own earlier output).

Owned (by name, at the top of the directory; everything below an owned folder too):

* a run directory (``config.yaml`` plus any of ``metrics.jsonl``, ``status.json``,
  ``checkpoint.pt``, ``metadata.json``; ``klppo train`` and ``klppo rlhf`` alike):
  :data:`RUN_OWNED`, TensorBoard's ``events.out.tfevents.*`` and the temp files of atomic
  writes (``.NAME.tmp*``; ``metrics.jsonl.tmp``, the one plain ``NAME.tmp`` klppo writes);
* a sweep directory (``runs/`` plus ``spec.yaml`` or ``index.json``): :data:`SWEEP_OWNED`;
  everything under ``runs/`` belongs to the runs: only an existing ``runs/NAME`` directory
  may be a destination (a run directory, judged as one);
* a tuning study (``tune.yaml`` or ``study.journal``): :data:`STUDY_OWNED`, its ``runs/`` as
  a sweep's.

Paths are resolved (symlinks, ``..``) before deciding.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["RUN_OWNED", "SWEEP_OWNED", "STUDY_OWNED", "owned_reason", "container_reason",
           "kind_of", "is_run_temp", "inside_owned"]

#: what a run directory owns: name -> what it is to the run
RUN_OWNED = {
    "config.yaml": "its config",
    "metadata.json": "its provenance record",
    "status.json": "its status",
    ".status.reserve": "the room kept for its final status on a full disk",
    "metrics.jsonl": "its metrics",
    "checkpoint.pt": "its checkpoint",
    "spaces.json": "its observation and action spaces",
    ".lock": "its lock",
    "worker.log": "its worker's log",
    "wandb": "its Weights & Biases files",
    "policy": "its exported policy",
    "best": "its best evaluated policy",
    "events.out.tfevents.*": "its TensorBoard events",
}
#: what a sweep directory owns
SWEEP_OWNED = {
    "spec.yaml": "its spec",
    "index.json": "its index of runs",
    ".lock": "its lock",
    "runs": "its runs' directories",
}
#: what a tuning study (``klppo tune``) owns
STUDY_OWNED = {
    "study.journal": "its Optuna journal",
    "study.journal.lock": "its Optuna journal's lock",
    "tune.yaml": "its spec",
    "index.json": "its index of trials and runs",
    "best_config.yaml": "its best trial's config",
    ".lock": "its lock",
    "runs": "its trials' run directories",
}
#: any of these next to config.yaml: a run lives there
_RUN_MARKS = ("metrics.jsonl", "status.json", "checkpoint.pt", "metadata.json")
#: the temp files of atomic writes: ``.NAME.tmpPID`` (:func:`klppo.runs.atomic.temp_name`),
#: and ``metrics.jsonl.tmp`` (:func:`klppo.runs.metrics.rewrite_metrics`); a user's
#: ``policy.tmp`` is theirs
_TEMP = (re.compile(r"^\.(.+)\.tmp\d*$"), re.compile(r"^(metrics\.jsonl)\.tmp$"))


def kind_of(d: Path) -> str | None:
    """'run', 'sweep' or 'tuning study' for a directory that holds one, else None."""
    try:
        if not d.is_dir():
            return None
        if (d / "config.yaml").is_file() and any((d / n).exists() for n in _RUN_MARKS):
            return "run"
        if (d / "tune.yaml").is_file() or (d / "study.journal").is_file():
            return "tuning study"
        if (d / "runs").is_dir() and ((d / "spec.yaml").is_file()
                                      or (d / "index.json").is_file()):
            return "sweep"
    except OSError:  # unreadable: nothing known to be owned there
        return None
    return None


def _owned(name: str, table: dict[str, str]) -> str | None:
    """What ``name`` (a top-level entry, or a glob pattern of the names a command writes) is
    to its owner, or None when nothing owned matches it."""
    for pattern, what in table.items():
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(pattern, name):
            return what
    for temp in _TEMP:
        m = temp.match(name)
        if m:
            of = _owned(m.group(1), table)
            if of is not None:
                return f"a temp file of {of}"
    return None


def is_run_temp(name: str) -> bool:
    """Whether ``name`` is the temp file of an atomic write of a file a run owns
    (``.NAME.tmpPID``, ``metrics.jsonl.tmp``): what a killed write leaves, and nothing a user
    named."""
    what = _owned(name, RUN_OWNED)
    return what is not None and what.startswith("a temp file of")


def _shown(p: Path) -> str:
    """``p`` relative to the working directory when it lies inside it, else absolute."""
    try:
        return str(p.relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(p)


def _judge(target: Path, is_dest_dir: bool) -> tuple[str, str | None, Path, str] | None:
    """``(the owned name, what it is to its owner or None for the owner's directory itself,
    the owner's directory, its kind)`` when ``target`` (resolved) is owned by a run, sweep or
    study, else None. ``is_dest_dir``: ``target`` is the destination directory itself (not a
    file written into it)."""
    if not is_dest_dir:
        kind = kind_of(target)
        if kind is not None:
            return (target.name, None, target, kind)
    for owner in target.parents:
        kind = kind_of(owner)
        under_runs = owner.parent.name == "runs" and kind_of(owner.parent.parent) in (
            "sweep", "tuning study")
        if kind is None and not under_runs:
            continue
        rel = target.relative_to(owner).parts
        if kind in ("sweep", "tuning study"):
            table = SWEEP_OWNED if kind == "sweep" else STUDY_OWNED
            if rel[0] == "runs":
                # below runs/: an existing run's directory as the destination, or what lies
                # inside it (judged as that run's, at the nearer owner)
                if len(rel) > 1 and (owner / "runs" / rel[1]).is_dir() \
                        and (len(rel) > 2 or is_dest_dir):
                    continue
                return ("runs/", table["runs"], owner, kind)
            what = _owned(rel[0], table)
        else:  # a run: recognised, or any directory under a sweep's runs/
            kind = "run"
            what = _owned(rel[0], RUN_OWNED)
        if what is not None:
            folder = len(rel) > 1 or rel[0] in ("wandb", "policy")
            return (rel[0] + ("/" if folder else ""), what, owner, kind)
    return None


def owned_reason(dest: str | os.PathLike[str], own: Iterable[str] | None = None,
                 what: str = "--out") -> str | None:
    """None when a command may write to ``dest``, else one line saying why not, naming
    ``what`` (the flag or argument), its value, the owner and what the file is to it.

    ``own`` None: ``dest`` is a file the command writes. Otherwise ``dest`` is a directory the
    command writes into (creating it if needed) and ``own`` the names (relative paths; glob
    patterns allowed) of the files and folders it writes there: a run or sweep directory is a
    fine destination when none of them is owned (``klppo eval RUN`` writes ``RUN/eval.json``);
    an owned name, a run's ``wandb/`` or a sweep's ``runs/`` is not (only an existing
    ``runs/NAME`` directory, a run directory, is). Paths are resolved (symlinks, ``..``)
    first."""
    given = Path(dest)
    checks: list[tuple[Path, Path, bool]] = [(given, given.resolve(), own is not None)]
    checks += [(given / n, (given.resolve() / n).resolve(), False) for n in own or ()]
    for written, path, is_dest_dir in checks:
        found = _judge(path, is_dest_dir)
        if found is None:
            continue
        name, thing, owner, kind = found
        head, remedy = f"{what}={str(dest)!r}", f"choose a path outside the {kind} directory"
        if path != Path(os.path.abspath(written)):  # through a link (or a '..' past one)
            head += (f" (which leads to {_shown(path)})" if written == given
                     else f" ({written} leads to {_shown(path)})")
            remedy = f"choose a path that does not lead into the {kind} directory"
        if thing is None:
            return f"{head}: is the {kind} directory {_shown(owner)} itself; {remedy}"
        return f"{head}: {name} belongs to the {kind} in {_shown(owner)} ({thing}); {remedy}"
    return None


def container_reason(dest: str | os.PathLike[str], kind: str,
                     what: str = "--out") -> str | None:
    """:func:`owned_reason` for a command that owns the directory it writes: ``kind`` 'sweep'
    (``klppo sweep``) or 'tuning study' (``klppo tune``). A directory already of that kind is
    the command's own earlier output (it continues there); anything else may become one only
    where none of the kind's files would land on a file something else owns."""
    if kind_of(Path(dest).resolve()) == kind:
        return None
    return owned_reason(dest, (SWEEP_OWNED if kind == "sweep" else STUDY_OWNED), what)


def inside_owned(out: str | Path, flag: str = "out") -> str | None:
    """Why a new run may not be made at ``out`` (one line), or None: ``out`` lies inside what
    a run, sweep or study owns (``RUN/policy``, ``SWEEP/runs/NEW``). The CLI checks a user's
    ``--out`` with it; a sweep or study makes its runs under its own ``runs/`` itself. A new
    run inside another run's directory (``RUN/sub``) is refused too: its files would mix with
    that run's and a report of it would read both."""
    reason = owned_reason(out, (), flag)
    if reason is not None:
        return reason
    target = Path(out).resolve()
    for parent in target.parents:
        if kind_of(parent) == "run" and _made_by_klppo(parent):
            return (f"{flag}={str(out)!r}: lies inside the run in {parent}; choose a path "
                    f"outside the run directory")
    return None


def _made_by_klppo(run_dir: Path) -> bool:
    """Whether ``run_dir``'s ``metadata.json`` is klppo's (it names klppo's version): a user's
    project folder with a ``config.yaml`` and a ``metadata.json`` of its own is no run."""
    try:
        meta = json.loads((run_dir / "metadata.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and "klppo_version" in meta
