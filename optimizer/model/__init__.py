"""The domain: targets, workloads, layouts, placement, and the loaders with their checks."""
