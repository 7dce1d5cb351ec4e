"""The distmatch suite as OpenCompass configs, shipped as package data (a regular package, so that mmengine's
``read_base()`` imports of ``eval_tasks.opencompass_configs...`` resolve to the installed files).

Datasets (``datasets/distmatch/``; each file defines one ``*_datasets`` list):

| file | what |
|---|---|
| ``distmatch_<task>_topk_ppl`` | one EMO retrieval task: TopK retriever (8 demos, all-mpnet-base-v2) + PPL per label |
| ``distmatch_mmlu_ppl`` | MMLU, 57 subjects, fixed 5-shot, PPL per answer letter |
| ``distmatch_nlu_topk_ppl`` | the 8 above (``distmatch_nlu_datasets``); ``..._emo_code_topk_ppl``: EMO-code templates |
| ``distmatch_ifeval_gen`` | IFEval, greedy, 1,024 new tokens |
| ``distmatch_{poem,story}_diversity_gen``, ``distmatch_creative_gen`` | GEM creative-writing diversity |

Summarizers: ``summarizers/distmatch_nlu.py`` and ``summarizers/distmatch_nlu_emo_code.py``. The NLU files are generated
from ``eval_tasks/nlu/nlu.py``'s task table by ``tools/generate.py`` (see README.md here). Two ways to use
them:

1. In your own config: ``with read_base(): from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_nlu_topk_ppl
   import distmatch_nlu_datasets`` (see ``examples/opencompass/``), then ``opencompass your_config.py``.
2. On the command line: ``opencompass --config-dir "$(python -m eval_tasks.opencompass_configs)" --datasets
   distmatch_nlu_topk_ppl --hf-type base --hf-path <model> ...``.
"""

from pathlib import Path

__all__ = ["CONFIG_DIR"]

CONFIG_DIR = Path(__file__).resolve().parent
