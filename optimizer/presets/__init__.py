"""Workload presets shipped with trnopt, one TOML file per model."""
