"""``python -m gpubench`` and the ``gpubench`` command. Ctrl-C is one line from the first
instant: the command line's modules take a second or two to import on a loaded machine, and a
KeyboardInterrupt there (before gpubench.cli.main handles it) would be a traceback."""

from __future__ import annotations

import sys


def entry() -> int:
    try:
        from gpubench.cli import main

        return main()
    except KeyboardInterrupt as e:  # while importing, or while main() itself winds up
        from gpubench.errors import stop_exit_code, stop_message

        stop_message(e)
        return stop_exit_code(e)


if __name__ == "__main__":
    sys.exit(entry())
