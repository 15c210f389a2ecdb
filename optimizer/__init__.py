"""trnopt.optimizer: targets, workloads, the cost model, the CP-SAT layout search and the CLI."""
