#!/usr/bin/env bash
# The GPU check in one command (docs/benchmarks.md "The GPU check"): installs the wheels of `make gpu-kit`
# offline into a target folder on PYTHONPATH (the image's torch untouched), then runs the Triton tests, the loss
# benchmark, the `trl sft` training benchmark and the packing parity check, each time-boxed, and writes every
# result and summary.md under $OUT (or --out DIR). The whole run stays within one 9-minute command (535 s).
#   tools/gpu_check.sh                        # on the GPU machine
#   tools/gpu_check.sh --device cpu --out D   # the CPU dry run (tiny shapes)
# The interpreter: $PYTHON; unset, the repository's .venv when it exists (this checkout's), else python3 (the GPU
# image's). One without torch is refused in one line.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON="$PWD/.venv/bin/python"; else PYTHON=python3; fi
fi
exec timeout -k 10 "${GPU_CHECK_TIMEOUT:-535}" "$PYTHON" tools/gpu_check.py "$@"
