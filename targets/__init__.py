"""Data shipped with trnopt: machines/*.toml (targets), models/*.toml (model presets) and
measured/ (tables measured by trnopt's own benchmarks, with their provenance)."""
