"""``target-clickhouse-component``: the component's Singer target (Meltano's loader), run by the
wheel's embedded host. ``--config FILE`` (the settings), Singer messages on stdin (or
``--input FILE``), STATE lines on stdout once the records before them are committed;
``--about [--format json]`` describes it. See docs/meltano.md."""

from __future__ import annotations

import sys

from . import _native


def main() -> None:
    """The console script."""
    sys.exit(_native.run_target(sys.argv[1:]))


if __name__ == "__main__":
    main()
