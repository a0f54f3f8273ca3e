"""What both verl bridges check: numbers and counts verl hands over, controllers given by name
or object, and the checkpoint hooks that write a controller's state beside verl's."""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klppo.core.controllers import KLController, make_controller
from klppo.runs.errors import UserInputError
from klppo.runs.typecheck import short_repr


class VerlIntegrationError(UserInputError):
    """A controller or trainer the verl bridge cannot drive (raised before training)."""


def number(name: str, v: Any) -> float:
    """A finite real number, else :class:`VerlIntegrationError` naming the argument."""
    if isinstance(v, bool):
        raise VerlIntegrationError(f"{name}={v!r}: must be a finite number")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise VerlIntegrationError(f"{name}={short_repr(v)}: must be a finite number") from None
    if not math.isfinite(x):
        raise VerlIntegrationError(f"{name}={x!r}: must be a finite number")
    return x


def count(name: str, v: Any) -> int:
    """An integer >= 1 (numpy and torch integers too), else :class:`VerlIntegrationError`."""
    try:
        n = operator.index(v)
    except TypeError:
        raise VerlIntegrationError(f"{name}={short_repr(v)}: must be an integer >= 1") from None
    if isinstance(v, bool) or n < 1:
        raise VerlIntegrationError(f"{name}={short_repr(v)}: must be an integer >= 1")
    return n


def build_controller(given: KLController | str, options: dict[str, Any]) -> KLController:
    """A controller object, or one built by name from ``options``."""
    if isinstance(given, str):
        try:
            return make_controller(given, **options)  # type: ignore[arg-type]
        except (TypeError, ValueError) as e:
            raise VerlIntegrationError(f"controller={given!r}: {e}") from None
    if not isinstance(given, KLController):
        raise VerlIntegrationError(
            f"controller={short_repr(given)}: must be a klppo KLController or a controller "
            "name (fixed, step, proportional, exponential, pid)")
    if options:
        raise VerlIntegrationError(f"options {sorted(options)}: given with a controller object; "
                                   "set them on the controller")
    return given


def starts_at(what: str, value: float, configured: Any, field: str) -> None:
    """The controller must start at the coefficient verl's config sets."""
    if value != number(field, configured):
        raise VerlIntegrationError(f"{what} starts at {value} but {field}={configured}: start "
                                   "the controller at the configured value")


#: names of the state files a verl release could write for its own controller (verl 0.9.1
#: writes none: verl #2653)
FOREIGN_STATE = ("kl_ctrl", "kl_controller")


def _foreign_state(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if any(k in p.name for k in FOREIGN_STATE) and not p.name.startswith("klppo_")
                  and not p.name.startswith(".klppo_"))


def hook_checkpoints(trainer: Any, save_state: Callable[[Path, int], Any],
                     load_state: Callable[[Path, int], Any]) -> None:
    """Wrap ``trainer._save_checkpoint`` / ``_load_checkpoint`` (on this object only): the state
    is written into ``default_local_dir/global_step_N/`` after each save and read back after a
    resume. A controller state verl wrote itself in the resumed folder is refused (two
    controllers would each restore their own)."""
    cfg = trainer.config
    save, load = trainer._save_checkpoint, trainer._load_checkpoint

    def _save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        out = save(*args, **kwargs)
        folder = Path(cfg.trainer.default_local_dir) / f"global_step_{trainer.global_steps}"
        save_state(folder, int(trainer.global_steps))
        return out

    def _load_checkpoint(*args: Any, **kwargs: Any) -> Any:
        out = load(*args, **kwargs)
        step = int(getattr(trainer, "global_steps", 0) or 0)
        if step > 0:
            folder = resumed_folder(cfg, step)
            theirs = _foreign_state(folder)
            if theirs:
                raise RuntimeError(f"{folder}: verl saved its own KL controller state "
                                   f"({', '.join(theirs)}); a klppo controller is attached too: "
                                   "resume without klppo's attach, or remove the file")
            load_state(folder, step)
        return out

    trainer._save_checkpoint, trainer._load_checkpoint = _save_checkpoint, _load_checkpoint


def resumed_folder(cfg: Any, step: int) -> Path:
    """The folder verl's ``_load_checkpoint`` resumed from (its own rule)."""
    if cfg.trainer.resume_mode == "resume_path":
        path = str(cfg.trainer.resume_from_path)
        return Path(path if os.path.isabs(path) else os.path.join(os.getcwd(), path))
    return Path(cfg.trainer.default_local_dir) / f"global_step_{step}"
