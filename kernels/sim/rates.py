"""Documented hardware rates and capacities the simulator uses, each with its source.

Sources (cited by page name):
- Neuron SDK 2.32/2.33 docs, "Trainium2 Architecture Guide for NKI" and "NKI Performance
  Guide":
  TensorE at 2.4 GHz; BF16 matmul cycles ~ max(min(64, N_stationary), N_moving);
  DMA ~368 GB/s per core, ~1.3 us from semaphore to start, ~0.6 us per
  descriptor-generating instruction; SBUF 224 KiB per partition (28 MiB per core) on
  Trn2; PSUM 8 banks x 2 KiB per partition.
- "Trainium3 Architecture Guide for NKI" / "NeuronCore-v4 Architecture": SBUF is 32 MiB
  per NeuronCore-v4 (256 KiB per partition), PSUM unchanged.
- "nki.language.tile_size": pmax 128, gemm_stationary_fmax 128, gemm_moving_fmax 512,
  psum_bank_fmax 512 FP32 elements (2 KiB), psum_num_banks 8.
- "Trainium/Inferentia2 Architecture Guide for NKI" (NeuronCore-v2, trn1): engine clocks and
  data paths, the VectorE cost model (one input N cycles, two 2N), ~60 cycles of tensor
  access overhead, 16 DMA engines, "DMA buffers" (contiguous pieces) per transfer.
- "NKI DMA overview" and "Guideline to Avoid Under-Utilizing DMA Bandwidth": 16 DMA engines
  per NeuronCore at 17 / 23 / 33 B/ns (trn1 / trn2 / trn3), 8 partitions per engine, the
  throughput-by-bytes-per-partition curve the per-chunk cost is fitted on.
- "NKI Direct Allocation Developer Guide" (SDK 2.26): the compiler rotates a loop-body
  tile through several physical tiles; "NKI memory hierarchy overview": the compiler
  spills what overflows on-chip memory.
- "Trainium2 Architecture" (Neuron docs): NeuronLink 1,024 GB/s per chip in the 4x4 torus
  (the sum of both axes, both directions); hop latency ~1-2 us intra-instance (ASSUMPTION:
  the order of magnitude of the Neuron collectives pages, not a published figure).
Figures marked ASSUMPTION are not in those pages; they are stated here so that they can
be replaced in one place.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

KIB = 1024

# --- capacities -------------------------------------------------------------------------
PMAX = 128  # partitions of SBUF and PSUM (nki.language.tile_size.pmax)
GEMM_STATIONARY_FMAX = 128  # tile_size.gemm_stationary_fmax
GEMM_MOVING_FMAX = 512  # tile_size.gemm_moving_fmax
PSUM_NUM_BANKS = 8  # tile_size.psum_num_banks
PSUM_BANK_BYTES = 2 * KIB  # per partition; tile_size.psum_bank_fmax_bytes
PSUM_BANK_FMAX = PSUM_BANK_BYTES // 4  # FP32 elements per bank per partition
SBUF_BYTES_PER_PARTITION = {
    "trn1": 192 * KIB,  # 24 MiB per NeuronCore-v2 / 128 partitions (Trainium/Inferentia2 architecture guide)
    "trn2": 224 * KIB,  # 28 MiB per NeuronCore-v3 / 128 partitions (Trainium2 architecture guide)
    "trn3": 256 * KIB,  # 32 MiB per NeuronCore-v4 / 128 partitions (Trainium3 arch guide)
}
DEFAULT_SBUF_BYTES_PER_PARTITION = SBUF_BYTES_PER_PARTITION["trn2"]

# --- engines ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Generation:
    """Rates of one NeuronCore generation, each with its public source (see the module
    docstring for the pages).

    Engine frequencies and data-path widths: the "Compute Engine Specifications" tables of
    the Trainium/Inferentia2 (NeuronCore-v2), Trainium2 (v3) and Trainium3 (v4)
    architecture guides for NKI. DMA: "NKI DMA overview" / "Guideline to Avoid
    Under-Utilizing DMA Bandwidth": 16 DMA engines per NeuronCore at 17 / 23 / 33 B/ns each
    (272 / 368 / 528 GB/s). SBUF: 24 / 28 / 32 MiB per core over 128 partitions.
    """

    name: str  # "trn1", "trn2" or "trn3"
    core: str  # the NeuronCore version
    tensor_hz: float  # TensorE clock
    vector_hz: float  # VectorE clock
    scalar_hz: float  # ScalarE clock
    gpsimd_hz: float  # GpSimdE clock
    vector_lanes_4b: int  # VectorE elements per cycle per partition, 4-byte data
    vector_lanes_2b: int  # VectorE elements per cycle per partition, 2-byte (and 1-byte) data
    scalar_lanes_2b: int  # ScalarE elements per cycle per partition, 2-byte data (4-byte: 1)
    dma_engine_Bps: float  # bytes per second of one DMA engine
    dma_engines: int  # DMA engines per NeuronCore
    sbuf_bytes_per_partition: int  # SBUF capacity per partition

    @property
    def dma_Bps(self) -> float:
        """Aggregate DMA bandwidth of the core: engines x bytes per second each."""
        return self.dma_engine_Bps * self.dma_engines


GENERATIONS = {
    # Trainium/Inferentia2 architecture guide: Tensor 2.8 GHz, Vector 1.12, Scalar and GpSimd
    # 1.4, "128 input/output" elements per cycle (one per partition); SBUF 24 MiB (192 KiB).
    "trn1": Generation("trn1", "NeuronCore-v2", 2.8e9, 1.12e9, 1.4e9, 1.4e9, 1, 1, 1, 17e9, 16, 192 * KIB),
    # Trainium2 architecture guide: Tensor 2.4 GHz, Vector 0.96 GHz with 512 BF16/FP16 or 256
    # other elements per cycle (4 or 2 per partition), Scalar 1.2 GHz x 128, GpSimd 1.2 GHz;
    # SBUF 28 MiB (224 KiB).
    "trn2": Generation("trn2", "NeuronCore-v3", 2.4e9, 0.96e9, 1.2e9, 1.2e9, 2, 4, 1, 23e9, 16, 224 * KIB),
    # Trainium3 architecture guide: Tensor 2.4 GHz, Vector 1.2 GHz (512 / 256), Scalar 1.2 GHz
    # with 256 BF16/FP16/FP8 or 128 other, GpSimd 1.2 GHz x 128; SBUF 32 MiB (256 KiB).
    "trn3": Generation("trn3", "NeuronCore-v4", 2.4e9, 1.2e9, 1.2e9, 1.2e9, 2, 4, 2, 33e9, 16, 256 * KIB),
}
_ACTIVE = ["trn2"]


def active() -> Generation:
    """The generation the simulator times kernels on (default trn2; ``generation``)."""
    return GENERATIONS[_ACTIVE[0]]


@contextmanager
def generation(name: str):
    """Time the kernels run inside this block on generation ``name`` ("trn1", "trn2",
    "trn3"): engine and DMA rates and the default SBUF capacity. Process-wide (the ranks
    of a run are threads); not for concurrent runs on different generations."""
    if name not in GENERATIONS:
        raise ValueError(f"unknown generation {name!r}; expected one of {sorted(GENERATIONS)}")
    old = _ACTIVE[0]
    _ACTIVE[0] = name
    try:
        yield GENERATIONS[name]
    finally:
        _ACTIVE[0] = old


TENSOR_ENGINE_HZ = GENERATIONS["trn2"].tensor_hz  # Trainium2 architecture guide
MATMUL_MIN_CYCLES = 64  # the min(64, N_stationary) floor of the matmul cycle formula
# ASSUMPTION: FP32 operands take four passes of the BF16 rate; FP8 with
# perf_mode=double_row takes half (the "FP8 double performance mode" of the nc_matmul page).
# (The Trainium2 guide's 79 BF16 vs 20 FP32 dense TFLOPS per core is the same factor 4.)
MATMUL_FP32_FACTOR = 4
# Fixed cost of a Vector/Scalar/GpSimd instruction: "Tensor access overhead ... approximately
# 60 cycles on NeuronCore-v2" (Trainium/Inferentia2 architecture guide, data movement); 64 kept.
ELEMENTWISE_FIXED_CYCLES = 64
# A VectorE instruction that reads the output of the engine's previous instruction cannot hide
# its start behind that one: "with every instruction depending on the output tile of the
# previous instruction, we need to add a static instruction overhead of 100 engine cycles"
# (Trainium/Inferentia2 architecture guide, Vector Engine cost model). Its fixed cost is then
# 100 cycles instead of ELEMENTWISE_FIXED_CYCLES (ASSUMPTION: the same on every generation).
VECTOR_DEPENDENT_FIXED_CYCLES = 100

DMA_BANDWIDTH_BPS = GENERATIONS["trn2"].dma_Bps  # per core, trn2 (16 x 23 B/ns); the active
# generation's is ``active().dma_Bps``. It also bounds the core's HBM traffic in the simulator:
# compute DMAs and the DMA rings of collectives share it (timeline)
DMA_SEMAPHORE_TO_START_S = 1.3e-6  # Trainium2 architecture guide ("~1300 ns cross-engine": DMA bandwidth guide)
DMA_DESCRIPTOR_S = 0.6e-6  # per descriptor-generating instruction (Trainium2 architecture guide)
DMA_QUEUES = 4  # ASSUMPTION: DMA instructions round-robin over four issue queues
# Data phase of a DMA: its contiguous chunks (one per partition row at least, "DMA buffers")
# spread over the 16 engines, 8 partitions per engine ("NKI DMA overview"); each chunk costs
# its engine bytes / engine rate + DMA_CHUNK_S. DMA_CHUNK_S is fitted (least squares, see
# ``fit_dma_chunk_s``) on the saturated points (>= 2 KiB per partition) of the "DMA Throughput
# varying Bytes per Partition for p_dim = 128" figure of the "NKI DMA overview" page, read
# off the plot relative to its 32 KiB point (no y-axis values are printed): 2048 B 0.81,
# 4096 B 0.96, 8192 B 0.98, 16384 B 0.99, 32768 B 1.0.
DMA_CURVE = ((2048, 0.81), (4096, 0.96), (8192, 0.98), (16384, 0.99), (32768, 1.0))
# Physical buffers the compiler rotates a tile declared in a loop body through (context.OnChipSpace).
# ASSUMPTION: the compiler's heuristic is not published; 2 is the double buffering of the
# "NKI Direct Allocation Developer Guide" example and the default of nki.language.alloc_stream_buffers
# (num_slots=2) and nki.compiler.multi_buffer (factor=2).
ROTATION_BUFFERS = 2
PARTITIONS_PER_DMA_ENGINE = 8  # 128 partitions / 16 engines ("NKI DMA overview")
# ASSUMPTION: a core_barrier is a remote semaphore update plus a local wait ("nki.isa.core_barrier");
# taken as one DMA semaphore-to-start latency.
CORE_BARRIER_S = DMA_SEMAPHORE_TO_START_S


def fit_dma_chunk_s(curve=DMA_CURVE, engine_Bps: float = 23e9) -> float:
    """Per-chunk DMA overhead d from relative throughputs r(b) at b bytes per partition:
    r = (b/B) / (b/B + d) relative to the largest point, solved for d in least squares
    (the curve's plateau taken as the last point)."""
    bmax, rmax = curve[-1]
    t_max = bmax / engine_Bps
    # throughput ratio r_i / r_max = (b_i / (b_i/B + d)) / (bmax / (t_max + d)); linear in d
    # after rearranging: r_i*bmax*(b_i/B + d) = rmax*b_i*(t_max + d)
    num = den = 0.0
    for b, r in curve[:-1]:
        a = r * bmax - rmax * b  # coefficient of d
        c = rmax * b * t_max - r * bmax * b / engine_Bps  # constant
        num += a * c
        den += a * a
    return max(num / den, 0.0)


DMA_CHUNK_S = fit_dma_chunk_s()

# --- links ------------------------------------------------------------------------------
TRN2_TORUS_CHIP_BPS = 1024e9  # Trainium2 architecture page
TRN2_HOP_LATENCY_S = 1.5e-6  # mid-point of "~1-2 us intra-instance" (Trainium2 architecture page)


@dataclass(frozen=True)
class LinkModel:
    """The link a ring runs on: per-rank, per-direction bandwidth and per-hop latency.

    One ring step moving ``b`` bytes takes ``b / bandwidth_Bps + latency_s``.

    ``bisection_factor`` (default 1) scales the bandwidth term of ``all_to_all`` only,
    whose time is ``(n-1) * (S/n / bandwidth_Bps * bisection_factor + latency_s)``. The
    default is a full-bisection network at the link's bandwidth (every rank sends its n-1
    chunks over its own link and nothing else shares it: a switch, or 2 ranks). Topologies
    where chunks cross several hops set it from their bisection, e.g. with one link of
    bandwidth B per rank and direction:
      * a one-way ring of n ranks: every link carries S(n-1)/2 bytes, factor n/2;
      * a two-way ring (both directions, 2B per rank): factor n/4 (n >= 4);
      * the Trn2 4x4 torus (16 ranks, 4 links of B per chip): the bisection (8 links
        each way) carries n*S/4 bytes, time S/(2B), factor n/(2(n-1)) = 8/15.
    (ASSUMPTION: traffic spreads evenly over the bisection; no published NKI figure.)
    """

    bandwidth_Bps: float
    latency_s: float
    bisection_factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.bisection_factor > 0:
            raise ValueError(f"LinkModel.bisection_factor must be > 0, got {self.bisection_factor}")
        if not self.bandwidth_Bps > 0:
            raise ValueError(f"LinkModel.bandwidth_Bps must be > 0, got {self.bandwidth_Bps}")
        if not self.latency_s >= 0:
            raise ValueError(f"LinkModel.latency_s must be >= 0, got {self.latency_s}")

    def transfer_s(self, nbytes: float) -> float:
        """Seconds for one hop of ``nbytes``: bytes / bandwidth + latency."""
        return nbytes / self.bandwidth_Bps + self.latency_s

    def alltoall_s(self, n: int, nbytes: float) -> float:
        """Seconds of an all-to-all of ``nbytes`` per rank over ``n`` ranks:
        (n-1) * (nbytes/n / bandwidth * bisection_factor + latency)."""
        return (n - 1) * (nbytes / n / self.bandwidth_Bps * self.bisection_factor + self.latency_s)


# Default: one direction of one axis of the Trn2 4x4 torus. 1,024 GB/s per chip is the sum
# over 2 axes x 2 directions, so one ring direction gets 256 GB/s.
DEFAULT_LINK = LinkModel(bandwidth_Bps=TRN2_TORUS_CHIP_BPS / 4, latency_s=TRN2_HOP_LATENCY_S)


def matmul_seconds(n_stationary: int, n_moving: int, dtype: np.dtype, double_row: bool = False) -> float:
    """TensorE time of one nc_matmul: max(min(64, N_stationary), N_moving) cycles at the
    active generation's TensorE clock (2.8 GHz trn1, 2.4 GHz trn2/trn3).

    N_stationary is the stationary free size (M), N_moving the moving free size (N); the
    formula is the BF16 one of the NKI Performance Guide (FP32 x4, FP8 double_row /2: ASSUMPTION).
    """
    cycles = float(max(min(MATMUL_MIN_CYCLES, n_stationary), n_moving))
    if np.dtype(dtype).itemsize >= 4:
        cycles *= MATMUL_FP32_FACTOR
    elif double_row:
        cycles /= 2
    return cycles / active().tensor_hz


def elementwise_seconds(free_elements: int, engine: str = "Vector", itemsize: int = 4, inputs: int = 1) -> float:
    """Vector/Scalar/GpSimd time of one instruction on the active generation:
    (inputs x free elements per partition / lanes + 64) cycles at the engine's clock.

    "If there are two input tiles, the instruction can execute in roughly 2N cycles"
    (Trainium/Inferentia2 architecture guide, VectorE cost model: one element per partition
    per cycle there); lanes are the elements per partition per cycle of the generation's
    data path (``Generation``): VectorE on trn2/trn3 2 (4-byte) or 4 (2-byte), ScalarE 1
    (trn3 2 for 2-byte), GpSimdE 1. The 64 cycles are the tensor access overhead.
    """
    g = active()
    if engine == "Vector":
        hz, lanes = g.vector_hz, (g.vector_lanes_2b if itemsize <= 2 else g.vector_lanes_4b)
    elif engine == "Scalar":
        hz, lanes = g.scalar_hz, (g.scalar_lanes_2b if itemsize <= 2 else 1)
    else:
        hz, lanes = g.gpsimd_hz, 1
    return (max(1, inputs) * free_elements / lanes + ELEMENTWISE_FIXED_CYCLES) / hz


def vector_dependent_extra_seconds() -> float:
    """Extra time of a VectorE instruction that reads its predecessor's output on the active
    generation: (VECTOR_DEPENDENT_FIXED_CYCLES - ELEMENTWISE_FIXED_CYCLES) VectorE cycles."""
    return (VECTOR_DEPENDENT_FIXED_CYCLES - ELEMENTWISE_FIXED_CYCLES) / active().vector_hz


def dma_transfer_seconds(nbytes: int, chunks: int = 0, partitions: int = 128) -> float:
    """Data phase of one DMA on the active generation: its ``chunks`` contiguous pieces
    (``nbytes`` in all) spread over the DMA engines, ``PARTITIONS_PER_DMA_ENGINE``
    partitions each (all 16 for 128 partitions, fewer for fewer: "Use full partitions
    (P=128). Fewer partitions means fewer engines utilized", DMA bandwidth guide), each
    chunk costing bytes / engine rate + DMA_CHUNK_S:
    (nbytes / engine_Bps + chunks x DMA_CHUNK_S) / engines.
    ``chunks=0``: a bulk stream (the DMA rings of a collective), bytes at the full rate."""
    g = active()
    engines = max(1, min(g.dma_engines, -(-max(1, partitions) // PARTITIONS_PER_DMA_ENGINE)))
    return (nbytes / g.dma_engine_Bps + chunks * DMA_CHUNK_S) / engines
