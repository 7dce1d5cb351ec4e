"""The lm-eval task folder of EMO's in-context NLU suite (Table 3) and MMLU: YAMLs, ``utils.py`` and README.md (no code of its own)."""
