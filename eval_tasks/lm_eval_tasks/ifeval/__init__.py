"""The lm-eval task folder of GEM's IFEval: YAMLs, ``utils.py`` and README.md (no code of its own)."""
