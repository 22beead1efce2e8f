"""Exceptions shared by the library and its command lines (below the CLI, so library modules never
import `scaling_rl.cli`)."""


class UsageError(Exception):
    """Bad user input: reported as one line, exit code 2."""


class CorruptFile(UsageError, ValueError):
    """A file the toolkit reads back (a run's config.json, a store's trial_status.json, ...) is empty,
    not valid JSON / parquet, or not the shape it writes. A UsageError (one line, exit 2, at the CLI)
    and a ValueError (so library callers that catch bad input catch it too); the message names the file."""

    def __init__(self, path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


def one_line(e: BaseException) -> str:
    """An exception as one line: `Type: message` with all whitespace runs collapsed."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
