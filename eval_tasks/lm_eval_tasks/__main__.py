"""``python -m eval_tasks.lm_eval_tasks`` prints the task folder (for ``lm_eval --include_path``)."""

from eval_tasks.lm_eval_tasks import TASK_DIR

print(TASK_DIR)
