"""install(): unmodified kernels that ``import nki`` run on the simulator; the command line
runs FILE::KERNEL and reports bad input in one line with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from trnopt.kernels import sim

KERNEL = textwrap.dedent('''
    import nki
    import nki.isa as nisa
    import nki.language as nl
    from nki.isa.constants import oob_mode
    from nki.typing import tensor

    @nki.jit
    def add_rows(a: tensor, b: tensor):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), nl.load(b)))
        return out

    @nki.jit
    def scale_in_place(a):
        t = nl.load(a)
        nl.store(a, value=nl.multiply(t, 2.0))
        return a
''')


@pytest.fixture
def kernel_file(tmp_path):
    path = tmp_path / "my_kernels.py"
    path.write_text(KERNEL)
    return path


def test_install_maps_nki_and_its_submodules(kernel_file) -> None:
    nki = sim.install()
    try:
        import importlib.util

        import nki.collectives
        import nki.dtype
        import nki.isa.constants
        import nki.language

        assert nki.language is sim.language and nki.isa.constants.oob_mode.skip
        assert nki.dtype.bfloat16 == sim.language.bfloat16
        spec = importlib.util.spec_from_file_location("my_kernels", kernel_file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(nki.simulate(mod.add_rows)(a, b=a), 2 * a)
        x = a.copy()
        nki.simulate(mod.scale_in_place)(x)
        np.testing.assert_array_equal(x, 2 * a)  # written inputs update in place
    finally:
        sim.uninstall()


def test_trnopt_kernels_run_through_the_shim() -> None:
    # As AWS's kernels do: the shim installed first, trnopt's kernels then import nki through
    # it (a fresh interpreter, so nki_api resolves `import nki` after install()), run on four
    # ranks and match their references; nki_api does not take the shim for a real package.
    code = textwrap.dedent('''
        from trnopt.kernels import sim
        sim.install()
        import nki, nki.collectives
        from trnopt.kernels import nki_api
        assert nki_api.nki is nki and nki_api.ncc is nki.collectives and not nki_api.USING_REAL_NKI
        from trnopt.kernels.overlap import BF16, measure
        for kernel, shape in (("allgather_matmul", {"m": 256, "k": 200, "n": 96}),
                              ("matmul_reduce_scatter", {"m": 256, "k": 130, "n": 300}),
                              ("alltoall_expert_matmul", {"tokens": 64, "h": 130, "f": 96, "n_sub": 2})):
            r = measure(kernel, shape, tp=4, link=sim.LinkModel(256e9, 1.5e-6), channels=2, numerics=True,
                        dtype=BF16)
            print(kernel, r.ok)
    ''')
    env = {k: v for k, v in os.environ.items() if k != "TRNOPT_FORCE_SIM"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["allgather_matmul", "True", "matmul_reduce_scatter", "True",
                                  "alltoall_expert_matmul", "True"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trnopt.kernels.sim", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_runs_a_kernel(kernel_file) -> None:
    res = _cli("run", f"{kernel_file}::add_rows", "--input", "4x8:float32", "--input", "4x8:float32", "--ranks", "2")
    assert res.returncode == 0, res.stderr
    assert "rank 1: array (4, 8) float32" in res.stdout and "kernel time" in res.stdout


@pytest.mark.parametrize("args, msg", [
    (["{f}::nope"], "has no kernel 'nope'"),
    (["{f}::add_rows", "--input", "4x8:float99"], "unknown dtype 'float99'"),
    (["{f}::add_rows", "--input", "4xq:float32"], "shape must be dims joined by 'x'"),
    (["missing.py::k"], "kernel file 'missing.py' not found"),
    (["{f}::add_rows", "--input", "4x8:float32", "--input", "4x9:float32"], "ConstraintError"),
])
def test_cli_bad_input_is_one_line_and_exit_2(kernel_file, args, msg) -> None:
    res = _cli("run", *[a.format(f=kernel_file) for a in args])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], res.stderr
    assert "Traceback" not in res.stderr
