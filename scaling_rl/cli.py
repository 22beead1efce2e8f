"""`scaling-rl` command line: one sub-command family per module, registered lazily."""
from __future__ import annotations

import argparse
import importlib
import sys

from scaling_rl.errors import UsageError  # noqa: F401  (kept importable from here)

# (module, description). Each module defines `register(subparsers)` which adds its
# sub-command(s) with `set_defaults(func=callable(args) -> int)`.
_COMMANDS = [
    ("scaling_rl.train", "train one agent configuration (seeds vmapped)"),
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
        print(f"scaling-rl: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
