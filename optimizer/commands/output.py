"""Writing what a command produces: JSON, text or bytes, to a file or to stdout.

An output path is checked before the work starts (``check_output``), so that a solve of
minutes does not end in "file exists" or "no such directory":

- ``-`` is stdout; an empty path is an error;
- an existing file is replaced only with ``--force``; a directory, a device, a FIFO or a
  symbolic link (dangling or not) is never written;
- the folder must exist, be a folder, and take a new file (probed by creating and
  removing one, which also refuses /proc and read-only mounts).

``write_output`` creates the file without following links (``O_EXCL | O_NOFOLLOW``) or,
with ``--force``, writes a temporary file beside it and renames it over the old one.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable

from trnopt.optimizer.errors import InputError


def check_output(path: str | None, flag: str = "--json", force: bool = False) -> None:
    """Refuse an output path that ``write_output`` could not write (see the module docstring)."""
    if path is None or path == "-":
        return
    if not path.strip():
        raise InputError(repr(path), flag, "an empty path; give a file name, or '-' for stdout")
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # the folder check below says which
        info = None
    except (OSError, ValueError) as exc:
        raise InputError(path, flag, f"not a usable path ({getattr(exc, 'strerror', None) or exc})") from None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise InputError(path, flag, "a symbolic link; trnopt writes only regular files it can see")
        if stat.S_ISDIR(info.st_mode):
            raise InputError(path, flag, "is a directory; give a file name inside it")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(path, flag, "not a regular file (a device, FIFO or socket is not written)")
        if not force:
            raise InputError(path, flag, "file exists; trnopt never overwrites a file (pass --force to replace it)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        why = "does not exist" if not os.path.lexists(folder) else "is not a folder"
        raise InputError(path, flag, f"the folder {folder} {why}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".trnopt-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(path, flag, f"cannot write in {folder} ({exc.strerror or exc})") from None


def to_stdout(write: Callable[[], object]) -> None:
    """Run ``write`` (what a command prints to stdout) and flush it; a reader that left (``| head``)
    stops it quietly: commands write their files before stdout, and stderr stays open for the rest."""
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def write_output(path: str, payload: dict | str | bytes, force: bool = False, flag: str = "--json") -> None:
    """Write JSON, text or bytes to a file, or to stdout for '-'; never overwrite a file unless forced."""
    data = payload if isinstance(payload, (str, bytes)) else json.dumps(payload, indent=2) + "\n"
    write_stream(path, [data], force, flag)


def write_stream(path: str, chunks: Iterable[str | bytes], force: bool = False, flag: str = "--json") -> None:
    """Write text or byte chunks as they come (a rank map of millions of rows is never held whole)."""
    if path == "-":
        for chunk in chunks:
            if isinstance(chunk, bytes):
                sys.stdout.buffer.write(chunk)
            else:
                sys.stdout.write(chunk)
        return
    check_output(path, flag, force)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        if os.path.lexists(path):  # forced: write beside it, then replace it in one rename
            fd, tmp = tempfile.mkstemp(prefix=".trnopt-", dir=folder)
        else:
            fd, tmp = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644), None
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk if isinstance(chunk, bytes) else chunk.encode("utf-8"))
            if tmp is not None:
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)
        finally:
            if tmp is not None and os.path.lexists(tmp):
                os.unlink(tmp)
    except FileExistsError:
        raise InputError(path, flag, "file exists; trnopt never overwrites a file (pass --force to replace it)") from None
    except OSError as exc:
        raise InputError(path, flag, f"cannot be written ({exc.strerror or exc})") from None
