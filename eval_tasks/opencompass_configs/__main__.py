"""``python -m eval_tasks.opencompass_configs`` prints the config folder (for ``opencompass --config-dir``)."""

from eval_tasks.opencompass_configs import CONFIG_DIR

print(CONFIG_DIR)
