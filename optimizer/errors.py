"""The errors trnopt reports to a user instead of a traceback, each with its exit code."""

from __future__ import annotations


def one_line(text: object) -> str:
    """``text`` with every non-printable character (newline, tab, ...) written as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


class InputError(Exception):
    """A target, workload or layout file (or a flag) breaks a rule.

    The message is one line: ``FILE: KEY: RULE``. The CLI prints it and exits 2. Line
    breaks inside any part (a quoted TOML key, a file name) are escaped so that the
    message stays on one line.
    """

    def __init__(self, source: str, key: str, rule: str):
        self.source, self.key, self.rule = one_line(source), one_line(key), one_line(rule)
        super().__init__(f"{self.source}: {self.key}: {self.rule}")


class DoesNotFitError(Exception):
    """A layout file names a layout whose memory per chip exceeds the chip's HBM: it cannot run (exit 1,
    as `trnopt evaluate` exits on a layout that does not fit)."""


class InfeasibleError(Exception):
    """No layout fits the target; the message explains why and what would fit (exit 3)."""


class TimeLimitError(Exception):
    """The time limit passed before any layout was found: not a proof that none fits (exit 4).

    When a layout was found the answer is that layout with its gap (exit 0 and a warning);
    this is only for a search that ends with nothing to show.
    """
