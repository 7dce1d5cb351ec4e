"""The memory-efficient paths' public entry points, gathered: `token_loss` (from logits, `logits_path.py`) and
`fused_token_loss` (from hidden states and the LM head, `fused_path.py`), and `auto_chunk_size` (`plan.py`).

Both run the closed-form row math (`rows.chunk_math`, or its Triton kernel on CUDA, see `row_backends.py`) on chunks
of *valid* rows (ignored rows cost nothing) in float32, so no more than one chunk of vocabulary-sized temporaries
exists at a time. How they run (chunk budget, the chunk's logit dtype, the d-weight accumulator, the kernels) is a
`FusedSettings` (`settings.py`), given as `settings=` or read from the environment once at the entry point.
"""

from __future__ import annotations

from .fused_path import fused_token_loss
from .logits_path import token_loss
from .plan import auto_chunk_size
from .settings import ENV

# The settings' environment fallbacks, by their historical names (benchmarks and tests set them).
CHUNK_MEMORY_ENV = ENV["chunk_memory_mb"]
GRAD_WEIGHT_ACCUM_ENV = ENV["grad_weight_accum"]
CHUNK_LOGITS_ENV = ENV["chunk_logits"]

__all__ = [
    "CHUNK_LOGITS_ENV",
    "CHUNK_MEMORY_ENV",
    "GRAD_WEIGHT_ACCUM_ENV",
    "auto_chunk_size",
    "fused_token_loss",
    "token_loss",
]
