"""klppo's errors: every problem klppo reports to a user is one :class:`KlppoError`, whose
message is one line naming the field, flag or file and the value.

Two kinds, which the command line maps to exit codes:

* :class:`UserInputError` (exit 2): bad input found before any work or on reading a run
  directory: a config value (:class:`ConfigError`), a file (:class:`InputError`), a run
  directory that cannot be resumed (:class:`ResumeError`) or read (:class:`CheckpointError`),
  an environment klppo cannot train (``EnvError``), a directory in use (``DirBusyError``).
* :class:`RunFailed` (exit 1): a run that started and then failed; its status says why and
  which checkpoint is kept.

Each also derives from the builtin its callers caught before it existed (``ValueError``,
``RuntimeError``), so ``except ValueError`` still catches a ``ConfigError``.
"""

from __future__ import annotations

__all__ = ["KlppoError", "UserInputError", "RunFailed", "ConfigError", "InputError",
           "RunNotFoundError", "ResumeError", "CheckpointError", "RunInterrupted"]


class KlppoError(Exception):
    """Base of every error klppo reports in one line."""


class UserInputError(KlppoError, ValueError):
    """Bad input, refused before any work (the command exits 2)."""


class RunFailed(KlppoError, RuntimeError):
    """A run that started and failed; its status.json says why (the command exits 1)."""


class ConfigError(UserInputError):
    """A config value out of range or of the wrong type; the message names the field."""


class InputError(UserInputError):
    """A file or flag given by the user that cannot be used; the message names it."""


class RunNotFoundError(InputError, FileNotFoundError):
    """A run directory that does not exist (a ``FileNotFoundError`` too, as Stable-Baselines3's
    ``load`` of a missing file raises)."""


class ResumeError(UserInputError, RuntimeError):
    """A run directory cannot be resumed; the message names the file and the reason."""


class CheckpointError(UserInputError, RuntimeError):
    """A checkpoint that exists but cannot be read as a klppo checkpoint; names the file."""


class RunInterrupted(KeyboardInterrupt):
    """A second SIGINT / SIGTERM stopped a run at once, in the middle of an iteration: its
    status.json says 'interrupted' and it resumes from its last checkpoint (``run_dir``)."""

    def __init__(self, run_dir: object, signum: int | None = None) -> None:
        super().__init__(f"{run_dir}: stopped at once (second signal)")
        self.run_dir, self.signum = run_dir, signum
