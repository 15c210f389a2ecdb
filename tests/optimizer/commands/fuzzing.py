"""Helpers of the fuzz suite (test_fuzz*.py): run trnopt in this process and hold every run to one contract.

``cli`` runs ``cli.main`` and checks (``contract``): the exit code is 0, 1, 2 or 3 (never 70;
4 only for a search that the time limit cut short before any layout, which a loaded machine
may see); on 2 or 3 stderr is one line (``trnopt: error: FILE: KEY: RULE`` or
``trnopt: infeasible: ...``) with no traceback and not naming "layout" as its source; stdout
stays under 1 MB; and no run outlives a hang guard (SIGALRM, far above any run: it catches a
read that blocks for ever, it does not time anything). ``assert_refused`` states when exit 0
would be a wrong answer.
"""

from __future__ import annotations

import io
import json
import math
import signal
import tomllib
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from trnopt.optimizer.commands.cli import main

FUZZ = settings(derandomize=True, max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
HANG_GUARD_S = 300
MAX_STDOUT = 2**20
TIMED_OUT = "no layout found within"  # search/driver.py still says this with exit 3; it should be exit 4


@dataclass
class Run:
    argv: list[str]
    code: int
    out: str
    err: str


@contextmanager
def hang_guard():
    def fail(*_):
        raise AssertionError(f"a run took more than {HANG_GUARD_S} s: it hangs")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(HANG_GUARD_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cli(*argv: Any) -> Run:
    """Run trnopt in this process and hold the result to the contract."""
    args = [str(a) for a in argv]
    raw = io.BytesIO()
    out, err = io.TextIOWrapper(raw, encoding="utf-8", write_through=True), io.StringIO()
    with hang_guard(), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code
    run = Run(args, code, raw.getvalue().decode("utf-8", "replace"), err.getvalue())
    contract(run)
    return run


def contract(run: Run) -> None:
    assert run.code in (0, 1, 2, 3) or (run.code == 4 and run.err.startswith("trnopt: time limit: ")), run
    assert "Traceback" not in run.err and "internal error" not in run.err, run
    if run.code in (2, 3):
        assert run.err.count("\n") == 1 and run.err.endswith("\n"), run
        assert run.err.startswith("trnopt: error: " if run.code == 2 else "trnopt: infeasible: "), run
        assert run.err[:-1].isprintable(), run
        assert not run.err.startswith("trnopt: error: layout:"), run  # name the flag or file, not "layout"
    assert len(run.out) < MAX_STDOUT, (run.argv, len(run.out))


def assert_refused(run: Run, *names: str) -> None:
    """Exit 2, and the message names one of ``names`` (the file, flag or key)."""
    assert run.code == 2, run
    assert any(n in run.err for n in names), (names, run.err)


# -- TOML files -----------------------------------------------------------------------------
def shipped(kind: str, name: str) -> dict:
    return tomllib.loads(resources.files("trnopt.targets").joinpath(f"{kind}/{name}.toml").read_text("utf-8"))


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else "inf" if v == math.inf else "-inf" if v == -math.inf else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def to_toml(data: dict, prefix: str = "") -> str:
    def is_tables(v):
        return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
    out = "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items()
                  if not isinstance(v, dict) and not is_tables(v))
    for k, v in data.items():
        name = f"{prefix}{json.dumps(k)}"
        if isinstance(v, dict):
            out += f"\n[{name}]\n" + to_toml(v, name + ".")
        elif is_tables(v):
            for item in v:
                out += f"\n[[{name}]]\n" + to_toml(item, name + ".")
    return out


def leaves(node: Any, path: tuple = ()) -> list[tuple]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    out = []
    for k, v in items:
        if isinstance(v, (dict, list)) and not (isinstance(v, list) and all(not isinstance(x, dict) for x in v)):
            out += leaves(v, (*path, k))
        else:
            out.append((*path, k))
    return out


def at(root: Any, path: tuple) -> Any:
    for k in path[:-1]:
        root = root[k]
    return root


def write(tmp: Path, name: str, content: dict | str | bytes) -> Path:
    path = tmp / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else to_toml(content), encoding="utf-8")
    return path


def valid_layout(tmp: Path) -> str:
    path = tmp / "layout.json"
    if not path.exists():
        run = cli("evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", 4, "--dp", 16, "--global-batch", 64,
                  "--zero", 3, "--recompute", "full", "--json", path)
        assert run.code == 0, run
    return str(path)
