"""Target machines: a chip, the physical axes of one scale-up domain, and the network between domains.

A target file (TOML, see targets/*.toml) describes one scale-up domain as a list of
physical axes, fastest first, plus the scale-out network that joins many domains. The
loader validates every key and reports a broken rule as ``InputError(file, key, rule)``.
Units inside trnopt are SI: bytes, seconds, bytes per second, FLOP/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model import bounds as B
from trnopt.optimizer.model.tomlcheck import Table, read_named

GB = 1e9
GIB = 2**30
DOMAIN_AXIS_KINDS = ("torus", "ring", "switch")
COLLECTIVE_RUNTIMES = ("ring", "neuron")
BUILTIN_TARGETS = ("trn1", "trn2", "trn2u", "trn3-gen1", "trn3-gen2", "a100", "h100", "h800")


@dataclass(frozen=True)
class Axis:
    """One physical axis a parallel dimension can occupy a factor of.

    ``kind`` is ``core`` (logical cores in a chip), ``torus``/``ring`` (NeuronLink or
    NVLink rings; a torus axis of size n is a closed ring of n chips), ``switch`` (every
    chip one hop from every other) or ``scale_out`` (EFA / InfiniBand between domains).
    ``bandwidth`` is bytes/s per chip over all of the chip's links on this axis.
    """

    name: str
    size: int
    kind: str
    bandwidth: float
    latency: float
    achievable: float = 1.0
    """Share of ``bandwidth`` that collectives reach on this link class, in (0, 1]: 1.0 is the
    datasheet figure; measured values come from nccom-test runs (``trnopt calibrate``). The cost
    model multiplies ``bandwidth`` by it."""
    collectives: str = "ring"
    """Whose algorithms run collectives on this axis: ``ring`` (the bandwidth-optimal ring at
    every size, Patarasuk & Yuan 2009) or ``neuron`` (the Neuron runtime's choice by size and
    group shape, cost/collectives.py). The ``collectives`` key of each [[axes]] table and of
    [scale_out] (all the same; default ``ring``)."""
    closed: bool = True
    """False when a ``torus``/``ring`` axis has lost positions (a failed instance, trnopt solve
    --exclude): what is left is a line, whose embedded ring uses each link one way only, so
    every group on it, even one spanning the whole axis, gets half the bandwidth."""

    @property
    def level(self) -> str:
        """chip, domain or scale_out: the three levels a hierarchical collective steps through."""
        return {"core": "chip", "scale_out": "scale_out"}.get(self.kind, "domain")


@dataclass(frozen=True)
class Chip:
    name: str
    physical_cores: int
    lnc_default: int
    lnc_allowed: tuple[int, ...]
    hbm_bytes: float
    hbm_bandwidth: float
    bf16_flops: float
    fp8_flops: float
    sbuf_bytes_per_partition: int
    on_chip_bandwidth: float

    def logical_cores(self, lnc: int) -> int:
        """Ranks per chip: physical cores / LNC (Neuron LNC docs: LNC=2 on Trn2 gives 4 per chip)."""
        return self.physical_cores // lnc


@dataclass(frozen=True)
class Engines:
    """The chip's compute engines per physical core, as the NKI architecture guides give them.

    TensorE is a ``pe_rows`` x ``stationary_fmax`` array of processing elements that streams
    a moving tile of up to ``moving_fmax`` columns per instruction, one column per cycle;
    an instruction issues every max(min(``matmul_min_cycles``, stationary columns), moving
    columns) cycles. VectorE and ScalarE process ``*_lanes`` elements per cycle.
    """

    tensor_hz: float
    pe_rows: int
    stationary_fmax: int
    moving_fmax: int
    matmul_min_cycles: int
    vector_hz: float
    vector_lanes: int
    scalar_hz: float
    scalar_lanes: int


@dataclass(frozen=True)
class Efficiency:
    """What the engines achieve over a whole training step, fitted on published step times
    (calibration.py; the target file says on which rows)."""

    matmul: float
    """The framework's share: of the chip's achievable GEMM rate (``chip_matmul``), the share a
    training step's GEMMs reach (scheduling, dependencies, launches): fitted on published runs."""
    elementwise: float
    """Share of VectorE/ScalarE rates the non-matmul work reaches."""
    microbatch_overhead_s: float
    """Fixed seconds per micro-batch and pipeline stage (launches, synchronisation)."""
    collective_fixed_share: float = 1.0
    """Share of the Neuron runtime's per-collective fixed costs (launch, ring setup: fitted on
    standalone nccom-test runs) that a collective inside a compiled training step pays."""
    fitted_on: str = ""
    """The calibration rows the values were fitted on, or what they were carried over from."""
    chip_matmul: float = 1.0
    """The chip's share: of TensorE's instruction rate (the tile rules at the engine clock), the
    share one large BF16 GEMM streamed from HBM reaches on one core, a property of the chip
    (its DMA rate against its TensorE rate), not fitted: stated per generation with its source."""
    chip_matmul_source: str = "not stated (1.0: the engines' instruction rate)"
    """Where ``chip_matmul`` comes from."""
    attention: float | None = None
    """Share of TensorE's instruction rate a flash-attention kernel's matmuls reach, when the run's
    kernel is known to reach less than its GEMMs (a published run's kernel); None: ``gemm_share``."""
    chip_matmul_fp8: float | None = None
    """Of the chip's dense FP8 peak, the share its best FP8 GEMMs reach (measured, with its source in
    the target file); None: no FP8 rate stated, FP8 GEMMs run at the BF16 rate."""
    overlap_compute: float = 1.0
    """Share of the compute rate left while communication kernels run beside compute (a GPU's SMs
    not taken by them under DualPipe's overlap); 1.0 where collectives run on their own engines."""

    @property
    def gemm_share(self) -> float:
        """Share of TensorE's instruction rate a step's GEMMs reach: chip_matmul * matmul."""
        return self.chip_matmul * self.matmul


@dataclass(frozen=True)
class Reliability:
    instance_mtbf_s: float
    checkpoint_bandwidth_per_instance: float
    restart_s: float


@dataclass(frozen=True)
class Remaining:
    """Where the domains and instances of a partial machine (model/partial.py) sit on the whole one."""

    excluded: tuple[str, ...]
    """The excluded instances and chips as the user named them (``d2i3``, ``d0i1c5``), sorted."""
    whole_domains: int
    """Domains of the whole machine (--ultraservers / --instances)."""
    whole_instances: int
    """Instances per domain of the whole machine."""
    domains: tuple[int, ...]
    """Per domain of the partial machine, the whole machine's domain it is."""
    instances: tuple[tuple[int, ...], ...]
    """Per domain of the partial machine, per instance of it (its position on the domain's
    instance axis), the position of that instance in the whole domain."""


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    source: str
    instance: str
    chips_per_instance: int
    chip: Chip
    domain_axes: tuple[Axis, ...]
    scale_out: Axis
    reliability: Reliability
    engines: Engines
    efficiency: Efficiency
    runtime_reserve_bytes: float
    domain_instances: tuple[int, ...] = ()
    """Instance counts the runtime can join into one scale-up domain (key ``domain_instances``;
    empty: any count). A partial machine (model/partial.py) keeps domains of these sizes only."""
    remaining: Remaining | None = None
    """None for a whole machine; for a partial one (a failed instance or chip excluded), where
    its domains and instances are on the whole machine: the rank map and the launch files name
    the whole machine's instances."""

    @property
    def chips_per_domain(self) -> int:
        return math.prod(a.size for a in self.domain_axes)

    @property
    def instances_per_domain(self) -> int:
        return self.chips_per_domain // self.chips_per_instance

    @property
    def topology(self) -> str:
        return " x ".join(f"{a.name}{a.size}({a.kind})" for a in self.domain_axes)

    def axes(self, lnc: int, domains: int) -> tuple[Axis, ...]:
        """Every physical axis of ``domains`` domains at LNC ``lnc``, fastest first.

        The core axis (ranks on one chip) comes first and the scale-out axis last; the
        rank count is the product of their sizes.
        """
        if lnc not in self.chip.lnc_allowed:
            raise InputError("--lnc", "lnc", f"LNC={lnc} is not allowed on {self.name} "
                             f"(allowed: {', '.join(map(str, self.chip.lnc_allowed))})")
        cores = Axis("core", self.chip.logical_cores(lnc), "core", self.chip.on_chip_bandwidth, 0.0,
                     collectives=self.scale_out.collectives)
        out = Axis(self.scale_out.name, domains, "scale_out", self.scale_out.bandwidth, self.scale_out.latency,
                   self.scale_out.achievable, self.scale_out.collectives)
        return (cores, *self.domain_axes, out)

    def ranks(self, lnc: int, domains: int) -> int:
        return self.chip.logical_cores(lnc) * self.chips_per_domain * domains


def check_domains(target: Target, domains: int, source: str, key: str) -> None:
    """A job of ``domains`` domains: at least one, and at most bounds.MAX_CHIPS chips in all."""
    if isinstance(domains, bool) or not isinstance(domains, int) or domains < 1:
        raise InputError(source, key, f"must be an integer >= 1, got {domains!r}")
    if domains > B.MAX_CHIPS // target.chips_per_domain:
        raise InputError(source, key, f"{domains:,} {target.name} domains are {domains * target.chips_per_domain:,} "
                         f"chips; trnopt plans at most {B.MAX_CHIPS:,} chips "
                         f"({B.MAX_CHIPS // target.chips_per_domain:,} domains)")


def load_target(name_or_path: str) -> Target:
    """Load a built-in target by name (``trn2u``) or a user's TOML file by path."""
    return parse_target(*read_named(name_or_path, BUILTIN_TARGETS, "machines", "--target", "target",
                                    "built-in targets are"))


def parse_target(data: dict, source: str) -> Target:
    """Validate a parsed target file; every broken rule names the file and the key.

    Units in the file: GiB for memory, GB/s for bandwidths (GB = 1e9 B), Gbps per instance
    for the scale-out network, TFLOPS, microseconds, hours, minutes. Unknown keys are errors.
    Every figure is held to its physical range (bounds.py), and the runtime reserve to
    less than the HBM.
    """
    root = Table(data, source)
    chip = _chip(root.table("chip"))
    axes = _domain_axes(root)
    chips_per_domain = math.prod(a.size for a in axes)
    per_instance = _chips_per_instance(root, data, axes, chip.physical_cores)
    scale_out = _scale_out(root.table("scale_out"), axes, per_instance)
    joined = root.int_list("domain_instances") if root.has("domain_instances") else ()
    per_domain = chips_per_domain // per_instance
    if joined and (per_domain not in joined or max(joined) > per_domain):
        raise root.fail("domain_instances", f"must list instance counts up to and including the {per_domain} "
                        f"instances of a domain, got {list(joined)}")
    rel = root.table("reliability")
    eff = root.table("efficiency")
    eng = root.table("engines")
    target = Target(
        name=root.str("name", nonempty=True),
        description=root.str("description"),
        source=source,
        instance=root.str("instance"),
        chips_per_instance=per_instance,
        chip=chip,
        domain_axes=tuple(axes),
        scale_out=scale_out,
        reliability=Reliability(_scaled(rel, "instance_mtbf_hours", 3600, B.MTBF_HOURS),
                                _scaled(rel, "checkpoint_gbs_per_instance", GB, B.CHECKPOINT_GBS),
                                _scaled(rel, "restart_minutes", 60, B.RESTART_MINUTES, positive=False)),
        engines=Engines(_scaled(eng, "tensor_ghz", 1e9, B.ENGINE_GHZ), _lanes(eng, "pe_rows"),
                        _lanes(eng, "stationary_fmax"), _lanes(eng, "moving_fmax"), _lanes(eng, "matmul_min_cycles"),
                        _scaled(eng, "vector_ghz", 1e9, B.ENGINE_GHZ), _lanes(eng, "vector_lanes"),
                        _scaled(eng, "scalar_ghz", 1e9, B.ENGINE_GHZ), _lanes(eng, "scalar_lanes")),
        efficiency=Efficiency(matmul=_share(eff, "matmul"), elementwise=_share(eff, "elementwise"),
                              microbatch_overhead_s=_scaled(eff, "microbatch_overhead_us", 1e-6,
                                                            B.MICROBATCH_OVERHEAD_US, positive=False),
                              collective_fixed_share=_share(eff, "collective_fixed_share"),
                              fitted_on=eff.str("fitted_on", nonempty=True),
                              **({"overlap_compute": _share(eff, "overlap_compute")}
                                 if eff.has("overlap_compute") else {}),
                              **({"chip_matmul_fp8": _share(eff, "chip_matmul_fp8")}
                                 if eff.has("chip_matmul_fp8") else {}),
                              **({"chip_matmul": _share(eff, "chip_matmul"),
                                  "chip_matmul_source": eff.str("chip_matmul_source", nonempty=True)}
                                 if eff.has("chip_matmul") else {})),
        runtime_reserve_bytes=_scaled(root, "runtime_reserve_gib", GIB, B.HBM_GIB, positive=False),
        domain_instances=tuple(sorted(set(joined), reverse=True)),
    )
    if target.runtime_reserve_bytes >= chip.hbm_bytes:
        raise root.fail("runtime_reserve_gib", f"{target.runtime_reserve_bytes / GIB:g} GiB leaves nothing of "
                        f"the {chip.hbm_bytes / GIB:g} GiB HBM (chip.hbm_gib)")
    if root.has("calibration") and not isinstance(data["calibration"], dict):
        # what `trnopt calibrate` measured and fitted: a record for the reader, not read by the model
        raise root.fail("calibration", "must be a table")
    root.check_unknown()
    return target


def _chip(chip_t: Table) -> Chip:
    """[chip]: the cores, the LNCs they allow, HBM, peak rates and SBUF."""
    cores = chip_t.int("physical_cores", maximum=B.MAX_PHYSICAL_CORES)
    lnc_allowed = chip_t.int_list("lnc_allowed")
    for lnc in lnc_allowed:
        if cores % lnc:
            raise chip_t.fail("lnc_allowed", f"LNC={lnc} does not divide physical_cores={cores}")
    lnc_default = chip_t.int("lnc_default")
    if lnc_default not in lnc_allowed:
        raise chip_t.fail("lnc_default", f"{lnc_default} is not in lnc_allowed {list(lnc_allowed)}")
    return Chip(
        name=chip_t.str("name", nonempty=True),
        physical_cores=cores,
        lnc_default=lnc_default,
        lnc_allowed=lnc_allowed,
        hbm_bytes=_scaled(chip_t, "hbm_gib", GIB, B.HBM_GIB),
        hbm_bandwidth=_scaled(chip_t, "hbm_bandwidth_gbs", GB, B.HBM_BANDWIDTH_GBS),
        bf16_flops=_scaled(chip_t, "bf16_tflops", 1e12, B.TFLOPS),
        fp8_flops=_scaled(chip_t, "fp8_tflops", 1e12, B.TFLOPS),
        sbuf_bytes_per_partition=chip_t.int("sbuf_kib_per_partition", maximum=B.MAX_SBUF_KIB) * 1024,
        on_chip_bandwidth=_scaled(chip_t, "on_chip_bandwidth_gbs", GB, B.ON_CHIP_GBS),
    )


def _domain_axes(root: Table) -> tuple[Axis, ...]:
    """[[axes]]: the scale-up domain's axes, uniquely named, at most 16."""
    tables = root.tables("axes")
    if len(tables) > 16:
        raise root.fail("axes", f"{len(tables)} axes; a scale-up domain has at most 16")
    axes = tuple(Axis(t.str("name", nonempty=True), t.int("size", maximum=B.MAX_AXIS_SIZE),
                      t.choice("kind", DOMAIN_AXIS_KINDS), _scaled(t, "bandwidth_gbs", GB, B.LINK_GBS),
                      _scaled(t, "latency_us", 1e-6, B.LATENCY_US, positive=False), _achievable(t),
                      t.choice("collectives", COLLECTIVE_RUNTIMES, default="ring")) for t in tables)
    names = [a.name for a in axes]
    if len(set(names)) != len(names) or {"core"} & set(names):
        raise root.fail("axes", f"axis names must be unique and not 'core', got {names}")
    return axes


def _chips_per_instance(root: Table, data: dict, axes: tuple[Axis, ...], cores: int) -> int:
    """chips_per_instance, held against the domain the axes make and the core limits."""
    chips_per_domain = math.prod(a.size for a in axes)
    if chips_per_domain > B.MAX_CHIPS_PER_DOMAIN:
        raise root.fail("axes", f"the axes multiply to {chips_per_domain:,} chips per domain; "
                        f"at most {B.MAX_CHIPS_PER_DOMAIN:,}")
    per_instance = root.int("chips_per_instance", maximum=B.MAX_CHIPS_PER_DOMAIN)
    if cores * chips_per_domain > B.MAX_CORES_PER_DOMAIN:
        raise root.fail("axes", f"{chips_per_domain:,} chips of {cores} cores are {cores * chips_per_domain:,} "
                        f"cores per domain; at most {B.MAX_CORES_PER_DOMAIN:,}")
    if cores * per_instance > B.MAX_CORES_PER_INSTANCE:
        raise root.fail("chips_per_instance", f"{per_instance} chips of {cores} cores are {cores * per_instance:,} "
                        f"cores per instance; at most {B.MAX_CORES_PER_INSTANCE:,}")
    if chips_per_domain % per_instance:
        raise root.fail("chips_per_instance", f"{per_instance} does not divide the {chips_per_domain} chips "
                        f"that the axes multiply to ({' x '.join(str(a.size) for a in axes)})")
    if "chips_per_domain" in data and root.int("chips_per_domain") != chips_per_domain:
        raise root.fail("chips_per_domain", f"{data['chips_per_domain']} but the axes multiply to {chips_per_domain}")
    return per_instance


def _scale_out(net: Table, axes: tuple[Axis, ...], per_instance: int) -> Axis:
    """[scale_out]: the network between domains, per chip, on the axes' collectives runtime."""
    net_name = net.str("name", nonempty=True)
    if net_name in {a.name for a in axes} or net_name == "core":
        raise net.fail("name", f"{net_name!r} is already the name of a domain axis or of the core axis")
    scale_out = Axis(net_name, 1, "scale_out",
                     _scaled(net, "bandwidth_gbps_per_instance", GB / 8, B.SCALE_OUT_GBPS) / per_instance,
                     _scaled(net, "latency_us", 1e-6, B.LATENCY_US, positive=False), _achievable(net),
                     net.choice("collectives", COLLECTIVE_RUNTIMES, default="ring"))
    if len({a.collectives for a in (*axes, scale_out)}) > 1:
        raise net.fail("collectives", "every [[axes]] table and [scale_out] must name the same collectives runtime, got "
                       f"{', '.join(f'{a.name}={a.collectives}' for a in (*axes, scale_out))}")
    return scale_out


def _achievable(table: Table) -> float:
    """``achievable``: the share of a link's bandwidth collectives reach, in (0, 1]; 1.0 (datasheet) when absent."""
    value = table.number("achievable", default=1.0)
    if value > 1:
        raise table.fail("achievable", f"must be in (0, 1], got {value:g}")
    return value


def _scaled(table: Table, name: str, unit: float, bound: B.Bound, positive: bool = True) -> float:
    """``table[name] * unit`` (file units to SI), the file's value inside its physical ``bound``."""
    return table.number(name, positive=positive, bounds=(bound.lowest, bound.highest)) * unit


def _lanes(table: Table, name: str) -> int:
    """A count of elements per cycle or of PE-array rows or columns."""
    return table.int(name, maximum=int(B.ENGINE_LANES.highest))


def _share(table: Table, name: str) -> float:
    """A share of peak: at least 1e-3 (a matrix engine at 0.1% of peak is no fit) and at most 1."""
    value = table.number(name)
    if not 1e-3 <= value <= 1:
        raise table.fail(name, f"must be in [0.001, 1], got {value:g}")
    return value
