"""Training scripts started by `accelerate launch` (see `trl_ext.cli`)."""
