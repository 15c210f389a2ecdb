"""How many of AWS's public NKI 0.6+ kernels run unmodified on trnopt's simulator and match NumPy.

    /work/venv/bin/python benchmarks/aws_kernels.py /work/scratch/aws-kernels [-k SUBSTRING]

(-k runs only the kernels whose ``file::kernel`` contains SUBSTRING; the count is then partial.)

FOLDER holds copies of the kernels, kept outside this repository:
  FOLDER/sdk/*.py  the 0.6+ files of aws-neuron-sdk nki/examples (``import nki``, not
                   ``neuronxcc.nki``);
  FOLDER/lib/src/nkilib_src/nkilib/...  aws-neuron/nki-library (its ``nkilib`` package).
Each kernel file is imported through ``trnopt.kernels.sim.install()`` (``import nki`` maps
to the simulator), run on generated inputs and compared element by element with a NumPy reference written
here (or an expected error, for the examples that show a violation): the tolerance is in
units of the output dtype's eps (`aws_case` says the rule and why), and a match counts
only if the same check refuses the output scaled by 1.01 and the output with two rows
swapped (else "loose"). Every public
``@nki.jit`` kernel found in the folder is listed; kernels without a case here are counted
in the total as "no case". Prints a table and the count; says "not run" when the folder is
missing. The cases live beside this file: `aws_case` (the Case type and shared helpers),
`aws_cases_sdk`, `aws_cases_lib`, `aws_cases_blocks`, `aws_cases_moe`, `aws_cases_mx` and
`aws_cases_mx_cte`.
Some of AWS's files import scipy (nki-library's topk utilities) or torch (its
experimental.transformer package imports its torch references): ``pip install scipy
torch==2.13.0`` (the CPU wheel the ``frameworks`` extra pins) to run those.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aws_case import DEFAULT_ULPS, LIB, Case, mismatch, outputs, wrong_answers
from aws_cases_blocks import BLOCK_CASES
from aws_cases_lib import LIB_CASES
from aws_cases_moe import MOE_CASES
from aws_cases_mx import MX_CASES
from aws_cases_mx_cte import MX_MOE_CASES
from aws_cases_sdk import SDK_CASES, SDK_NOT_KERNELS


# --- running ---------------------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    status: str  # "match", "mismatch", "loose", "error", "no case", "hardware only", "not a kernel"
    detail: str = ""
    seconds: float = 0.0


def _import(folder: Path, case: Case) -> Any:
    if case.legacy_api:
        from trnopt.kernels.sim.shim import install_legacy, uninstall_legacy
        install_legacy()
        try:
            return _import_file(folder, case)
        finally:
            uninstall_legacy()
    return _import_file(folder, case)


def _import_file(folder: Path, case: Case) -> Any:
    path = folder / case.file
    if case.module:
        root = str(folder / LIB)
        if root not in sys.path:
            sys.path.insert(0, root)
        return importlib.import_module(case.module)
    spec = importlib.util.spec_from_file_location(f"aws_{path.stem.replace('-', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_case(folder: Path, case: Case) -> Outcome:
    """Run one case; environment variables a kernel file sets at import are undone after it."""
    import os

    saved = dict(os.environ)
    try:
        return _run_case(folder, case)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run_case(folder: Path, case: Case) -> Outcome:
    from trnopt.kernels.sim import run_ranks

    if case.hardware_only:
        return Outcome(case, "hardware only", case.hardware_only)
    t0 = time.perf_counter()
    try:
        mod = _import(folder, case)
        kernel = getattr(mod, case.kernel)
        if case.wrap:
            kernel = case.wrap(kernel)
        per_rank = [case.inputs(np.random.default_rng(1000 + r), r) for r in range(case.ranks)]
        kwargs = per_rank[0][1]
        res = run_ranks(kernel, [a for a, _ in per_rank], lnc=case.lnc, kwargs=kwargs, timeout_s=120)
    except Exception as exc:  # noqa: BLE001 - reported per kernel
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if case.expect_error and re.search(case.expect_error, str(exc)):
            return Outcome(case, "match", f"raises as expected: {msg[:90]}", time.perf_counter() - t0)
        tb = traceback.extract_tb(exc.__traceback__)
        ours = str(Path(__file__).resolve().parents[1])  # this repository: the simulator and the cases
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                      if "trnopt" not in f.filename and not f.filename.startswith(ours)), "")
        return Outcome(case, "error", f"{msg[:160]} [{where}]", time.perf_counter() - t0)
    if case.expect_error:
        return Outcome(case, "mismatch", f"expected an error matching {case.expect_error!r}", time.perf_counter() - t0)
    loose = set()
    for r in range(case.ranks):
        want = case.reference(per_rank[r][0], kwargs, r, [a for a, _ in per_rank])
        got = case.post(res.outputs[r]) if case.post else res.outputs[r]
        given = case.eps_dtype if isinstance(case.eps_dtype, tuple) else (case.eps_dtype,) * len(outputs(got))
        dtypes = [o.dtype if d is None else np.dtype(d) for o, d in zip(outputs(got), given)]
        msg = mismatch(got, want, case, dtypes)
        if msg:
            return Outcome(case, "mismatch", f"rank {r}: {msg}", time.perf_counter() - t0)
        wrongs = wrong_answers(got)
        unswappable = "row swap" not in wrongs
        loose |= {name for name, wrong in wrongs.items() if not mismatch(wrong, want, case, dtypes)}
    seconds = time.perf_counter() - t0
    if loose:
        return Outcome(case, "loose", f"the check passes a wrong answer: {', '.join(sorted(loose))}", seconds)
    ulps = "" if (case.rtol_ulps, case.atol_ulps) == DEFAULT_ULPS else \
        f"rtol {case.rtol_ulps:g} ulp, atol {case.atol_ulps:g} ulp x rms: {case.why}"
    note = "no two different rows to swap" if unswappable else ""
    return Outcome(case, "match", "; ".join(x for x in (note, ulps) if x), seconds)


def public_kernels(folder: Path) -> list[tuple[str, str]]:
    """(file, kernel) of every public @nki.jit function of the 0.6+ files in the folder."""
    found = []
    files = sorted((folder / "sdk").glob("*.py")) + sorted((folder / LIB).rglob("*.py"))
    for path in files:
        text = path.read_text(errors="replace")
        if "neuronxcc" in text and "import nki" not in text:
            continue  # pre-0.6 API
        for m in re.finditer(r"^@nki\.jit[^\n]*\n(?:@[^\n]*\n)*def ([A-Za-z_]\w*)", text, re.M):
            if not m.group(1).startswith("_"):
                found.append((str(path.relative_to(folder)), m.group(1)))
    return found


def main(argv: list[str]) -> int:
    only = ""
    if len(argv) == 3 and argv[1] == "-k":
        argv, only = argv[:1], argv[2]
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1])
        return 2
    folder = Path(argv[0])
    if not folder.is_dir():
        print(f"not run: kernel folder {folder} not found (copy aws-neuron-sdk nki/examples and "
              f"aws-neuron/nki-library there, see the module docstring)")
        return 0
    from trnopt.kernels.sim import install
    install()
    cases = {(c.file, c.kernel): c for c in SDK_CASES + LIB_CASES + BLOCK_CASES + MOE_CASES + MX_CASES + MX_MOE_CASES}
    outcomes: list[Outcome] = []
    for file, kernel in public_kernels(folder):
        case = cases.pop((file, kernel), None)
        if only not in f"{file}::{kernel}":
            continue
        if Path(file).name in SDK_NOT_KERNELS:
            outcomes.append(Outcome(Case(file, kernel, None, None), "not a kernel", SDK_NOT_KERNELS[Path(file).name]))
        elif case is None:
            outcomes.append(Outcome(Case(file, kernel, None, None), "no case", "no inputs / reference written"))
        else:
            outcomes.append(run_case(folder, case))
    for case in cases.values():
        if only not in f"{case.file}::{case.kernel}":
            continue
        outcomes.append(Outcome(case, "error", "kernel not found in the folder"))
    width = max(len(f"{o.case.file}::{o.case.kernel}") for o in outcomes)
    print(f"{'kernel':<{width}}  {'result':<13} {'s':>6}  detail")
    for o in outcomes:
        print(f"{o.case.file + '::' + o.case.kernel:<{width}}  {o.status:<13} {o.seconds:6.2f}  {o.detail}")
    counted = [o for o in outcomes if o.status not in ("hardware only", "not a kernel")]
    ok = sum(o.status == "match" for o in counted)
    excluded = len(outcomes) - len(counted)
    print(f"\n{ok} of {len(counted)} kernels run unmodified and match NumPy "
          f"({excluded} excluded: hardware-only features or not kernels; "
          f"{sum(o.status == 'no case' for o in counted)} without a case here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
