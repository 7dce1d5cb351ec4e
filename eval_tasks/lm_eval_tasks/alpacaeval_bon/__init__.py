"""The lm-eval task folder of GEM's AlpacaEval reward best-of-n: YAMLs, ``utils.py`` and README.md (no code of its own)."""
