"""EMO's open-ended generation (Tables 1-2): the corpora, the prefix / reference split, the decoding settings and
the scores (MAUVE, ROUGE, the oracle's perplexity) in :mod:`eval_tasks.open_ended.open_ended`, shared by the lm-eval
tasks and ``distmatch-eval open-ended``; the lm-eval task class (:mod:`eval_tasks.open_ended.harness`, which needs
lm-eval, so it is not imported here), the lm-eval YAMLs and README.md.
"""

from eval_tasks.open_ended.open_ended import (
    CORPORA,
    EMO_FEATURIZER,
    EMO_MAX_TEXT_LENGTH,
    ROUNDS,
    SCAN_BATCH,
    SCORE_KIND,
    Corpus,
    Example,
    build_examples,
    decoding_flags,
    keep_row,
    model_text,
    oracle_perplexity,
    prompt_records,
    read_corpus,
    rouge_f,
    round_texts,
    rows_scanned,
    score_files,
    split_row,
)

__all__ = [
    "CORPORA",
    "EMO_FEATURIZER",
    "EMO_MAX_TEXT_LENGTH",
    "ROUNDS",
    "SCORE_KIND",
    "SCAN_BATCH",
    "Corpus",
    "Example",
    "build_examples",
    "decoding_flags",
    "keep_row",
    "model_text",
    "oracle_perplexity",
    "prompt_records",
    "read_corpus",
    "rouge_f",
    "round_texts",
    "rows_scanned",
    "score_files",
    "split_row",
]
