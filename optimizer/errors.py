"""The two errors trnopt reports to a user instead of a traceback."""

from __future__ import annotations


class InputError(Exception):
    """A target, workload or layout file (or a flag) breaks a rule.

    The message is one line: ``FILE: KEY: RULE``. The CLI prints it and exits 2.
    """

    def __init__(self, source: str, key: str, rule: str):
        self.source, self.key, self.rule = str(source), key, rule
        super().__init__(f"{self.source}: {key}: {rule}")


class InfeasibleError(Exception):
    """No layout fits the target; the message explains why and what would fit (exit 3)."""
