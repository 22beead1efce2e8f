"""Exceptions shared by the library and its command lines (below the CLI, so library modules never
import `scaling_rl.cli`)."""


class UsageError(Exception):
    """Bad user input: reported as one line, exit code 2."""
