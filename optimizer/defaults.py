"""Every default of trnopt in one place; the CLI's help strings read them from here."""

from __future__ import annotations

TARGET = "trn2u"             # the Trn2 UltraServer: the machine most teams plan for
MODEL = "llama3-405b"        # the largest dense Llama 3
SEQ = 8192                   # Llama 3's pre-training context
GLOBAL_BATCH = 1024          # sequences per step
HEADROOM = 0.10              # HBM share a plan leaves free
OBJECTIVE = "step-time"      # or "goodput": step time / goodput
OBJECTIVES = ("step-time", "goodput")
ZERO_STAGES = (0, 1, 2, 3)
TIME_LIMIT_S = 60.0          # seconds for the whole search
KERNELS_TIME_LIMIT_S = 300.0  # seconds of simulator runs in `trnopt kernels` (its safety stop)
TOP = 3                      # runner-up layouts shown
SEED = 0                     # CP-SAT random seed
# CP-SAT workers: four beat two on these 2-core machines (benchmarks/solver_scaling.py: the
# portfolio's bound-proving workers matter more than the cores).
WORKERS = 4
COMPARE_TARGETS = "trn2u,trn3-gen1,trn3-gen2"
# torchtitan data-parallel sharding: SimpleFSDP, what Neuron recommends under torch.compile ("How to use
# torch.distributed on Neuron", SDK 2.33); "fsdp2" is fully_shard.
TORCHTITAN_FSDP = "simple"
UNCERTAINTY = 0.03          # relative step-time uncertainty within which near-ties go to the robust layout
# The search's work budgets: they, never wall time, end a search early, so its answer is a
# function of the inputs alone (--time-limit is only a safety stop). CP-SAT's deterministic
# time is its own count of work in "seconds" of a reference machine.
SOLVE_DETERMINISTIC_S = 30.0   # deterministic seconds per CP-SAT solve
SEARCH_DETERMINISTIC_S = 120.0 # deterministic seconds for all the CP-SAT solves of one branch and bound
SEARCH_NODES = 200_000         # branches and placements the branch and bound takes from its queue
SEARCH_POINTS = 400_000_000    # points the branch and bound scores in NumPy
FITS_DETERMINISTIC_S = 10.0    # deterministic seconds to decide whether some layout fits a domain count
MEMORY_DETERMINISTIC_S = 10.0  # deterministic seconds for the least memory per chip of one LNC's space
STAGE_SPLIT_DETERMINISTIC_S = 5.0  # deterministic seconds to find and prove one layout's best uneven split
STAGE_SPLIT_TIME_LIMIT_S = 30.0    # its wall-clock safety stop (reported when it binds)
JOINT_POINTS = 100_000_000   # points the joint layout-and-split search scores in NumPy (search/jointsplit.py)
JOINT_LAYOUTS = 20_000       # layouts whose per-stage costs it computes (about 3 ms each)
MOE_ROUTING_IMBALANCE = 1.0  # tokens of the busiest expert / the mean, for dropless routing: balanced (see Moe)
