"""Typed look-ups in a parsed TOML table that fail with ``InputError(file, key, rule)``.

Shared by the target and workload loaders so that every malformed file is reported the
same way: the file, the dotted key, and the rule it breaks. A loader reads every key it
knows through a ``Table`` and then calls ``check_unknown()``, so that a misspelt optional
key (``kv_head`` for ``kv_heads``) is an error rather than a silent default.
"""

from __future__ import annotations

import difflib
import math
from importlib import resources
from pathlib import Path
from typing import Any

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.inputfile import parse_toml, read_text

_MISSING = object()
MAX_INT = 2**40  # sanity bound on every integer key: no size, count or width of a real machine or model is near it
MAX_STR = 1024   # longest name or description: a line of text, not a file


def _short(value: Any) -> str:
    """A value for an error message: its repr, cut at 60 characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_toml(path: Path | str, text: str | None = None) -> dict[str, Any]:
    """Parse a TOML file (or ``text`` attributed to ``path``) under the rules of inputfile.py."""
    if text is None:
        text = read_text(str(path), kind="TOML file")
    return parse_toml(str(path), text[1:] if text.startswith("\ufeff") else text)


def read_named(name_or_path: str, shipped: tuple[str, ...], folder: str, flag: str, kind: str,
               listing: str) -> tuple[dict[str, Any], str]:
    """(parsed TOML, source name) of a file shipped in ``trnopt/targets/<folder>/`` by name, or of a
    user's TOML file by path; an empty or unknown name is one line naming ``flag`` (``kind``:
    "target", "model preset"; ``listing``: "built-in targets are", "presets are")."""
    if name_or_path in shipped:
        source = f"targets/{folder}/{name_or_path}.toml"
        return read_toml(source, resources.files("trnopt.targets").joinpath(f"{folder}/{name_or_path}.toml")
                         .read_text("utf-8")), source
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise InputError(repr(name_or_path), flag, f"empty; {listing} {', '.join(shipped)}, or give a .toml path")
    if Path(name_or_path).suffix != ".toml" and not _exists(name_or_path):
        raise InputError(name_or_path, flag, f"unknown {kind}; {listing} {', '.join(shipped)}, or give a .toml "
                         f"path{closest(name_or_path, shipped)}")
    return read_toml(name_or_path), name_or_path


def _exists(path: str) -> bool:
    """Path.exists, False where the OS refuses the name (ENAMETOOLONG for a 5,000-character name, a NUL)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def closest(name: str, known: set[str] | tuple[str, ...]) -> str:
    """', did you mean X?' for the known name nearest a misspelt one, or ''."""
    match = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


class Table:
    """A TOML table that knows its file and its dotted path, for error messages."""

    def __init__(self, data: Any, source: str, prefix: str = ""):
        if not isinstance(data, dict):
            raise InputError(source, prefix or "-", "must be a table")
        self.data, self.source, self.prefix = data, str(source), prefix
        self._known: set[str] = set()  # keys the loader asked for, present or not
        self._children: list[Table] = []

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, rule: str) -> InputError:
        return InputError(self.source, self.key(name), rule)

    def has(self, name: str) -> bool:
        self._known.add(name)
        return name in self.data

    def check_unknown(self) -> None:
        """Fail on the first key of this table (or of a sub-table read through it) that no loader asked for."""
        for name in self.data:
            if name not in self._known:
                raise self.fail(name, f"unknown key; this table takes {', '.join(sorted(self._known))}"
                                f"{closest(name, self._known)}")
        for child in self._children:
            child.check_unknown()

    def _get(self, name: str, default: Any) -> Any:
        self._known.add(name)
        if name in self.data:
            return self.data[name]
        if default is _MISSING:
            raise self.fail(name, "missing required key")
        return default

    def str(self, name: str, default: Any = _MISSING, nonempty: bool = False) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {type(value).__name__}")
        if nonempty and not value.strip():
            raise self.fail(name, "must not be empty")
        if not value.isprintable():
            raise self.fail(name, "must not hold control characters (tab, newline, escape, ...)")
        if len(value) > MAX_STR:
            raise self.fail(name, f"{len(value):,} characters; at most {MAX_STR:,}")
        return value

    def bool(self, name: str, default: Any = _MISSING) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {_short(value)}")
        return value

    def int(self, name: str, default: Any = _MISSING, minimum: int = 1, maximum: int = MAX_INT) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be an integer, got {_short(value)}")
        if value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {_short(value)}")
        if value > maximum:
            raise self.fail(name, f"must be <= {maximum:,}, got {_short(value)}")
        return value

    def number(self, name: str, default: Any = _MISSING, positive: bool = True,
               bounds: tuple[float, float] | None = None) -> float:
        """A finite number; > 0 (``positive``) or >= 0; inside ``bounds`` (lowest, highest) when given."""
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, f"must be a number, got {_short(value)}")
        try:
            value = float(value)
        except OverflowError:  # an integer too large for a float
            raise self.fail(name, "must be finite") from None
        if not math.isfinite(value):
            raise self.fail(name, "must be finite")
        if positive and value <= 0:
            raise self.fail(name, f"must be > 0, got {value:g}")
        if not positive and value < 0:
            raise self.fail(name, f"must be >= 0, got {value:g}")
        if bounds is not None and value > bounds[1]:
            raise self.fail(name, f"too large: {value:g} is above the physical bound {bounds[1]:g}")
        if bounds is not None and 0 < value < bounds[0]:
            raise self.fail(name, f"too small: {value:g} is below the physical bound {bounds[0]:g}")
        return value

    def fraction(self, name: str, default: Any = _MISSING) -> float:
        value = self.number(name, default, positive=False)
        if value > 1:
            raise self.fail(name, f"must be between 0 and 1, got {value:g}")
        return value

    def int_list(self, name: str, default: Any = _MISSING) -> tuple[int, ...]:
        value = self._get(name, default)
        if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_INT for v in value
        ):
            raise self.fail(name, f"must be a non-empty list of positive integers, got {_short(value)}")
        if len(set(value)) != len(value):
            raise self.fail(name, f"must not repeat a value, got {value!r}")
        return tuple(value)

    def table(self, name: str, default: Any = _MISSING) -> "Table":
        child = Table(self._get(name, default), self.source, self.key(name))
        self._children.append(child)
        return child

    def tables(self, name: str) -> list["Table"]:
        value = self._get(name, _MISSING)
        if not isinstance(value, list) or not value:
            raise self.fail(name, "must be a non-empty array of tables ([[...]])")
        children = [Table(v, self.source, f"{self.key(name)}[{i}]") for i, v in enumerate(value)]
        self._children.extend(children)
        return children

    def choice(self, name: str, allowed: tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.str(name, default)
        if value not in allowed:
            raise self.fail(name, f"must be one of {', '.join(allowed)}, got {_short(value)}{closest(value, allowed)}")
        return value
