"""Writing what a command produces: JSON, text or bytes, to a file or to stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trnopt.optimizer.errors import InputError


def write_output(path: str, payload: dict | str | bytes, force: bool = False, flag: str = "--json") -> None:
    """Write JSON, text or bytes to a file, or to stdout for '-'; never overwrite a file unless forced."""
    data = payload if isinstance(payload, (str, bytes)) else json.dumps(payload, indent=2) + "\n"
    if path == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data)
        return
    out = Path(path)
    if out.exists() and not force:
        raise InputError(path, flag, "file exists; trnopt never overwrites a file (pass --force to replace it)")
    if isinstance(data, bytes):
        out.write_bytes(data)
    else:
        out.write_text(data, encoding="utf-8")
