"""User-facing errors: one line that names the file, line or config key at fault."""

import functools
import sys


class KwsError(Exception):
    """An error caused by the user's input, reported as one line without a traceback."""


def where(path, line=None):
    """Format a location as `path:line` (or just `path`) for error messages."""
    return f"{path}:{line}" if line is not None else f"{path}"


def cli(main):
    """Decorate a script's main(): KwsError becomes `error: ...` on stderr and exit status 1."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except KwsError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)

    return wrapper
