"""Start-up imports what the command needs: `trnopt --help` and the catalog need neither OR-Tools,
NumPy nor ml_dtypes (1.4 CPU-seconds of imports between them), and every command still parses."""

import subprocess
import sys

import pytest

from trnopt.optimizer.commands.cli import COMMANDS, parser

HEAVY = ("ortools", "numpy", "ml_dtypes")


@pytest.mark.parametrize("argv", [["--help"], ["targets", "list"], ["models", "show", "llama3-8b"]])
def test_light_commands_import_no_heavy_module(argv):
    code = ("import sys\nfrom trnopt.optimizer.commands.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_registers_its_own_parser(name):
    top = parser([name, "--help"])
    chosen = next(a for a in top._actions if a.dest == "command").choices[name]
    # the command's own parser (its options), not the one-line stand-in of the others
    assert any(action.option_strings and action.dest != "help" for action in chosen._actions)
