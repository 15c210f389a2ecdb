"""Reading a file a user hands in: regular files only, bounded in size and nesting.

Every loader (targets, models, layouts, rank maps, measurements) reads through
``read_text`` so that one set of rules holds for all of them:

- the path is a regular file (a FIFO would block for ever, ``/dev/zero`` never ends, a
  directory has no text): anything else is refused before it is opened for reading;
- at most ``max_bytes`` are read (the file is refused, not truncated, when it is longer);
- the text is UTF-8, with or without a byte-order mark (spreadsheets write one);
- JSON is parsed without NaN or Infinity, with at most ``MAX_DEPTH`` levels of nesting and
  numbers of at most ``MAX_DIGITS`` digits; TOML is held to the same depth.

Every failure is ``InputError(path, key, rule)`` (exit 2).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tomllib
from typing import Any

from trnopt.optimizer.errors import InputError

MAX_BYTES = 16 * 2**20      # target, model and layout files are a few KiB; 16 MiB is far beyond any
MAX_DEPTH = 32              # the deepest real file (a layout's placement) nests 3 levels
MAX_DIGITS = 40             # a number longer than this is no count, size or rate of a real machine
BOM = "\ufeff"


def read_text(path: str, key: str = "-", max_bytes: int = MAX_BYTES, kind: str = "file") -> str:
    """The UTF-8 text of the regular file ``path`` (a leading byte-order mark dropped).

    ``kind`` names what the file should be in messages ("TOML file", "layout file").
    """
    if not isinstance(path, str) or not path.strip():
        raise InputError(repr(path) if not path else path, key, "an empty path; give a file name")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(path, key, "file not found") from None
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, ELOOP, a NUL in the path
        raise InputError(path, key, f"not a usable path ({getattr(exc, 'strerror', None) or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(path, key, f"is a directory, not a {kind}")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, key, "not a regular file (a FIFO, socket or device is not read)")
    if info.st_size > max_bytes:
        raise InputError(path, key, f"{info.st_size:,} bytes; at most {max_bytes:,} are read")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(path, key, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:  # grew since stat, or a file system that reports no size
        raise InputError(path, key, f"more than {max_bytes:,} bytes; at most {max_bytes:,} are read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(path, key, "not UTF-8 text") from None
    return text[1:] if text.startswith(BOM) else text


_TOKENS = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]')


def nesting_depth(text: str) -> int:
    """The deepest nesting of brackets and braces outside strings and comments (JSON and TOML)."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        c = match.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _check_depth(path: str, text: str) -> None:
    if nesting_depth(text) > MAX_DEPTH:
        raise InputError(path, "-", f"nested more than {MAX_DEPTH} levels deep")


def _number(path: str):
    """JSON's number parser, held to MAX_DIGITS characters and to finite floats (1e400 is not a number)."""
    def parse(text: str):
        if len(text.lstrip("-")) > MAX_DIGITS:
            raise InputError(path, "-", f"a number of {len(text)} characters; at most {MAX_DIGITS}")
        if not any(c in text for c in ".eE"):
            return int(text)
        value = float(text)
        if not math.isfinite(value):
            raise InputError(path, "-", f"{text} overflows a float; give a finite value")
        return value
    return parse


def _constant(path: str):
    def reject(name: str):
        raise InputError(path, "-", f"{name} is not a number JSON allows; give a finite value")
    return reject


def parse_json(path: str, text: str) -> Any:
    """JSON without NaN/Infinity, nested at most MAX_DEPTH deep, numbers of at most MAX_DIGITS digits."""
    _check_depth(path, text)
    try:
        return json.loads(text, parse_constant=_constant(path), parse_int=_number(path), parse_float=_number(path))
    except json.JSONDecodeError as exc:
        raise InputError(path, "-", f"not valid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg})") from None
    except RecursionError:
        raise InputError(path, "-", f"nested more than {MAX_DEPTH} levels deep") from None


def parse_toml(path: str, text: str) -> dict[str, Any]:
    """TOML nested at most MAX_DEPTH deep; a syntax error names its line."""
    _check_depth(path, text)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, "-", f"not valid TOML ({exc})") from None
    except RecursionError:
        raise InputError(path, "-", f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InputError(path, "-", f"not valid TOML ({exc})") from None
