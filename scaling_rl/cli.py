"""`scaling-rl` command line: one sub-command family per module, registered lazily."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from scaling_rl.errors import UsageError  # noqa: F401  (kept importable from here)

# (module, description). Each module defines `register(subparsers)` which adds its
# sub-command(s) with `set_defaults(func=callable(args) -> int)`.
_COMMANDS = [
    ("scaling_rl.train_cli", "train one agent configuration (seeds vmapped)"),
    ("scaling_rl.sweep.cli", "run / inspect / collect sweeps"),
    ("scaling_rl.scaling.cli", "fit scaling laws and plot them"),
    ("scaling_rl.llm.cli", "GRPO experiments on transformers models"),
]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (no usage dump) and exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse hook
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="scaling-rl", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod_name, _ in _COMMANDS:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:  # optional extra not installed
            if e.name and e.name.startswith("scaling_rl"):
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        return _fail(str(e))
    except OSError as e:
        # the file system said no (read-only, full, permission, a path through a file): the commands
        # check their outputs before working (scaling_rl.io.output_*_problem), this is the fault
        # that comes later. One line naming the path; SCALING_RL_TRACEBACK=1 shows the traceback.
        if os.environ.get("SCALING_RL_TRACEBACK") or e.errno is None:
            raise
        return _fail(os_error_line(e))


def os_error_line(e: OSError) -> str:
    """`<path>: <strerror>` (both paths of a rename) for an OSError."""
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    reason = e.strerror or str(e)
    return f"{where}: {reason}" if where else reason


def _fail(message: str) -> int:
    print(f"scaling-rl: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
