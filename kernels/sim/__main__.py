"""``python -m trnopt.kernels.sim run FILE::KERNEL [options]``: run an unmodified NKI kernel.

    python -m trnopt.kernels.sim run add.py::add_kernel --input 128x512:float32 --input 128x512:float32
    python -m trnopt.kernels.sim run ring.py::ring --ranks 4 --lnc 2 --input 256x512:bfloat16 --kw tp=4

Inputs, in the kernel's positional order: ``SHAPE:DTYPE`` (``128x512:bfloat16``) for a
random standard-normal array (integer dtypes: integers in [0, 8)), a plain number or
``true``/``false`` for a scalar. ``--kw name=VALUE`` passes a keyword argument in the same
forms. Each rank gets arrays from its own seed (``--seed`` + rank). Prints each rank's
outputs (shape, dtype, finite mean) and the timeline summary. Bad input or a kernel
failure: one line on stderr and exit status 2 (1 for an internal error); ``--debug``
shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np


class UsageError(Exception):
    """Bad command-line input."""


def parse_value(text: str, rng: np.random.Generator) -> Any:
    """``SHAPE:DTYPE`` -> a random array; a number or true/false -> that scalar."""
    if ":" in text:
        shape_s, dtype_s = text.split(":", 1)
        try:
            shape = tuple(int(d) for d in shape_s.lower().split("x")) if shape_s else ()
        except ValueError:
            raise UsageError(f"input {text!r}: shape must be dims joined by 'x', e.g. 128x512") from None
        if any(d <= 0 for d in shape):
            raise UsageError(f"input {text!r}: dims must be positive")
        from . import language as nl
        dtype = getattr(nl, dtype_s, None)
        if not isinstance(dtype, np.dtype):
            raise UsageError(f"input {text!r}: unknown dtype {dtype_s!r} (use an nl dtype name such as "
                             f"float32, bfloat16, int32)")
        if dtype.kind in "iu":
            return rng.integers(0, 8, size=shape).astype(dtype)
        return rng.standard_normal(shape).astype(np.float32).astype(dtype)
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def load_kernel(spec: str) -> Any:
    if "::" not in spec:
        raise UsageError(f"kernel {spec!r}: expected FILE::KERNEL, e.g. my_kernels.py::add_kernel")
    file_s, name = spec.rsplit("::", 1)
    path = Path(file_s)
    if not path.is_file():
        raise UsageError(f"kernel file {file_s!r} not found")
    from .shim import install
    install()
    sys.path.insert(0, str(path.resolve().parent))
    mod_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - reported as one line
        raise UsageError(f"importing {file_s}: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, name):
        raise UsageError(f"{file_s} has no kernel {name!r}")
    return getattr(module, name)


def _summary(value: Any) -> str:
    if isinstance(value, np.ndarray):
        f = value.astype(np.float64) if value.dtype.kind in "fiub" or "float" in value.dtype.name else None
        mean = f"{np.nanmean(f):.6g}" if f is not None and f.size else "-"
        nan = int(np.isnan(f).sum()) if f is not None else 0
        return f"array {value.shape} {value.dtype.name} mean {mean}" + (f" ({nan} NaN)" if nan else "")
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_summary(v) for v in value) + ")"
    return repr(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trnopt.kernels.sim", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run FILE::KERNEL on the simulator")
    run.add_argument("kernel", help="FILE::KERNEL")
    run.add_argument("--input", action="append", default=[], help="SHAPE:DTYPE or a scalar, in positional order")
    run.add_argument("--kw", action="append", default=[], help="NAME=VALUE keyword argument")
    run.add_argument("--ranks", type=int, default=1)
    run.add_argument("--lnc", type=int, default=None, help="programs per rank (default: the kernel's grid)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--no-numerics", action="store_true", help="schedule only (inputs become shape specs)")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds without progress before failing")
    run.add_argument("--debug", action="store_true", help="show tracebacks")
    args = ap.parse_args(argv)
    try:
        if args.ranks < 1:
            raise UsageError(f"--ranks must be >= 1, got {args.ranks}")
        if args.lnc is not None and args.lnc < 1:
            raise UsageError(f"--lnc must be >= 1, got {args.lnc}")
        kernel = load_kernel(args.kernel)
        from .runner import TensorSpec, run_ranks
        per_rank, kwargs = [], {}
        for r in range(args.ranks):
            rng = np.random.default_rng(args.seed + r)
            vals = [parse_value(t, rng) for t in args.input]
            if args.no_numerics:
                vals = [TensorSpec(v.shape, v.dtype) if isinstance(v, np.ndarray) else v for v in vals]
            per_rank.append(tuple(vals))
        rng = np.random.default_rng(args.seed + 10_000)
        for kv in args.kw:
            if "=" not in kv:
                raise UsageError(f"--kw {kv!r}: expected NAME=VALUE")
            k, v = kv.split("=", 1)
            kwargs[k] = parse_value(v, rng)
        res = run_ranks(kernel, per_rank, numerics=not args.no_numerics, lnc=args.lnc, kwargs=kwargs,
                        timeout_s=args.timeout)
    except UsageError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a kernel failure, reported as one line
        if args.debug:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"error: {type(exc).__name__}: {first}", file=sys.stderr)
        return 2
    if res.outputs is not None:
        for r, out in enumerate(res.outputs):
            print(f"rank {r}: {_summary(out)}")
    print(res.timeline.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
