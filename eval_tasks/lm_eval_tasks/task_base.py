"""What the lm-eval task classes of every family share: :class:`DistMatchTask` (a ``ConfigurableTask`` built from
our YAML, whose options come from the task metadata) and :func:`dataset_dict` (the loaders' return value).

Task options come from the task metadata, i.e. lm-eval's ``--metadata '{...}'`` JSON (which also receives the
``--model_args``); some also from environment variables. Every option, its default and valid values are in one
table, :data:`eval_tasks.task_options.TASK_OPTIONS` (the keys the pre-flight check of
:mod:`eval_tasks.lm_eval_tasks.preflight` accepts, unknown keys and out-of-range values refused there);
``protocol`` (``emo_official``, ``gem_official``) selects a paper's published protocol as a preset of several
options (:data:`eval_tasks.task_options.PROTOCOLS`). Each task class and loader reads its family's options through
:func:`eval_tasks.task_options.resolve` (explicit > environment variable > protocol > default); the task class
writes the protocol-relevant values back into its metadata, which lm-eval records in the results file. The family
task classes live in their packages (``eval_tasks/<family>/harness.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eval_tasks import require_lm_eval

require_lm_eval()

from lm_eval.api.task import ConfigurableTask  # noqa: E402

from eval_tasks.task_options import (  # noqa: E402
    check_task_options,
    protocol_differences,
    recorded_options,
    resolve,
)

__all__ = ["DistMatchTask", "dataset_dict", "log"]

log = logging.getLogger("lm_eval.distmatch")


def dataset_dict(docs: list[dict[str, Any]] | Any) -> Any:
    """The documents as lm-eval's dataset: one ``test`` split (what ``custom_dataset`` loaders return)."""
    import datasets

    test = docs if isinstance(docs, datasets.Dataset) else datasets.Dataset.from_list(docs)
    return datasets.DatasetDict({"test": test})


class DistMatchTask(ConfigurableTask):
    """``ConfigurableTask`` built from our YAML, plus metadata-driven overrides and chat-template advice."""

    #: True: the papers ran this task with the model's chat template; False: they did not; None: no advice.
    WANTS_CHAT_TEMPLATE: bool | None = None
    #: The task family (:data:`eval_tasks.task_options.FAMILIES`): which options and protocols apply.
    FAMILY: str = ""

    def __init__(self, config: Mapping[str, Any] | None = None, **_: Any) -> None:
        config = dict(config or {})
        config.pop("class", None)
        self.options: dict[str, Any] = dict(config.get("metadata") or {})
        check_task_options(self.options)  # again here for Python-API users (the hook checks before the model)
        task = str(config.get("task") or type(self).__name__)
        # Explicit options > environment variable > protocol preset > defaults; the protocol-relevant values go back
        # into the metadata, so the dataset loader sees them and lm-eval's results file (`configs`) records them.
        self.resolved: dict[str, Any] = resolve(self.FAMILY, self.options, task) if self.FAMILY else {}
        self.options.update(recorded_options(self.resolved))
        config["metadata"] = dict(self.options)
        self.prepare_config(config)
        super().__init__(config=config)
        protocol = self.resolved.get("protocol", "default")
        if protocol != "default":
            differences = protocol_differences(protocol, self.resolved)
            log.info(
                "%s: protocol %s%s",
                task,
                protocol,
                (" with overrides: " + "; ".join(differences)) if differences else "",
            )

    def prepare_config(self, config: dict[str, Any]) -> None:
        """Adjust the YAML config from the options before lm-eval builds the task."""

    def build_all_requests(self, **kwargs: Any) -> Any:
        chat = bool(kwargs.get("apply_chat_template"))
        if self.WANTS_CHAT_TEMPLATE is True and not chat:
            log.warning(
                "%s: the GEM paper ran this task with the model's chat template; pass --apply_chat_template "
                "for chat/instruction-tuned models.",
                self.config.task,
            )
        elif self.WANTS_CHAT_TEMPLATE is False and chat:
            log.warning(
                "%s: --apply_chat_template wraps the demonstrations in a chat turn; the EMO protocol scores the "
                "plain prompt (run these tasks without it).",
                self.config.task,
            )
        return super().build_all_requests(**kwargs)
