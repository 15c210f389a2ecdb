"""Published step times the cost model is calibrated on, and the fit of its free parameters.

Two sets of rows, each scoring one target family:
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
  (2022), Table 5: GPT models on A100 80GB (targets/machines/a100.toml), sequence 2048,
  DP=1, each with full recomputation (TP without sequence parallelism) and with sequence
  parallelism + selective recomputation.
- targets/measured/trn1-published.csv: six published trn1.32xlarge runs of NxD and
  NeuronX NeMo Megatron (sources in the file's header), 32 nodes each.
- targets/measured/h100-published.csv: published H100 runs with full layouts (torchtitan's
  benchmark pages, Meta's Llama 3 Table 4), never fitted: they score the GPU efficiency
  carried from Table 5 as held-out predictions.

Held-out discipline: a fit's error on its own rows flatters it. ``held_out`` scores every
row with the parameters fitted on the other rows (leave-one-out cross-validation, Stone
1974), and the step-time band rests on those errors, stored with the rows they came from
in targets/measured/held-out.json (written by ``benchmarks/accuracy.py --write``; a test
recomputes them).

The free parameters are the framework's constants of ``Efficiency`` (of the chip's achievable
GEMM rate, the share the step's GEMMs reach; the share of VectorE/ScalarE rates the rest
reaches; a fixed cost per micro-batch) and, for trn1, the achievable share of its NeuronLink torus (no nccom-test
measurement of trn1's links is published with its instance type stated). ``fit`` picks them
on grids by the least mean absolute error of the rows; everything else (engine clocks, tile
rules, datasheet link rates) is a documented figure.
The chip's achievable GEMM rate (``Efficiency.chip_matmul``: of TensorE's instruction rate, the
share one large GEMM reaches on the chip) is not fitted: each target states its own with its
source, so a fit on trn1 rows is the framework's share of trn1's achievable rate. Trn2 and Trn3
carry trn1's framework constants (``FRAMEWORK_FIELDS``; no Trn2/Trn3 run with a stated layout
and throughput is published) with their own chip_matmul, H100 carries A100's, and ``band``
says how far the rows' held-out errors leave the answer.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from trnopt.optimizer.cost.evaluate import Evaluation
from trnopt.optimizer.cost.problem import Problem
from trnopt.optimizer.cost.steptime import model_flops
from trnopt.optimizer.model.layout import Layout, default_placement
from trnopt.optimizer.model.target import Efficiency, Target
from trnopt.optimizer.model.workload import Training, Workload, load_model, parse_model

# model, GPUs, TP, PP, global batch, micro-batch, full recompute (s), seq-par + selective (s)
TABLE5 = (
    ("megatron-22b", 8, 8, 1, 4, 4, 1.42, 1.10),
    ("megatron-175b", 64, 8, 8, 64, 1, 18.13, 13.75),
    ("megatron-530b", 280, 8, 35, 280, 1, 49.05, 37.83),
    ("megatron-1t", 512, 8, 64, 512, 1, 94.42, 71.49),
)
TRN1_FILE = "measured/trn1-published.csv"
H100_FILE = "measured/h100-published.csv"
MOE_FILE = "measured/moe-published.csv"
HELD_OUT_FILE = "measured/held-out.json"
H100_PEAK_TFLOPS = 989  # the h100 target's part (H100 SXM, 700 W): dense BF16, NVIDIA H100 datasheet
MATMUL_GRID = tuple(x / 100 for x in range(20, 101, 2))
ELEMENTWISE_GRID = (0.25, 0.5, 0.75, 1.0)
OVERHEAD_US_GRID = (0, 1000, 2500, 5000, 10000, 20000, 40000)
LINK_SHARE_GRID = tuple(x / 20 for x in range(2, 21))
FIXED_SHARE_GRID = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Row:
    label: str
    published_s: float
    evaluation: Evaluation

    @property
    def error(self) -> float:
        """Model / published - 1: positive when the model is slower than the run."""
        return self.evaluation.step.total / self.published_s - 1


@dataclass(frozen=True)
class Case:
    """One published run: what ran, and its step time."""

    label: str
    workload: Workload
    layout_of: object  # Target -> Layout
    published_s: float
    hbm: tuple[float, float] | None = None
    """(bytes, bytes/s) of the HBM the run's accelerator had, when it differs from the target's part."""
    published_gib: float | None = None
    """Peak memory per accelerator the source publishes (GiB), or None."""
    clock_share: float = 1.0
    """The run's dense BF16 peak over the target part's (a power-limited part runs its engines at a
    lower clock): every engine clock of the target is scaled by it."""
    attention: float | None = None
    """``Efficiency.attention`` of the run's flash-attention kernel where its source names it, or None."""
    framework: str = ""
    """The software stack that ran it as the source names it (e.g. "torchtitan torch.compile")."""

    def row(self, target: Target) -> Row:
        if self.hbm is not None:
            target = dataclasses.replace(target, chip=dataclasses.replace(
                target.chip, hbm_bytes=self.hbm[0], hbm_bandwidth=self.hbm[1]))
        if self.attention is not None:
            target = dataclasses.replace(target, efficiency=dataclasses.replace(target.efficiency,
                                                                                attention=self.attention))
        if self.clock_share != 1.0:
            e, k = target.engines, self.clock_share
            target = dataclasses.replace(target, engines=dataclasses.replace(
                e, tensor_hz=e.tensor_hz * k, vector_hz=e.vector_hz * k, scalar_hz=e.scalar_hz * k))
        layout = self.layout_of(target)
        # the published runs hid no TP communication: no overlap table
        problem = Problem(self.workload, target, layout.domains, overlap={})
        return Row(self.label, self.published_s, problem.evaluate(layout))


def table5_cases() -> list[Case]:
    out = []
    for name, gpus, tp, pp, batch, micro, full, selective in TABLE5:
        for recompute, published in (("full", full), ("selective", selective)):
            # Megatron-LM's attention of 2022 stores the scores (their activations' 5as/h term); the
            # full-recompute baseline is TP without sequence parallelism, the other row has it
            # (the paper's "sequence parallelism + selective recomputation")
            workload = Workload(load_model(name), Training(seq=2048, global_batch=batch, flash_attention=False,
                                                           sequence_parallel=recompute == "selective"))
            def layout_of(target, gpus=gpus, tp=tp, pp=pp, micro=micro, recompute=recompute):
                axes = target.axes(1, gpus // target.chips_per_domain)
                return Layout(tp=tp, pp=pp, dp=1, axes=axes, placement=default_placement(axes, {"tp": tp, "pp": pp}),
                              zero=0, recompute=recompute, micro_batch=micro, lnc=1)
            out.append(Case(f"{name} {recompute}", workload, layout_of, published))
    return out


def trn1_cases() -> list[Case]:
    """The rows of targets/measured/trn1-published.csv, in Megatron's rank order (tp, dp, pp)."""
    out = []
    for r in _csv_rows(TRN1_FILE):
        model = parse_model({"name": r["model"], "layers": int(r["layers"]), "hidden": int(r["hidden"]),
                             "heads": int(r["heads"]), "kv_heads": int(r["kv_heads"]), "ffn": int(r["ffn"]),
                             "vocab": int(r["vocab"]), "gated_mlp": r["gated_mlp"] == "true"}, TRN1_FILE)
        training = Training(seq=int(r["seq"]), global_batch=int(r["global_batch"]))
        training = training.with_precision("bf16-sr" if r["precision"] == "bf16-sr" else "bf16")
        recompute = "selective" if r["recompute"] == "tutorial" else r["recompute"]
        tp, pp, dp, nodes = int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["nodes"])

        def layout_of(target, tp=tp, pp=pp, dp=dp, nodes=nodes, zero=int(r["zero"]), recompute=recompute,
                      micro=int(r["micro_batch"])):
            axes = target.axes(1, nodes // target.instances_per_domain)
            return Layout(tp=tp, pp=pp, dp=dp, axes=axes, lnc=1, zero=zero, recompute=recompute,
                          micro_batch=micro, placement=default_placement(axes, {"tp": tp, "dp": dp, "pp": pp}))
        out.append(Case(f"{r['model']} tp{tp} pp{pp} dp{dp} {r['framework']} {r['sdk']}", Workload(model, training),
                        layout_of, int(r["global_batch"]) / float(r["seq_per_s"])))
    return out


def _csv_rows(name: str) -> list[dict[str, str]]:
    """The rows of a packaged CSV whose header lines start with '#'."""
    text = resources.files("trnopt.targets").joinpath(name).read_text("utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#")))


def h100_cases() -> list[Case]:
    """The rows of targets/measured/h100-published.csv, in Megatron's rank order (tp, cp, dp, pp).

    Each row is scored on the h100 target with the HBM (capacity, bandwidth) of the GPU it ran on
    (the file's hbm_gb, hbm_tbs) and, where the file gives one, its part's dense BF16 peak (peak_tflops:
    engine clocks scaled by peak / 989) and its attention kernel's share of the peak (attention_share). A row's published step is ``global_batch * seq / (tokens/s per GPU * GPUs)``, or for a
    TFLOPs-per-GPU row ``model_flops / (TFLOPs * 1e12 * GPUs)`` with trnopt's FLOP count
    (``steptime.model_flops``), as the file's header says.
    """
    out = []
    for r in _csv_rows(H100_FILE):
        gpus, tp, pp, cp, dp = (int(r[k]) for k in ("gpus", "tp", "pp", "cp", "dp"))
        workload = Workload(load_model(r["model"]), Training(seq=int(r["seq"]), global_batch=int(r["global_batch"])))
        value = float(r["value"])
        if r["metric"] == "tokens_per_s_per_gpu":
            published = workload.training.tokens / (value * gpus)
        else:
            published = model_flops(workload) / (value * 1e12 * gpus)

        def layout_of(target, gpus=gpus, tp=tp, pp=pp, cp=cp, dp=dp, zero=int(r["zero"]), recompute=r["recompute"],
                      micro=int(r["micro_batch"]), interleave=int(r["interleave"])):
            axes = target.axes(1, gpus // target.chips_per_domain)
            return Layout(tp=tp, pp=pp, dp=dp, cp=cp, axes=axes, lnc=1, zero=zero, recompute=recompute,
                          micro_batch=micro, interleave=interleave,
                          placement=default_placement(axes, {"tp": tp, "cp": cp, "dp": dp, "pp": pp}))
        label = f"{r['model']} {gpus} GPUs tp{tp} pp{pp} cp{cp} dp{dp} {r['framework']} {r['date']}"
        out.append(Case(label, workload, layout_of, published, hbm=(float(r["hbm_gb"]) * 1e9, float(r["hbm_tbs"]) * 1e12),
                        published_gib=float(r["memory_gib"]) if r["memory_gib"] else None,
                        clock_share=float(r["peak_tflops"]) / H100_PEAK_TFLOPS if r["peak_tflops"] else 1.0,
                        attention=float(r["attention_share"]) if r["attention_share"] else None,
                        framework=r["framework"]))
    return out


def moe_cases() -> list[tuple[str, Case]]:
    """(target name, case) of every row of targets/measured/moe-published.csv: the published layout
    (expert TP empty: = tp; EP carved out of DP, or folded over TP under expert TP 1) in Megatron's
    rank order with its pipeline schedule (empty: the interleave's default) and its GEMM precision
    (``Training.fp8_gemms``), its step
    ``global_batch * seq / (tokens/s per GPU * GPUs)``."""
    out = []
    for r in _csv_rows(MOE_FILE):
        gpus, tp, pp, cp, dp, ep = (int(r[k]) for k in ("gpus", "tp", "pp", "cp", "dp", "ep"))
        etp = int(r["etp"]) if r["etp"] else None
        workload = Workload(load_model(r["model"]), Training(seq=int(r["seq"]), global_batch=int(r["global_batch"]),
                                                             fp8_gemms=r["fp8_gemms"] == "true"))
        published = workload.training.tokens / (float(r["value"]) * gpus)

        def layout_of(target, gpus=gpus, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, zero=int(r["zero"]),
                      recompute=r["recompute"], micro=int(r["micro_batch"]), interleave=int(r["interleave"]),
                      schedule=r["schedule"]):
            axes = target.axes(1, gpus // target.chips_per_domain)
            ep_dp = ep // (tp // (etp or tp))
            return Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, axes=axes, lnc=1, zero=zero,
                          recompute=recompute, micro_batch=micro, interleave=interleave, schedule=schedule,
                          placement=default_placement(axes, {"tp": tp, "cp": cp, "ep": ep_dp, "dp": dp // ep_dp,
                                                             "pp": pp}))
        label = f"{r['model']} {gpus} {r['target']} tp{tp} pp{pp} dp{dp} ep{ep}{'' if etp is None else f' etp{etp}'}"
        out.append((r["target"], Case(f"{label} {r['framework']} {r['date']}", workload, layout_of, published)))
    return out


def rows(target: Target, cases: list[Case]) -> list[Row]:
    return [c.row(target) for c in cases]


def mean_abs_error(target: Target, cases: list[Case]) -> float:
    scored = rows(target, cases)
    return sum(abs(r.error) for r in scored) / len(scored)


@dataclass(frozen=True)
class Fit:
    """The free parameters of one target family and how well they fit."""

    mean_abs_error: float
    efficiency: Efficiency
    link_share: float  # achievable share of the scale-up links (every domain axis)

    def apply(self, target: Target) -> Target:
        axes = tuple(dataclasses.replace(a, achievable=self.link_share) for a in target.domain_axes)
        return dataclasses.replace(target, efficiency=self.efficiency, domain_axes=axes)

    def applied(self, target: Target, free: tuple[str, ...]) -> Target:
        """``target`` with the fitted values of the ``free`` parameters (the link share only when fitted)."""
        return self.apply(target) if "link_share" in free else dataclasses.replace(target, efficiency=self.efficiency)


FRAMEWORK_FIELDS = ("matmul", "elementwise", "microbatch_overhead_s", "collective_fixed_share")
"""The fitted ``Efficiency`` fields, the framework's: a target with no published runs of its own
carries them from its family's fit; ``chip_matmul`` is each chip's own."""


def framework_constants(efficiency: Efficiency) -> dict[str, float]:
    """The fitted (framework) constants of ``efficiency`` by name."""
    return {name: getattr(efficiency, name) for name in FRAMEWORK_FIELDS}


def held_out(target: Target, cases: list[Case], free: tuple[str, ...]) -> list[Row]:
    """Every case scored by the parameters ``fit`` finds on the other cases (leave-one-out
    cross-validation, Stone 1974): its error is a prediction's, not the fit's."""
    out = []
    for i, case in enumerate(cases):
        others = cases[:i] + cases[i + 1:]
        out.append(case.row(fit(target, others, free).applied(target, free)))
    return out


GRIDS = {"matmul": MATMUL_GRID, "elementwise": ELEMENTWISE_GRID, "overhead_us": OVERHEAD_US_GRID,
         "fixed_share": FIXED_SHARE_GRID, "link_share": LINK_SHARE_GRID}


NEURON_FREE = ("matmul", "elementwise", "overhead_us", "fixed_share", "link_share")
GPU_FREE = ("matmul", "elementwise", "overhead_us")  # NCCL rings: no Neuron runtime constants


def fit(target: Target, cases: list[Case], free: tuple[str, ...] = NEURON_FREE) -> Fit:
    """The grid point with the least mean absolute error on ``cases``, by coordinate descent over
    the ``free`` parameters: from the middle of every grid, each parameter in turn takes its best
    grid value given the others, until a whole round changes none (deterministic, and a few
    hundred evaluations instead of the grid's product). Parameters not free keep the target's."""
    e0 = target.efficiency
    fixed = {"matmul": e0.matmul, "elementwise": e0.elementwise, "overhead_us": e0.microbatch_overhead_s * 1e6,
             "fixed_share": e0.collective_fixed_share, "link_share": target.domain_axes[0].achievable}
    point = {**fixed, **{n: GRIDS[n][len(GRIDS[n]) // 2] for n in free}}

    def candidate(p: dict) -> Fit:
        eff = dataclasses.replace(e0, matmul=p["matmul"], elementwise=p["elementwise"],
                                  microbatch_overhead_s=p["overhead_us"] * 1e-6,
                                  collective_fixed_share=p["fixed_share"])
        applied = Fit(0.0, eff, p["link_share"]).applied(target, free)
        return Fit(mean_abs_error(applied, cases), eff, p["link_share"])

    best = candidate(point)
    for _ in range(20):
        changed = False
        for n in free:
            for v in GRIDS[n]:
                trial = candidate({**point, n: v})
                if trial.mean_abs_error < best.mean_abs_error - 1e-12:
                    best, point, changed = trial, {**point, n: v}, True
        if not changed:
            break
    return best


def band(errors: list[float]) -> tuple[float, float]:
    """(low, high) factors on a modelled step time from the calibration rows' errors: the run
    can be as much faster as the model's worst over-estimate and as much slower as its worst
    under-estimate (errors are model / published - 1)."""
    return 1 / (1 + max(0.0, max(errors))), 1 / (1 + min(0.0, min(errors)))


FAMILIES = {"trn1-published": (trn1_cases, "trn1", NEURON_FREE), "table5": (table5_cases, "a100", GPU_FREE)}


def held_out_table() -> dict:
    """The stored leave-one-out errors per calibration family (targets/measured/held-out.json)."""
    return json.loads(resources.files("trnopt.targets").joinpath(HELD_OUT_FILE).read_text("utf-8"))


def held_out_errors(family: str) -> dict[str, float]:
    """Row label -> held-out error of one calibration family, as stored."""
    return {r["label"]: r["held_out_error"] for r in held_out_table()[family]["rows"]}


PREDICTED = {"h100": h100_cases}
"""Targets with published runs of their own, none fitted: each row's error is a prediction of the
constants the target carries, stored in held-out.json under the target's name."""


def step_band(target: Target) -> tuple[float, float, str] | None:
    """(low, high, source) factors on a modelled step of ``target`` from held-out errors (``band``):
    those of the target's own published runs when it has some (``PREDICTED``, never fitted), else
    those of the rows its efficiency was fitted on; None when it names no calibration set."""
    if target.name in PREDICTED and target.name in held_out_table():
        errors = list(held_out_errors(target.name).values())
        low, high = band(errors)
        return low, high, (f"errors of the {len(errors)} published {target.name} runs {min(errors):+.0%} .. "
                           f"{max(errors):+.0%}, none fitted (each a prediction of the constants "
                           f"{target.efficiency.fitted_on})")
    family = next((name for name in FAMILIES if target.efficiency.fitted_on.startswith(name)), None)
    if family is None:
        return None
    return _band_of(family, "carried" in target.efficiency.fitted_on)


def held_out_mean(target: Target) -> tuple[float, str] | None:
    """(mean |held-out error|, what it is) of the calibration rows ``target``'s efficiency was
    fitted on (or carried from), or of its own published runs (``PREDICTED``), as stored; None when
    it names no calibration set. Two modelled step times closer than this are not told apart by the
    published runs."""
    own = target.name in PREDICTED and target.name in held_out_table()
    family = target.name if own else next((name for name in FAMILIES
                                           if target.efficiency.fitted_on.startswith(name)), None)
    if family is None:
        return None
    errors = list(held_out_errors(family).values())
    mean = sum(abs(x) for x in errors) / len(errors)
    how = "none fitted" if own else "each predicted by the fit of the others"
    return mean, f"mean |held-out error| {mean:.1%} of the {len(errors)} {family} rows, {how}"


@lru_cache(maxsize=8)
def _band_of(family: str, carried: bool) -> tuple[float, float, str]:
    errors = list(held_out_errors(family).values())
    low, high = band(errors)
    base = FAMILIES[family][1]
    how = f"constants carried over from {base}" if carried else f"fitted on {base}"
    return low, high, (f"held-out errors of the {len(errors)} calibration rows {min(errors):+.0%} .. "
                       f"{max(errors):+.0%} (each row predicted by the fit of the others); {how}")
