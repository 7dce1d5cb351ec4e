"""The lm-eval task folder of EMO's open-ended generation (Tables 1-2): YAMLs, ``utils.py`` and README.md (no code of its own)."""
