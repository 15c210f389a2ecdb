"""One module per CLI command, the argument helpers and the report writers."""
