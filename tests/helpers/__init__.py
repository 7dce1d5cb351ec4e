"""Shared test helpers: repository root and offline environment (`env`), tiny models and data (`tiny_model`),
subprocess / CLI runner (`cli`), project-like venvs (`project_venv`), evaluation fixtures (`eval_fixtures`), loss
oracles (`loss_oracles`), and the distributed helpers and `torchrun` workers (`dist_common`, `*_worker.py`)."""
