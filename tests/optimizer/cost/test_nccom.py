"""nccom-test output: parsing, bad input as FILE:LINE: rule, the alpha-beta fit, and what a run measures."""

from __future__ import annotations

import math

import pytest

from trnopt.optimizer.cost import nccom as N
from trnopt.optimizer.model.target import load_target

from nccom_tables import table

# The guide's two-instance example ("NCCOM-TEST User Guide", Multiple Instances Example), a few rows of it.
GUIDE = """NEURON_RT_ROOT_COMM_ID=10.1.4.145:45654 nccom-test -r 64 -N 2 -b 8 -e 1GB -f 2 -n 50 -w 5 -d fp32 allr --hosts 127.0.0.1 10.1.4.138
       size(B)    count(elems)    type    time(us)    algbw(GB/s)    busbw(GB/s)
             8               2    fp32         520           0.00           0.00
          4096            1024    fp32         916           0.00           0.01
         16384            4096    fp32        1031           0.01           0.03
      16777216         4194304    fp32        2138           7.31          14.39
    1073741824       268435456    fp32       41806          23.92          47.09
Avg bus bandwidth:      12.3040GB/s
"""


@pytest.mark.parametrize("alpha,bandwidth", [(300e-6, 100e9), (15e-6, 25e9), (1e-3, 500e9), (40e-6, 3e9)])
def test_fit_recovers_planted_alpha_and_beta(alpha, bandwidth):
    sizes = [8 * 4**i for i in range(15)]
    times = [(alpha + s / bandwidth) * (1 + 0.01 * math.sin(1.7 * i + 0.3)) for i, s in enumerate(sizes)]
    fit = N.fit_alpha_beta(sizes, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.02)
    assert 1 / fit.beta_s_per_byte == pytest.approx(bandwidth, rel=0.02)
    assert 0.003 < fit.rms_rel_error < 0.02 and fit.points == 15


def test_table_round_trip_recovers_bus_bandwidth_and_alpha():
    # 64-rank all-reduce at 80 GB/s bus bandwidth: beta = 2(r-1)/r / busbw
    beta = N.bus_factor("all_reduce", 64) / 80e9
    run = N.parse(table("all_reduce", 64, 2, 250e-6, beta), "r.txt")
    assert (run.op, run.ranks, run.nodes) == ("all_reduce", 64, 2)
    fit = N.fit_run(run)
    assert fit.bus_bandwidth("all_reduce", 64) == pytest.approx(80e9, rel=0.02)
    assert fit.alpha_s == pytest.approx(250e-6, rel=0.02)


def test_the_guides_example_parses():
    run = N.parse(GUIDE, "guide.txt")
    assert (run.op, run.ranks, run.nodes) == ("all_reduce", 64, 2) and len(run.rows) == 5
    assert run.rows[-1].time_s == pytest.approx(41806e-6) and run.rows[-1].busbw == 47.09


def test_shape_from_a_trnopt_line_or_the_file_name():
    body = table("all_gather", 32, 1, 100e-6, 1e-10).split("\n", 1)[1]
    run = N.parse("# trnopt: op=all_gather ranks=32 nodes=1 lnc=2 ultraservers=1\n" + body, "x.txt")
    assert (run.op, run.ranks, run.nodes, run.lnc, run.domains) == ("all_gather", 32, 1, 2, 1)
    body = table("all_gather", 256, 4, 100e-6, 1e-10).split("\n", 1)[1]
    run = N.parse(body, "results/allg_r256_N4.txt")
    assert (run.op, run.ranks, run.nodes) == ("all_gather", 256, 4)


def _bad(text: str, path: str = "bad.txt") -> str:
    with pytest.raises(N.MeasurementError) as err:
        N.parse(text, path)
    return str(err.value)


def test_malformed_tables_name_the_file_and_the_line():
    good = table("all_reduce", 64, 1, 300e-6, 2e-11).splitlines()
    assert _bad("\n".join(good[1:])).startswith("bad.txt:1: rank count or operation not given")
    cut = good[:5] + ["      33554432    Failure running neuron-bench - log file /tmp/x.log"]
    assert _bad("\n".join(cut)) == "bad.txt:6: expected 6 columns (size(B) count(elems) type time(us) " \
                                   "algbw(GB/s) busbw(GB/s)), got 8 (a failed benchmark row)"
    row = good[4].split()
    wrong_bus = good[:4] + [" ".join(row[:5] + [f"{float(row[5]) + 5:.2f}"])] + good[5:]
    assert _bad("\n".join(wrong_bus)).startswith("bad.txt:5: busbw")
    wrong_size = good[:4] + [" ".join([row[0], str(int(row[1]) + 1)] + row[2:])] + good[5:]
    assert _bad("\n".join(wrong_size)).startswith("bad.txt:5: size(B)")
    assert _bad("\n".join(good[:-1])).startswith(f"bad.txt:{len(good) - 1}: no 'Avg bus bandwidth' footer")
    footer = good[:-1] + ["Avg bus bandwidth:      99.0000GB/s"]
    assert _bad("\n".join(footer)).startswith(f"bad.txt:{len(good)}: Avg bus bandwidth 99")
    nan = good[:4] + [" ".join(row[:3] + ["nan"] + row[4:])] + good[5:]
    assert _bad("\n".join(nan)).startswith("bad.txt:5: time(us) must be a finite number")
    assert _bad("# nccom-test -r 63 -N 2 allr\n" + "\n".join(good[1:])).startswith(
        "bad.txt:1: 63 ranks do not divide equally over 2 nodes")
    assert _bad("\n".join(good[:4] + good[-1:])).startswith("bad.txt:2: needs at least 3 message sizes")


@pytest.mark.parametrize("name,ranks,nodes,link,names", [
    ("trn2u", 64, 1, "torus", ("x", "y")),      # one instance: its 4x4 torus
    ("trn2", 16, 1, "torus", ("x",)),           # 4 chips: one torus axis
    ("trn2u", 256, 4, "ring", ("ring",)),       # the four instances of one UltraServer
    ("trn2u", 512, 8, "scale_out", ("efa",)),   # two UltraServers
    ("trn2", 128, 2, "scale_out", ("efa",)),    # two trn2 instances
    ("trn3-gen2", 32, 2, "switch", ("switch",)),
    ("trn2u", 4, 1, "core", ()),                # one chip: on-chip traffic only
])
def test_the_link_class_follows_from_ranks_and_nodes(name, ranks, nodes, link, names):
    run = N.parse(table("all_reduce", ranks, nodes, 300e-6, 1e-11), "x.txt")
    assert N.measured_link(load_target(name), run) == (link, names)


def test_a_run_that_does_not_fit_the_target_is_bad_input():
    run = N.parse(table("all_reduce", 96, 1, 300e-6, 1e-11), "odd.txt")  # 24 chips on a 16-chip instance
    with pytest.raises(N.MeasurementError, match=r"^odd.txt:1: 96 ranks per node"):
        N.measured_link(load_target("trn2"), run)
