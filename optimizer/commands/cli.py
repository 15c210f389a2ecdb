"""The `trnopt` command line: the parser of every command, and one way out for every error.

Exit codes: 0 success (a time limit that cut a search short is a warning with the gap),
1 a check found a problem (check-map, kernels, evaluate of a layout that does not fit; kernels, map
and check-map of a layout file whose layout does not fit the chip's HBM),
2 bad input (one line naming the file, the key and the rule), 3 no feasible layout
(proven, with the explanation), 4 the time limit passed before any layout was found (kernels:
before a simulator run finished), 70 an internal error (one line; --debug shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys

from trnopt.kernels import command as kernels_command
from trnopt.optimizer.commands import calibrate, catalog, checkmap, compare, evaluate, launch, solve
from trnopt.optimizer.commands import map as map_command
from trnopt.optimizer.errors import DoesNotFitError, InfeasibleError, InputError, TimeLimitError, one_line

COMMANDS = (catalog, evaluate, solve, compare, map_command, checkmap, launch, calibrate, kernels_command)


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``trnopt: error: COMMAND: FLAG: RULE``), exit 2."""

    def error(self, message: str):
        print(f"trnopt: error: {one_line(self.prog)}: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="trnopt", description="Parallel layouts and overlap kernels for AWS Trainium.")
    top.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except InputError as exc:
        if args.debug:
            raise
        print(f"trnopt: error: {exc}", file=sys.stderr)
        return 2
    except DoesNotFitError as exc:
        if args.debug:
            raise
        print(f"trnopt: does not fit: {one_line(exc)}", file=sys.stderr)
        return 1
    except InfeasibleError as exc:
        if args.debug:
            raise
        print(f"trnopt: infeasible: {one_line(exc)}", file=sys.stderr)
        return 3
    except TimeLimitError as exc:
        if args.debug:
            raise
        print(f"trnopt: time limit: {one_line(exc)}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader (e.g. `| head`) left: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug: say so in one line; --debug shows the traceback
        if args.debug:
            raise
        print(f"trnopt: internal error ({type(exc).__name__}: {one_line(exc)[:500]}); please report it, "
              "and rerun with --debug for the traceback", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
