"""MMLU as the EMO paper ran it: OpenCompass's MMLU PPL setting, fixed 5-shot (the first 5 dev rows of each subject).

Per subject: hint + 5 solved dev questions + the test question, one prompt per answer letter ending "Answer: X";
the letter of lowest perplexity is the prediction. Data: cais/mmlu (config "all", split by its "subject" column)
through eval_tasks.dataset_loading ($DISTMATCH_EVAL_DATA_DIR switches to local JSONL copies). The prompt strings equal the
lm-eval task distmatch_mmlu's context + " X" (eval_tasks.nlu.mmlu_context).
"""

from opencompass.openicl.icl_evaluator import AccwithDetailsEvaluator
from opencompass.openicl.icl_inferencer import PPLInferencer
from opencompass.openicl.icl_prompt_template import PromptTemplate
from opencompass.openicl.icl_retriever import FixKRetriever

from eval_tasks.opencompass_ext import DistMatchMMLUDataset

distmatch_mmlu_subjects = [
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "business_ethics",
    "clinical_knowledge",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "econometrics",
    "electrical_engineering",
    "elementary_mathematics",
    "formal_logic",
    "global_facts",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_european_history",
    "high_school_geography",
    "high_school_government_and_politics",
    "high_school_macroeconomics",
    "high_school_mathematics",
    "high_school_microeconomics",
    "high_school_physics",
    "high_school_psychology",
    "high_school_statistics",
    "high_school_us_history",
    "high_school_world_history",
    "human_aging",
    "human_sexuality",
    "international_law",
    "jurisprudence",
    "logical_fallacies",
    "machine_learning",
    "management",
    "marketing",
    "medical_genetics",
    "miscellaneous",
    "moral_disputes",
    "moral_scenarios",
    "nutrition",
    "philosophy",
    "prehistory",
    "professional_accounting",
    "professional_law",
    "professional_medicine",
    "professional_psychology",
    "public_relations",
    "security_studies",
    "sociology",
    "us_foreign_policy",
    "virology",
    "world_religions",
]

_question = "{input}\nA. {A}\nB. {B}\nC. {C}\nD. {D}"
_letters = ["A", "B", "C", "D"]

distmatch_mmlu_datasets = []
for _subject in distmatch_mmlu_subjects:
    # The hint keeps OpenCompass's two spaces after "about".
    _hint = (
        f"The following are multiple choice questions (with answers) about  {_subject.replace('_', ' ')}.\n\n"
    )
    distmatch_mmlu_datasets.append(
        dict(
            abbr=f"distmatch_mmlu_{_subject}",
            type=DistMatchMMLUDataset,
            name=_subject,
            reader_cfg=dict(
                input_columns=["input", "A", "B", "C", "D"],
                output_column="target",
                train_split="dev",
                test_split="test",
            ),
            infer_cfg=dict(
                ice_template=dict(
                    type=PromptTemplate,
                    template={letter: f"{_question}\nAnswer: {letter}\n" for letter in _letters},
                ),
                prompt_template=dict(
                    type=PromptTemplate,
                    template={letter: f"{_hint}</E>{_question}\nAnswer: {letter}" for letter in _letters},
                    ice_token="</E>",
                ),
                retriever=dict(type=FixKRetriever, fix_id_list=[0, 1, 2, 3, 4]),
                inferencer=dict(type=PPLInferencer),
            ),
            eval_cfg=dict(evaluator=dict(type=AccwithDetailsEvaluator)),
        )
    )

del _subject, _hint
