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
- "Trainium2 Architecture" (Neuron docs): NeuronLink 1,024 GB/s per chip in the 4x4 torus
  (the sum of both axes, both directions); hop latency ~1-2 us intra-instance (ASSUMPTION:
  the order of magnitude of the Neuron collectives pages, not a published figure).
Figures marked ASSUMPTION are not in those pages; they are stated here so that they can
be replaced in one place.
"""

from __future__ import annotations

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
    "trn2": 224 * KIB,  # 28 MiB per NeuronCore-v3 / 128 partitions (Trainium2 architecture guide)
    "trn3": 256 * KIB,  # 32 MiB per NeuronCore-v4 / 128 partitions (Trainium3 arch guide)
}
DEFAULT_SBUF_BYTES_PER_PARTITION = SBUF_BYTES_PER_PARTITION["trn2"]

# --- engines ----------------------------------------------------------------------------
TENSOR_ENGINE_HZ = 2.4e9  # Trainium2 architecture guide
MATMUL_MIN_CYCLES = 64  # the min(64, N_stationary) floor of the matmul cycle formula
# ASSUMPTION: FP32 operands take four passes of the BF16 rate; FP8 with
# perf_mode=double_row takes half (the "FP8 double performance mode" of the nc_matmul page).
MATMUL_FP32_FACTOR = 4
# ASSUMPTION: Vector, Scalar and GpSimd engines process one element per partition per cycle
# at 1.4 GHz with a fixed ~64-cycle instruction overhead (Trainium2 arch guide order of
# magnitude; no published figure).
ELEMENTWISE_ENGINE_HZ = 1.4e9
ELEMENTWISE_FIXED_CYCLES = 64

DMA_BANDWIDTH_BPS = 368e9  # per core (Trainium2 architecture guide); also bounds the core's HBM
# traffic in the simulator: compute DMAs and the DMA rings of collectives share it (timeline)
DMA_SEMAPHORE_TO_START_S = 1.3e-6  # Trainium2 architecture guide
DMA_DESCRIPTOR_S = 0.6e-6  # per descriptor-generating instruction (Trainium2 architecture guide)
DMA_QUEUES = 4  # ASSUMPTION: DMA instructions round-robin over four issue queues
# ASSUMPTION: a core_barrier is a remote semaphore update plus a local wait ("nki.isa.core_barrier");
# taken as one DMA semaphore-to-start latency.
CORE_BARRIER_S = DMA_SEMAPHORE_TO_START_S

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
    """TensorE time of one nc_matmul: max(min(64, N_stationary), N_moving) cycles at 2.4 GHz.

    N_stationary is the stationary free size (M), N_moving the moving free size (N); the
    formula is the BF16 one of the NKI Performance Guide (FP32 x4, FP8 double_row /2: ASSUMPTION).
    """
    cycles = float(max(min(MATMUL_MIN_CYCLES, n_stationary), n_moving))
    if np.dtype(dtype).itemsize >= 4:
        cycles *= MATMUL_FP32_FACTOR
    elif double_row:
        cycles /= 2
    return cycles / TENSOR_ENGINE_HZ


def elementwise_seconds(free_elements: int) -> float:
    """Vector/Scalar/GpSimd time: (free elements per partition + 64) cycles at 1.4 GHz (ASSUMPTION)."""
    return (free_elements + ELEMENTWISE_FIXED_CYCLES) / ELEMENTWISE_ENGINE_HZ


def dma_transfer_seconds(nbytes: int) -> float:
    """Data phase of one DMA on the core's DMA bandwidth: bytes / 368 GB/s."""
    return nbytes / DMA_BANDWIDTH_BPS
