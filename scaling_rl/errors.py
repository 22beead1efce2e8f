"""Exceptions shared by the library and its command lines (below the CLI, so library modules never
import `scaling_rl.cli`)."""


class UsageError(Exception):
    """Bad user input: reported as one line, exit code 2."""


def one_line(e: BaseException) -> str:
    """An exception as one line: `Type: message` with all whitespace runs collapsed."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
