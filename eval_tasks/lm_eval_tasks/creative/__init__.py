"""The lm-eval task folder of GEM's creative-writing diversity (Table 2): YAMLs, ``utils.py`` and README.md (no code of its own)."""
