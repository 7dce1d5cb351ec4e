"""The lm-eval task folder of GEM's code generation (HumanEval, MBPP+): YAMLs, ``utils.py`` and README.md (no code of its own)."""
