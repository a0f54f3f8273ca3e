"""The TRL bridge's controller state (:mod:`klppo.integrations.controller_state`)."""

from klppo.integrations.controller_state import (
    FORMAT,
    STATE_FILE,
    load_controller,
    read_state,
    settings_of,
    write_state,
)

__all__ = ["STATE_FILE", "FORMAT", "settings_of", "write_state", "read_state",
           "load_controller"]
