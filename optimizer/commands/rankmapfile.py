"""Reading a job's rank map (the file `trnopt check-map` checks): rows streamed, kept as columns.

The format is in checkmap's docstring. A CSV map is read one row at a time from the file
(never held whole), and each rank keeps four 4-byte integers (instance index, chip, core,
row), so every map trnopt writes (up to placement.MAX_CSV_RANKS rows, 16 M) is read in a few
hundred MiB. A JSON map is parsed whole and so is bounded lower (MAX_JSON_ROWS). A malformed
file is an InputError naming the file, the line (or JSON index) and the key (exit 2).
"""

from __future__ import annotations

import csv
import os
import re
import stat
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.inputfile import parse_json, read_text
from trnopt.optimizer.model.placement import MAX_CSV_RANKS, _ranges
from trnopt.optimizer.model.tomlcheck import closest

COLUMNS = ("rank", "instance", "chip", "core")
OPTIONAL = ("ultraserver", "lnc")
MAX_ROWS = MAX_CSV_RANKS   # every rank map trnopt writes (solve/evaluate --rank-map, launch's expected map)
MAX_BYTES = 128 * MAX_ROWS  # a row is ~40 bytes as trnopt writes it; room for long instance ids
MAX_JSON_ROWS = 2**20      # a JSON map is parsed whole (hundreds of bytes of Python objects a row)
MAX_JSON_BYTES = 128 * 2**20
MAX_FIELD = 256            # characters of one field (an EC2 instance id is 19, a hostname at most 253)
MAX_INDEX = 2**20          # a chip or core index beyond this is no index at all


@dataclass
class RankMapFile:
    """The job's map as columns indexed by rank."""

    path: str
    instance: np.ndarray               # int32 per rank: index into instance_ids
    chip: np.ndarray                   # int32 per rank
    core: np.ndarray                   # int32 per rank
    instance_ids: list[str]            # in order of first appearance
    ultraserver_of: list[str | None]   # per instance: its UltraServer id (None: not given)
    lnc: set[int]                      # LNC values recorded (empty: not recorded)

    @property
    def ranks(self) -> int:
        return len(self.instance)

    def device(self, rank: int) -> tuple[str, int, int, str | None]:
        """(instance, chip, core, ultraserver) of one rank."""
        i = int(self.instance[rank])
        return self.instance_ids[i], int(self.chip[rank]), int(self.core[rank]), self.ultraserver_of[i]


def _int(path: str, where: str, key: str, value, minimum: int = 0, maximum: int = MAX_INDEX) -> int:
    """An integer from JSON (int) or CSV (ASCII digits), in [minimum, maximum]."""
    if type(value) is str and 0 < len(value) <= 12 and value.isascii() and value.isdigit():
        value = int(value)  # the common case, without a regular expression
    name = f"{where}.{key}" if where else key
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,12}\s*", value, flags=re.ASCII):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise InputError(path, name, f"must be an integer, got {shown}")
    if value < minimum:
        raise InputError(path, name, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise InputError(path, name, f"must be <= {maximum:,}, got {value:,}")
    return value


def _text(path: str, name: str, value) -> str | None:
    """An id (instance, UltraServer): a printable string or number of at most MAX_FIELD characters."""
    if type(value) is str and 0 < len(value) <= MAX_FIELD and value.isprintable() and value == value.strip():
        return value  # the common case
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(path, name, f"must be an id (a string), got {type(value).__name__}")
    text = str(value).strip() if not isinstance(value, int) or abs(value) < 10**20 else None
    if text is None or len(text) > MAX_FIELD:
        raise InputError(path, name, f"longer than {MAX_FIELD} characters")
    if not text.isprintable():
        raise InputError(path, name, "must not hold control characters")
    return text or None


def _check_file(path: str) -> None:
    """A regular file of at most MAX_BYTES, checked before it is opened (a FIFO would block the open)."""
    if not isinstance(path, str) or not path.strip():
        raise InputError(repr(path), "--rank-map", "an empty path; give a file name")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(path, "--rank-map", "file not found") from None
    except (OSError, ValueError) as exc:
        raise InputError(path, "--rank-map", f"not a usable path ({getattr(exc, 'strerror', None) or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(path, "--rank-map", "is a directory, not a rank map file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, "--rank-map", "not a regular file (a FIFO, socket or device is not read)")
    if info.st_size > MAX_BYTES:
        raise InputError(path, "--rank-map", f"{info.st_size:,} bytes; at most {MAX_BYTES:,} are read")


def _csv_lines(path: str) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of a CSV file, read as it goes (UTF-8, a leading byte-order mark dropped)."""
    reader = None
    try:
        with open(path, encoding="utf-8-sig", newline="") as text:
            reader = csv.reader(text)
            for fields in reader:
                yield reader.line_num, fields
    except UnicodeDecodeError:
        raise InputError(path, f"line {reader.line_num + 1 if reader else 1}", "not UTF-8 text") from None
    except csv.Error as exc:
        raise InputError(path, f"line {reader.line_num if reader else 1}", f"not valid CSV ({exc})") from None
    except OSError as exc:
        raise InputError(path, "--rank-map", f"cannot be read ({exc.strerror or exc})") from None


def _is_json(path: str) -> bool:
    if path.lower().endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8-sig", errors="replace").lstrip()
    except OSError:
        return False
    return head.startswith(("[", "{"))


def _rows(path: str) -> tuple[Iterator[tuple[str, int, dict]], object, bool]:
    """(where, line, row) triples, produced one at a time, the top-level lnc (or None), and whether it is JSON."""
    _check_file(path)
    if _is_json(path):
        return (*_json_rows(path), True)
    lines = _csv_lines(path)
    line, header = next(lines, (1, []))
    header = [h.strip() for h in header]
    if not header or header == [""]:
        raise InputError(path, "header", f"empty file; expected a CSV header {','.join(COLUMNS)}")

    def rows():
        count = 0
        for line, fields in lines:
            if not fields:
                continue
            count += 1
            if count > MAX_ROWS:
                raise InputError(path, f"line {line}", f"more than {MAX_ROWS:,} rows")
            if len(fields) > len(header):
                raise InputError(path, f"line {line}", f"{len(fields)} fields under a header of {len(header)}")
            yield f"line {line}", line, dict(zip(header, fields))
    return rows(), None, False


def _json_rows(path: str) -> tuple[Iterator[tuple[str, int, dict]], object]:
    data = parse_json(path, read_text(path, "--rank-map", max_bytes=MAX_JSON_BYTES))
    top_lnc = None
    if isinstance(data, dict):
        unknown = set(data) - {"lnc", "ranks"}
        if unknown:
            name = sorted(unknown)[0]
            raise InputError(path, name, f"unknown key; a rank map object has 'ranks' and 'lnc'"
                             f"{closest(name, ('lnc', 'ranks'))}")
        if "ranks" not in data:
            raise InputError(path, "ranks", "missing: the list of {rank, instance, chip, core} objects")
        top_lnc, data = data.get("lnc"), data["ranks"]
    if not isinstance(data, list):
        raise InputError(path, "ranks", "must be a list of objects")
    if len(data) > MAX_JSON_ROWS:
        raise InputError(path, "ranks", f"{len(data):,} rows; a JSON map holds at most {MAX_JSON_ROWS:,} (CSV: "
                         f"{MAX_ROWS:,})")

    def objects():
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise InputError(path, f"[{i}]", "must be an object with rank, instance, chip, core")
            yield f"[{i}]", i, row
    return objects(), top_lnc


def read_rank_map(path: str) -> RankMapFile:
    """The job's rank map, every row checked (checkmap's docstring), streamed into columns."""
    rows, top_lnc, is_json = _rows(path)
    lnc: set[int] = set()
    if top_lnc is not None:
        lnc.add(_int(path, "", "lnc", top_lnc, 1, 64))
    rank_col, inst_col, chip_col, core_col, line_col = (array("i") for _ in range(5))
    index: dict[str, int] = {}
    ids: list[str] = []
    us_of: list[str | None] = []
    known = set(COLUMNS + OPTIONAL)
    for where, line, row in rows:
        if not known.issuperset(row):
            name = next(k for k in row if k not in known)
            raise InputError(path, f"{where}.{_text(path, where, str(name)[:40]) or '?'}",
                             f"unknown key; the keys are {', '.join(COLUMNS + OPTIONAL)}"
                             f"{closest(str(name), COLUMNS + OPTIONAL)}")
        for key in COLUMNS:
            if row.get(key) in (None, ""):
                raise InputError(path, f"{where}.{key}", "missing required key")
        rank_col.append(_int(path, where, "rank", row["rank"], maximum=MAX_ROWS - 1))
        instance = _text(path, f"{where}.instance", row["instance"])
        if not instance:
            raise InputError(path, f"{where}.instance", "must be a non-empty id")
        us = _text(path, f"{where}.ultraserver", row.get("ultraserver"))
        i = index.get(instance)
        if i is None:
            i = index[instance] = len(ids)
            ids.append(instance)
            us_of.append(us)
        elif us_of[i] != us:
            raise InputError(path, f"{where}.ultraserver", f"instance {instance} is given several UltraServers: "
                             f"{us_of[i]} and {us}")
        inst_col.append(i)
        chip_col.append(_int(path, where, "chip", row["chip"]))
        core_col.append(_int(path, where, "core", row["core"]))
        line_col.append(line)
        if row.get("lnc") not in (None, ""):
            lnc.add(_int(path, where, "lnc", row["lnc"], 1, 64))
    if not rank_col:
        raise InputError(path, "ranks", "no rows")
    where = (lambda row: f"[{row}]") if is_json else (lambda row: f"line {row}")
    columns = {"rank": rank_col, "instance": inst_col, "chip": chip_col, "core": core_col, "line": line_col}
    del rank_col, inst_col, chip_col, core_col, line_col  # _columns frees each as it goes
    return _columns(path, columns, ids, us_of, lnc, where)


def _column(columns: dict, key: str) -> np.ndarray:
    """One column as int32, taken out of ``columns`` (its array freed once the NumPy copy holds it)."""
    return np.array(columns.pop(key), dtype=np.int32)


def _columns(path: str, columns: dict, ids: list[str], us_of: list, lnc: set[int], where) -> RankMapFile:
    """The rows as columns by rank; every rank 0..n-1 once, every (instance, chip, core) once.

    Kept to a few int32 columns (~16 bytes a rank at the peak beyond the columns themselves):
    a file in rank order, as trnopt writes it, is not sorted at all."""
    ranks = _column(columns, "rank")
    n = len(ranks)
    order = None
    if ranks[0] != 0 or not (np.diff(ranks) == 1).all():
        order = np.argsort(ranks, kind="stable")
        ranks = ranks[order]
        twice = np.flatnonzero(ranks[1:] == ranks[:-1])
        if len(twice):
            lines = np.frombuffer(columns["line"], dtype=np.int32)
            first, again = sorted((int(order[twice[0]]), int(order[twice[0] + 1])))
            raise InputError(path, f"{where(int(lines[again]))}.rank", f"rank {int(ranks[twice[0]])} appears "
                             f"twice (also {where(int(lines[first]))})")
        if int(ranks[-1]) != n - 1:
            present = np.zeros(int(ranks[-1]) + 1, dtype=bool)
            present[ranks] = True
            missing = np.flatnonzero(~present[:n])[:1000].tolist()
            raise InputError(path, "rank", f"ranks must be 0..{n - 1}, each once; missing "
                             f"{_ranges(missing)}{' ...' if len(missing) >= 1000 else ''}")
    del ranks
    by_rank = (lambda c: c) if order is None else (lambda c: c[order])
    instance = by_rank(_column(columns, "instance"))
    chip = by_rank(_column(columns, "chip"))
    core = by_rank(_column(columns, "core"))
    _check_devices(path, instance, chip, core, columns, order, ids, where)
    return RankMapFile(path, instance, chip, core, ids, us_of, lnc)


def _check_devices(path: str, instance, chip, core, columns: dict, order, ids: list[str], where) -> None:
    """Every (instance, chip, core) holds one rank: one int64 key per rank, sorted, neighbours compared."""
    chips, cores = int(chip.max()) + 1, int(core.max()) + 1
    key = (instance.astype(np.int64) * chips + chip) * cores + core  # < 2^24 * 2^20 * 2^20 ... in practice small
    if len(ids) * chips * cores >= 2**62:  # ids this many, chips and cores this large: no exact int64 key
        key = np.lexsort((core, chip, instance)).astype(np.int64)
        same = np.flatnonzero((instance[key][1:] == instance[key][:-1]) & (chip[key][1:] == chip[key][:-1])
                              & (core[key][1:] == core[key][:-1]))
        dup = None if not len(same) else (int(key[same[0]]), int(key[same[0] + 1]))
    else:
        ordered = np.sort(key)
        same = np.flatnonzero(ordered[1:] == ordered[:-1])
        dup = None if not len(same) else tuple(np.flatnonzero(key == ordered[same[0]])[:2].tolist())
    if dup is None:
        return
    lines = np.frombuffer(columns["line"], dtype=np.int32)
    lines = lines if order is None else lines[order]
    first, again = sorted(dup, key=lambda r: lines[r])
    raise InputError(path, f"{where(int(lines[again]))}.core", f"instance {ids[instance[again]]} chip "
                     f"{chip[again]} core {core[again]} already holds rank {first}")
