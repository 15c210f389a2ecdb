"""Target descriptions shipped with trnopt, one TOML file per machine."""
