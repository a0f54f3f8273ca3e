"""``python -m klppo.cli``: the same as the ``klppo`` command."""

import sys

from klppo.cli import main

if __name__ == "__main__":
    sys.exit(main())
