"""Physical sanity bounds: the range a figure of a real machine, model or run can take.

A value outside its range is bad input (exit 2), not an answer: 1e-300 TFLOPS or a
switch latency of 1e300 us is valid TOML but no machine, and feeding it to the cost model
gives a layout with 0 tokens/s or an overflow. The ranges are deliberately wide:

- the upper end is at least 100x the largest figure shipped in 2026 (B200/Trn3-class
  chips: ~2,500 TFLOPS dense BF16, ~290 GiB HBM at ~8 TB/s, 1.8 TB/s scale-up links,
  3.2 Tbps EFA per instance), so a 2030 accelerator at 10x today's rates passes with a
  further 10x to spare;
- the lower end is 1e-3 in the file's unit (1 GFLOPS, 1 MiB, 1 MB/s, 1 Mbps, 3.6 s of
  MTBF): thousands of times below any accelerator a training job would run on (a 2016
  GPU: ~10 TFLOPS, 12 GiB at ~500 GB/s, PCIe links of ~10 GB/s, 1 Gbps Ethernet), so a
  slow or old machine, or a deliberately tiny one in a test, passes too.

Latencies and times may be 0 (an ideal link); their upper end is a time no collective
or restart takes. Counts (chips, cores, layers, ...) are bounded so that every product
the search forms (ranks = cores x chips x domains) stays an exact integer far below
2^53 and the work per rank stays bounded.

Units are those of the files: TFLOPS, GiB, GB/s, Gbps, us, hours, minutes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    lowest: float
    highest: float


# per chip
TFLOPS = Bound(1e-3, 1e6)                 # dense BF16 / FP8 peak
HBM_GIB = Bound(1e-3, 1e6)                # HBM capacity
HBM_BANDWIDTH_GBS = Bound(1e-3, 1e7)      # HBM bandwidth
ON_CHIP_GBS = Bound(1e-3, 1e7)            # between the cores of one chip
# links
LINK_GBS = Bound(1e-3, 1e6)               # per chip per domain axis
SCALE_OUT_GBPS = Bound(1e-3, 1e7)         # per instance
LATENCY_US = Bound(0.0, 1e6)              # per hop: up to one second
# reliability
MTBF_HOURS = Bound(1e-3, 1e9)             # 3.6 s to ~100,000 years per instance
CHECKPOINT_GBS = Bound(1e-3, 1e6)         # checkpoint write rate per instance
RESTART_MINUTES = Bound(0.0, 1e5)         # up to ~70 days
# efficiency fit
ENGINE_GHZ = Bound(1e-3, 1e3)              # an engine's clock
ENGINE_LANES = Bound(1, 1e6)               # elements per cycle, or a PE array's rows / tile sizes
MICROBATCH_OVERHEAD_US = Bound(0.0, 1e7)   # fixed seconds per micro-batch, up to 10 s

# counts
MAX_PHYSICAL_CORES = 1024                 # cores per chip (Trn2: 8)
MAX_AXIS_SIZE = 2**16                     # positions on one domain axis
MAX_CHIPS_PER_DOMAIN = 2**16              # chips of one scale-up domain (Trn3 Gen2: 144)
MAX_CORES_PER_INSTANCE = 2**14             # physical cores of one instance (trn2.48xlarge: 128)
MAX_CORES_PER_DOMAIN = 2**18               # physical cores of one domain (Trn3 Gen2: 1,152)
MAX_SBUF_KIB = 2**20                      # on-chip SRAM per partition (Trn2: 192-224 KiB)
MAX_CHIPS = 2**22                         # chips of one job: ~4 million, 20x the largest 2026 cluster
MAX_DOMAINS = MAX_CHIPS                   # domains of one job (one chip each at the least)

# models and runs
MAX_LAYERS = 2**16
MAX_WIDTH = 2**24                         # hidden, ffn, head and latent dimensions
MAX_HEADS = 2**16
MAX_VOCAB = 2**28
MAX_EXPERTS = 2**20
MAX_SEQ = 2**26                           # 64 M tokens per sequence
MAX_GLOBAL_BATCH = 2**26                  # sequences per step
