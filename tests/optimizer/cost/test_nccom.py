"""nccom-test output: parsing, bad input as FILE:LINE: rule, the alpha-beta fit, and what a run measures."""

from __future__ import annotations

import math

import pytest

from trnopt.optimizer.cost import nccom as N
from trnopt.optimizer.cost import nccom_run as R
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
    # two UltraServers: the hierarchical all-reduce sends S/256 per rank over EFA, the ring carries 96%
    ("trn2u", 512, 8, "ring", ("ring",)),
    ("trn2", 128, 2, "torus", ("x", "y")),      # two trn2 instances: EFA carries 31% at the file's shares
    ("trn3-gen2", 32, 2, "switch", ("switch",)),
    ("trn2u", 4, 1, "core", ()),                # one chip: on-chip traffic only
])
def test_the_link_class_that_limits_the_run(name, ranks, nodes, link, names):
    run = N.parse(table("all_reduce", ranks, nodes, 300e-6, 1e-11), "x.txt")
    assert R.measured_link(load_target(name), run) == (link, names)


def test_byte_shares_add_up_and_efa_limits_a_slow_efa():
    target = load_target("trn2")
    run = N.parse(table("all_reduce", 1024, 16, 300e-6, 1e-11), "x.txt")
    shares = R.byte_shares(target, run)
    assert set(shares) == {("x", "y"), ("efa",)} and 0.95 < sum(shares.values()) < 1.0  # the rest is on-chip
    slow = R.scaled_links(target, ("efa",), 0.5)
    assert R.measured_link(slow, run) == ("scale_out", ("efa",))


def test_a_run_that_does_not_fit_the_target_is_bad_input():
    run = N.parse(table("all_reduce", 96, 1, 300e-6, 1e-11), "odd.txt")  # 24 chips on a 16-chip instance
    with pytest.raises(N.MeasurementError, match=r"^odd.txt:1: 96 ranks per node"):
        R.measured_link(load_target("trn2"), run)


def _footer(text: str) -> str:
    lines = table("all_reduce", 64, 1, 300e-6, 2e-11).splitlines()
    assert len(lines) == 31 and lines[-1].startswith("Avg bus bandwidth:")
    return "\n".join(lines[:-1] + [text])


def _row(size: int, t_us: float, op: str = "all_reduce", ranks: int = 64) -> str:
    algbw = size / (t_us * 1e-6) / 2**30
    return f"{size:>12} {size:>15} {'uint8':>8} {t_us:>11g} {algbw:>14.2f} {algbw * N.bus_factor(op, ranks):>14.2f}"


def _tab(rows: list[tuple[int, float]], first: str = "# nccom-test -r 64 allr") -> str:
    lines = [_row(s, t) for s, t in rows]
    mean = sum(float(x.split()[-1]) for x in lines) / len(lines)
    return "\n".join([first, "     size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)", *lines,
                      f"Avg bus bandwidth:      {mean:.4f}GB/s"])


@pytest.mark.parametrize("text, line, rule", [
    (lambda: _footer("Avg bus bandwidth:      .GB/s"), 31, "expected 'Avg bus"),
    (lambda: _footer("Avg bus bandwidth: 1.2.3GB/s"), 31, "expected 'Avg bus"),
    (lambda: _footer("Avg bus bandwidth: \u0664\u0660GB/s"), 31, "expected 'Avg bus"),
    (lambda: _footer("Avg bus bandwidth: 1e999GB/s"), 31, "expected 'Avg bus"),
    (lambda: _tab([(8, 300), (32, 301), (128, 302)]).replace(
        "           8               8", "           \u00b2               8"), 3, "size(B) and count(elems) must be"),
    (lambda: "# nccom-test -r " + "9" * 5000 + " allr\n" + _tab([(8, 300), (32, 310), (128, 330)], ""), 1,
     "ranks must be an integer from 1 to"),
    (lambda: _tab([(8, 300), (32, 310), (128, 330)]).replace("128             128", "9" * 5000 + " 128"), 5,
     "size(B) and count(elems) must be"),
    (lambda: _tab([(8, 300), (32, 300), (128, 300), (512, 300)]), 6, "time does not grow with the size"),
    (lambda: _tab([(8, 300), (32, 300)]).replace("-r 64", "-r \u0666\u0664"), 1, "ranks must be an integer"),
    (lambda: _tab([(8, 300), (32, 310), (128, 150), (512, 600)]), 5, "time falls as the size grows"),
    (lambda: _tab([(8, 300), (2**20, 400), (2**21, 30000), (2**22, 90000)]), 6, "bandwidth falls as the size grows"),
    (lambda: _tab([(8, 300), (32, 310), (32, 320), (128, 330)]), 5, "size(B) 32 does not grow down the table"),
    (lambda: _tab([(8, 300), (32, 310), (128, 330)]).replace(" 310 ", " 3_10 "), 4, "time(us) must be"),
])
def test_tables_no_link_could_produce_are_refused_with_file_line_rule(text, line, rule):
    assert _bad(text()).startswith(f"bad.txt:{line}: {rule}")


def test_the_run_shape_from_flags_for_raw_nccom_test_output():
    raw = table("all_gather", 256, 4, 100e-6, 1e-10, header=None)  # nccom-test prints no command line
    assert _bad(raw).startswith("bad.txt:1: rank count or operation not given: pass --op, --ranks and --nodes")
    run = N.parse(raw, "out.txt", {"op": "allg", "ranks": "256", "nodes": "4"})
    assert (run.op, run.ranks, run.nodes) == ("all_gather", 256, 4)
    with_cmd = table("all_gather", 256, 4, 100e-6, 1e-10)
    assert N.parse(with_cmd, "out.txt", {"ranks": "256"}).ranks == 256  # agreeing with the file is fine
    with pytest.raises(N.MeasurementError, match=r"^out.txt:1: the file gives ranks '256', --ranks '128'"):
        N.parse(with_cmd, "out.txt", {"ranks": "128"})
    with pytest.raises(N.MeasurementError, match=r"^out.txt:1: the file gives op 'allg', --op 'allr'"):
        N.parse(with_cmd, "out.txt", {"op": "allr"})


def test_large_messages_whose_time_does_not_grow_are_refused():
    # grows at small sizes (passes the table's rules) but is flat from 16 MiB up: an unbounded bandwidth
    text = _tab([(8, 300), (2**20, 400), (2**24, 5000), (2**26, 5050), (2**28, 4990), (2**30, 4950)])
    run = N.parse(text, "flat.txt")
    with pytest.raises(N.MeasurementError, match=r"^flat.txt:8: the time of the messages from 16777216 B up"):
        N.fit_run(run, 2**24)
