"""The ms-swift plugin (swift_distmatch), in .venv-swift (marker swift_env)."""
