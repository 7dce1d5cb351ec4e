"""The lm-eval task folder of GEM's GSM8K / MATH voting and coverage: YAMLs, ``utils.py`` and README.md (no code of its own)."""
