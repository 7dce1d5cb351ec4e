# Generated from the loss specs by `python tools/generate.py`; do not edit (`--check` compares).
"""The names of the losses and of their options, for the layers that must not import torch.

Written from `trl_ext.losses.LOSS_NAMES`, `trl_ext.options.LOSS_OPTIONS` and `trl_ext.resume`; the
activation hooks read them through `distmatch_hooks._common`.
"""

#: The losses of `trl_ext.losses`, in the registry's order.
LOSS_NAMES = (
    "ce",
    "emo",
    "gem_linear",
    "gem_ls",
    "ce_entropy",
    "tailr",
    "mixce",
    "dft",
    "eaft",
    "prob",
    "asft",
    "sft_kl",
)
#: The options' config keys, the same in TRL and Axolotl (`trl_ext.options.LOSS_OPTIONS`; paths' last).
LOSS_OPTION_NAMES = (
    "emo_cost_embedding",
    "emo_weighting",
    "emo_ratio_clamp",
    "emo_target_mass",
    "gem_beta",
    "ce_entropy_coef",
    "tailr_gamma",
    "tailr_min_weight",
    "tailr_variant",
    "mixce_gamma",
    "eaft_alpha",
    "eaft_k",
    "prob_q",
    "prob_min_p",
    "prob_max_p",
    "anchor_reference",
    "anchor_kl_weight",
    "loss_chunk_memory_mb",
    "loss_chunk_logits",
    "loss_grad_weight_accum",
    "loss_kernels",
)
#: The distmatch settings that are not loss options (same names in TRL and Axolotl; `trl_ext.resume`).
RUN_OPTION_NAMES = (
    "allow_loss_change",
    "overwrite_run",
)
