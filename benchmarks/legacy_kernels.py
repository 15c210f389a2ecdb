"""How many of AWS's pre-0.6 NKI kernels (``neuronxcc.nki``) run unmodified on trnopt's
simulator and match NumPy.

    python benchmarks/legacy_kernels.py /work/scratch/legacy [-k SUBSTRING]

FOLDER holds aws-neuron/aws-neuron-sdk's ``nki/`` folder at commit 8e58db40 (the last
pre-0.6 docs), kept outside this repository:
  FOLDER/nki/examples/...  the tutorials: each kernel is run here on inputs generated here
                           and checked element by element against a NumPy reference
                           written here (rtol on the element, atol scaled to the dtype);
  FOLDER/nki/test/*.py     the API reference's doc examples: unittest files that call
                           their kernels on NumPy arrays; each test method is run
                           unmodified and counted as matching when it passes (its own
                           NumPy check, not one written here: say so when quoting it).
Every file is imported through ``trnopt.kernels.sim.shim.install_legacy()``. Tutorial files
that hold no runnable pre-0.6 kernel (snippets that do not parse, a file written in the 0.6+
API) are listed as "not runnable" with the reason and not counted. Prints one line per case
and the counts; says "not run" when the folder is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import unittest
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

EX = "nki/examples"
# atol per dtype: a few units in the last place of values of order 1
ATOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float16): 4e-3, np.dtype(ml_dtypes.bfloat16): 3e-2,
        np.dtype(np.int8): 0.0, np.dtype(np.int32): 0.0}


@dataclass(frozen=True)
class Case:
    """One tutorial kernel: ``file::kernel`` on ``inputs(rng)``, checked against ``reference``."""

    file: str  # path under FOLDER/nki/examples
    kernel: str  # the @nki.jit function
    inputs: Callable[[np.random.Generator], tuple]  # positional arguments (arrays and scalars)
    reference: Callable[..., Any]  # NumPy reference of the kernel's outputs, from the same inputs
    grid: tuple[int, ...] | None = None  # SPMD launch grid, kernel[grid]
    rtol: float = 1e-4  # relative tolerance on each element
    kwargs: tuple = ()  # keyword arguments (name, value)
    computes_in: Any = None  # a dtype the kernel rounds its intermediates to (None: the output's):
    # then each element must be within one unit roundoff of it, rtol = u and atol = u x max |reference|


def _r(rng, *shape, dtype=np.float32, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def _softmax_rows(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _attn(q, k, v):
    """softmax(q.T @ k) @ v.T with q, k, v [d_head, seqlen]."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    return _softmax_rows(q.T @ k) @ v.T


def _layernorm(x, eps, g, b):
    x = x.astype(np.float64)
    m = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return (x - m) / np.sqrt(var + eps) * g + b


def _rmsnorm(a, g):
    a = a.astype(np.float64)
    return a / np.sqrt((a * a).mean(axis=1, keepdims=True)) * g


def _mamba(delta, u, A, B, C):
    """h[t] = exp(delta[t] A) h[t-1] + delta[t] B[t] u[t]; y[t] = sum_n C[t, n] h[t, n]."""
    batch, ch, seq = delta.shape
    out = np.zeros((batch, ch, seq))
    for b in range(batch):
        h = np.zeros((ch, A.shape[1]))
        for t in range(seq):
            h = np.exp(delta[b, :, t, None] * A) * h + (delta[b, :, t] * u[b, :, t])[:, None] * B[b, None, :, t]
            out[b, :, t] = h @ C[b, :, t]
    return out


def _pool(x, p, fn):
    c, h, w = x.shape
    return fn(x.reshape(c, h // p, p, w // p, p).astype(np.float64), axis=(2, 4))


def _sd_attn(q, k, v):
    """fused_self_attn_for_SD_small_head_size: q, k, v [seqlen, d_head]; softmax(0.125 q k^T) v
    (the kernel's softmax scale is 0.125, 1 / sqrt(64))."""
    return _softmax_rows(0.125 * q.astype(np.float64) @ k.astype(np.float64).T) @ v.astype(np.float64)


def _cases() -> list[Case]:
    qkv = lambda s: (lambda rng: tuple(_r(rng, 128, s) for _ in range(3)))  # noqa: E731
    # v7 and v8 round the scores and V to BF16 before the second matmul (the tutorial: "Downcast
    # scores before transpose ... small precision loss") but return FP32
    attn_cases = [Case("attention/attention_kernels.py", f"attn_fwd_v{v}", qkv(128 if v in ("1", "2") else 4096),
                       _attn, rtol=1e-3, computes_in=ml_dtypes.bfloat16 if v in ("7", "8") else None)
                  for v in ("1", "2", "3", "4", "5", "6", "7", "8", "8a", "9", "10", "11")]
    mamba = lambda rng: (_r(rng, 1, 128, 512, lo=0.0, hi=0.1), _r(rng, 1, 128, 512),  # noqa: E731
                         _r(rng, 128, 16, lo=-1.0, hi=0.0), _r(rng, 1, 16, 512), _r(rng, 1, 16, 512))
    ln = lambda rng: (_r(rng, 300, 512), 1e-5, _r(rng, 512), _r(rng, 512))  # noqa: E731
    return attn_cases + [
        Case("average_pool2d/average_pool2d_nki_kernels.py", "tensor_avgpool_kernel",
             lambda rng: (np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6), 2),
             lambda x, p: _pool(x, p, np.mean), rtol=1e-3),
        *[Case("fused_mamba/mamba_nki_kernels.py", f"mamba_v{v}", mamba, _mamba, rtol=1e-3) for v in (1, 2, 3)],
        Case("getting_started_baremetal.py", "nki_tensor_add_kernel",
             lambda rng: (_r(rng, 4, 3, dtype=np.float16), _r(rng, 4, 3, dtype=np.float16)),
             lambda a, b: a.astype(np.float64) + b, rtol=1e-3),
        Case("index-case-1.py", "tensor_split_kernel_", lambda rng: (_r(rng, 4, 5),),
             lambda x: (x[:, 0::2], x[:, 1::2])),
        Case("index-case-3.py", "tensor_maxpool_kernel_",
             lambda rng: (np.arange(2 * 6 * 6, dtype=np.float32).reshape(2, 6, 6), 2),
             lambda x, p: _pool(x, p, np.max)),
        Case("layernorm/layernorm_nki_kernel.py", "nki_layernorm_kernel_v1", ln, _layernorm, rtol=1e-3),
        Case("layernorm/layernorm_nki_kernel.py", "nki_layernorm_kernel_v2", ln, _layernorm, rtol=1e-3),
        Case("prof-kernel.py", "tensor_exp_kernel_", lambda rng: (_r(rng, 250, 512),), np.exp),
        Case("mm-nisa-spmd.py", "matmul_128x128x512_spmd", lambda rng: (_r(rng, 128, 512), _r(rng, 128, 1024)),
             lambda a, b: a.T.astype(np.float64) @ b, grid=(4, 2), rtol=1e-3),
        Case("mm-nl-spmd.py", "matmul_128x128x512_spmd", lambda rng: (_r(rng, 512, 128), _r(rng, 128, 1024)),
             lambda a, b: a.astype(np.float64) @ b, grid=(4, 2), rtol=1e-3),
        Case("rmsnorm/rmsnorm_nki_kernels.py", "nki_rmsnorm_kernel", lambda rng: (_r(rng, 250, 512), _r(rng, 512)),
             _rmsnorm, rtol=1e-3),
        Case("sd_attention/sd_attention_nki_kernels.py", "fused_self_attn_for_SD_small_head_size",
             lambda rng: tuple(_r(rng, 4096, 64) for _ in range(3)), _sd_attn, rtol=2e-2),
        Case("tensor_addition/spmd_tensor_addition_nki_kernels.py", "nki_tensor_add",
             lambda rng: (_r(rng, 256, 1024, dtype=np.float16), _r(rng, 256, 1024, dtype=np.float16)),
             lambda a, b: a.astype(np.float64) + b, rtol=1e-3),
        Case("transpose2d/transpose2d_nki_kernels.py", "tensor_transpose2D_kernel_",
             lambda rng: (np.arange(5 * 12, dtype=np.int8).reshape(5, 12), (3, 4)),
             lambda a, s: np.transpose(a.reshape(5, 3, 4), (0, 2, 1)).reshape(5, 12)),
    ]


# Tutorials files that hold no runnable kernel taking inputs, and why (counted apart)
NOT_RUNNABLE = {
    "layout-loop.py": "snippet: imports torch_neuronx and uses an undefined index i_f",
    "layout-dynamic-loop.py": "snippet: a syntax error (unclosed parenthesis)",
    "layout-violation.py": "shows a violation (partition dim 256 > 128): an expected error, checked below",
    "layout-pass.py": "snippet: a syntax error (line 18 closes '[' with ')')",
    "matrix_multiplication/matrix_multiplication_nki_kernels.py":
        "not pre-0.6: written in the 0.6+ API (import nki, nisa.dma_copy); aws_kernels.py runs these kernels",
}


# Failures that are the right outcome, and why (printed beside their rows; still counted as failures)
WHY_NOT = {
    "prof-kernel.py::tensor_exp_kernel_": "the tutorial's `return` is inside the affine_range loop body, so only "
                                          "the first 128-row tile is computed; rows 128-249 are never written",
    "test_nki_isa_dma_copy.py::test_indirect_load_oob_err_negative": "refused as out of bounds, as the test wants; it "
                                                                   "also wants AWS's simulator's IndexError text",
    "test_nki_isa_dma_copy.py::test_indirect_store_oob_err_negative": "refused as out of bounds, as the test wants; "
                                                                    "it also wants AWS's simulator's IndexError text",
    "test_nki_isa_range_select.py::test_range_select_example": "the kernel returns an SBUF tile; top-level outputs "
                                                             "must be in HBM (NKI Known Issues, 'Unsupported Syntax' 1)",
    "test_nki_isa_activation.py::test_activation": "the example casts its result to BF16 (dtype=nl.bfloat16) and "
                                                   "checks it against an FP32 golden at np.allclose's rtol 1e-5",
}


def compare(got: Any, want: Any, rtol: float, computes_in: Any = None) -> str:
    """'' when every element is within atol(dtype) + rtol * |want| of the reference; with
    ``computes_in``, within u + u * |want| of it, u the unit roundoff of that dtype (eps / 2)
    times the reference's largest magnitude for the atol."""
    if isinstance(want, tuple):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"expected {len(want)} outputs, got {type(got).__name__}"
        return next((f"output {i}: {m}" for i, (g, w) in enumerate(zip(got, want))
                     if (m := compare(g, w, rtol, computes_in))), "")
    g = np.asarray(got)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        return f"shape {g.shape} != {w.shape}"
    atol = ATOL.get(g.dtype, 1e-4)
    if computes_in is not None:
        rtol = float(ml_dtypes.finfo(computes_in).eps) / 2
        atol = rtol * float(np.abs(w).max(initial=0.0))
    err = np.abs(g.astype(np.float64) - w)
    bad = np.isnan(err) | (err > atol + rtol * np.abs(w))
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(np.isnan(err), np.inf, err)), err.shape)
        return f"{int(bad.sum())} of {bad.size} elements off, worst at {tuple(map(int, i))}: {g[i]} vs {w[i]:.6g}"
    return ""


def _load(path: Path) -> Any:
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"legacy_{path.stem.replace('-', '_')}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(path.parent))


def run_case(folder: Path, case: Case) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    try:
        mod = _load(folder / EX / case.file)
        kernel = getattr(mod, case.kernel)
        if case.grid:
            kernel = kernel[case.grid]
        args = case.inputs(rng)
        got = kernel(*args, **dict(case.kwargs))
    except Exception as e:  # noqa: BLE001 - a case's failure is its outcome
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    msg = compare(got, case.reference(*args), case.rtol, case.computes_in)
    return ("mismatch", msg) if msg else ("match", "")


def run_violation(folder: Path) -> tuple[str, str]:
    """layout-violation.py: a [256, 512] tile must be refused (partition dim > 128)."""
    from trnopt.kernels.sim.errors import ConstraintError
    try:
        mod = _load(folder / EX / "layout-violation.py")
        mod.tensor_exp_kernel_(np.ones((256, 512), np.float32))
    except ConstraintError as e:
        return "match", f"refused: {str(e)[:120]}"
    except Exception as e:  # noqa: BLE001
        return "error", f"{type(e).__name__}: {str(e)[:160]}"
    return "mismatch", "not refused"


def run_doc_examples(folder: Path, only: str | None) -> list[tuple[str, str, str]]:
    out = []
    for f in sorted((folder / "nki/test").glob("test_*.py")):
        try:
            suite = unittest.defaultTestLoader.loadTestsFromModule(_load(f))
        except Exception as e:  # noqa: BLE001
            out.append((f.name, "error", f"import: {type(e).__name__}: {str(e)[:160]}"))
            continue
        for group in suite:
            for test in group:
                name = f"{f.name}::{test.id().rsplit('.', 1)[1]}"
                if only and only not in name:
                    continue
                res = unittest.TestResult()
                test.run(res)
                bad = res.errors + res.failures
                out.append((name, "match" if not bad else "error" if res.errors else "mismatch",
                            bad[0][1].strip().splitlines()[-1][:200] if bad else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("-k", dest="only", default=None)
    a = ap.parse_args(argv)
    if not (a.folder / EX).is_dir():
        print(f"not run: {a.folder / EX} is missing (extract aws-neuron-sdk nki/ at 8e58db40 there)")
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from trnopt.kernels.sim import shim
    shim.install_legacy()
    os.environ.setdefault("NEURON_FRAMEWORK_DEBUG", "0")
    t0 = time.process_time()
    rows = [(f"{c.file}::{c.kernel}", *run_case(a.folder, c)) for c in _cases()
            if not a.only or a.only in f"{c.file}::{c.kernel}"]
    if not a.only or "violation" in a.only:
        rows.append(("layout-violation.py::tensor_exp_kernel_ (expected error)", *run_violation(a.folder)))
    for name, why in NOT_RUNNABLE.items():
        if name != "layout-violation.py":
            print(f"{'not runnable':12s} {name}: {why}")
    for name, status, detail in rows:
        print(f"{status:12s} {name} {detail}" + (f" [right outcome: {WHY_NOT[name]}]" if name in WHY_NOT else ""))
    tut = sum(s == "match" for _, s, _ in rows)
    docs = run_doc_examples(a.folder, a.only)
    for name, status, detail in docs:
        print(f"{status:12s} {name} {detail}" + (f" [right outcome: {WHY_NOT[name]}]" if name in WHY_NOT else ""))
    doc_ok = sum(s == "match" for _, s, _ in docs)
    print(f"tutorials: {tut} of {len(rows)} match (references written here)")
    print(f"doc examples: {doc_ok} of {len(docs)} pass their own NumPy check")
    print(f"CPU seconds: {time.process_time() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
