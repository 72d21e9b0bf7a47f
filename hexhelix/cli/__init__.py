"""The ``hexhelix`` command line: one module per subcommand, each with ``register(subparsers)``.

Errors a user can cause (bad files, bad flags, infeasible problems) print one line on stderr and
exit with status 2; nothing the user did should ever show a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import NoReturn

from hexhelix.ir.errors import HexhelixError, InvalidInputError, UnsupportedError

# Subcommand modules in the order ``hexhelix --help`` lists them. A new command is one module here.
COMMANDS = [
    "demo",
    "ir",
    "gpus",
    "plan",
    "compare",
    "evaluate",
    "solve",
    "profile",
    "pair",
    "compile",
    "validate",
    "show",
    "simulate",
]


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors: a bad flag prints one line (and a pointer to
    ``--help``) instead of the usage block. Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hexhelix",
        description="Plan, compile and run LLM training over heterogeneous GPU clusters.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (repeat for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"hexhelix.cli.{name}").register(sub)
    return parser


def _one_line(err: Exception) -> str:
    """The error message folded onto one line (the CLI promises exactly one line on stderr)."""
    return " ".join(str(err).split())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except (InvalidInputError, UnsupportedError) as err:
        print(f"hexhelix {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except HexhelixError as err:
        print(f"hexhelix {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"hexhelix {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
