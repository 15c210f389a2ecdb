"""A multi-rank CPU simulator for the subset of NKI that trnopt kernels use, nki.collectives included."""
