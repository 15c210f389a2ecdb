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
import importlib
import os
import sys

from trnopt.optimizer.errors import DoesNotFitError, InfeasibleError, InputError, TimeLimitError, one_line

# command -> (the module that registers and runs it, its line in `trnopt --help`). Only the
# module of the command given is imported: together they pull in OR-Tools, NumPy and
# ml_dtypes, 1.4 CPU-seconds of start-up that `trnopt --help` or `trnopt targets` never use.
COMMANDS = {
    "targets": ("trnopt.optimizer.commands.catalog", "list the built-in targets, or show one"),
    "models": ("trnopt.optimizer.commands.catalog", "list the model presets, or show one"),
    "evaluate": ("trnopt.optimizer.commands.evaluate", "score one hand-written layout with the cost model"),
    "solve": ("trnopt.optimizer.commands.solve", "find the fastest layout that fits (CP-SAT)"),
    "compare": ("trnopt.optimizer.commands.compare", "best layout of one model on several targets, side by side"),
    "map": ("trnopt.optimizer.commands.map", "picture of the domain: chips by TP group and pipeline stage"),
    "check-map": ("trnopt.optimizer.commands.checkmap",
                  "check the rank-to-device map a job printed against the plan"),
    "launch": ("trnopt.optimizer.commands.launch",
               "write the files that run a layout (torchrun, Slurm or Kubernetes)"),
    "calibrate": ("trnopt.optimizer.commands.calibrate",
                  "fit a target's link rates (nccom-test) and compute utilisation (a step time)"),
    "kernels": ("trnopt.kernels.command",
                "plan the overlap kernels of a solved layout and check them in the simulator"),
}


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``trnopt: error: COMMAND: FLAG: RULE``), exit 2."""

    def error(self, message: str):
        print(f"trnopt: error: {one_line(self.prog)}: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


class _One:
    """The subcommands, passing on one command's parser only (a module may register several)."""

    def __init__(self, sub, name: str):
        self.sub, self.name = sub, name

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self.sub.add_parser(name, **kwargs) if name == self.name else Parser(prog=name)


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``argv``'s command in full (its module imported), every other command by its line."""
    top = Parser(prog="trnopt", description="Parallel layouts and overlap kernels for AWS Trainium.")
    top.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = top.add_subparsers(dest="command", required=True)
    # the command is the first word that is not an option (the top level's options take no value)
    chosen = next((word for word in (sys.argv[1:] if argv is None else argv) if not word.startswith("-")), None)
    for name, (module, summary) in COMMANDS.items():
        if name == chosen:
            importlib.import_module(module).register(_One(sub, name))
        else:
            sub.add_parser(name, help=summary)
    return top


# each user-facing error: its prefix on the one stderr line and the exit code the module docstring lists
EXITS = ((InputError, "error", 2), (DoesNotFitError, "does not fit", 1),
         (InfeasibleError, "infeasible", 3), (TimeLimitError, "time limit", 4))


def main(argv: list[str] | None = None) -> int:
    args = parser(argv).parse_args(argv)
    try:
        return args.run(args)
    except (InputError, DoesNotFitError, InfeasibleError, TimeLimitError) as exc:
        if args.debug:
            raise
        prefix, code = next((p, c) for kind, p, c in EXITS if isinstance(exc, kind))
        # an InputError's text is already one line naming the file and key
        text = str(exc) if isinstance(exc, InputError) else one_line(exc)
        print(f"trnopt: {prefix}: {text}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader (e.g. `| head`) left: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())  # `2>&1 | head`: stderr is the same closed pipe
        return 0
    except Exception as exc:  # a bug: say so in one line; --debug shows the traceback
        if args.debug:
            raise
        print(f"trnopt: internal error ({type(exc).__name__}: {one_line(exc)[:500]}); please report it, "
              "and rerun with --debug for the traceback", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
