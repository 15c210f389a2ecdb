"""trnopt.kernels: NKI overlap kernels, their plans, and a multi-rank simulator."""
