"""Compile the Triton row kernel with Triton's real compiler for a GPU target, without needing a GPU.

Every constexpr combination the dispatcher can launch, at the launch configuration it uses for a Llama-3 vocabulary,
goes through Triton's frontend (what the interpreter never exercises: typing of loop-carried values, constexpr
branches, supported syntax) down to PTX and, with the ``ptxas`` bundled in the Triton wheel, to a cubin, whose
resource usage (``cuobjdump``, also in the wheel) must show no register spills to local memory. Run with
TRITON_INTERPRET unset:

    python tests/helpers/triton_compile_check.py [sm_capability, default 90] [chunk dtype: fp32 or bf16, default both]

Prints one line per variant and exits non-zero on the first failure.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from trl_ext.losses import triton_rows  # noqa: E402
from trl_ext.losses.kernel_contract import LOSS_IDS, Mode  # noqa: E402
from trl_ext.losses.registry import TRITON_LOSSES  # noqa: E402

SIGNATURE = {
    "z_ptr": "*fp32",
    "sim_ptr": "*fp32",
    "sim_row_scale_ptr": "*fp32",
    "sim_col_scale_ptr": "*fp32",
    "y_ptr": "*i64",
    "loss_ptr": "*fp32",
    "ce_ptr": "*fp32",
    "entropy_ptr": "*fp32",
    "top1_ptr": "*fp32",
    "demd_ptr": "*fp32",
    "coef_ptr": "*fp32",
    "grad_scale_ptr": "*fp32",
    "vocab": "i32",
    "col0": "i32",
    "z_stride": "i64",
    "sim_stride": "i64",
    "inv_beta": "fp32",
    "ratio_max": "fp32",
    "target_coef": "fp32",
    "LOSS": "constexpr",
    "EMO1": "constexpr",
    "WANT_GRAD": "constexpr",
    "WANT_STATS": "constexpr",
    "MODE": "constexpr",
    "BLOCK": "constexpr",
}
# (WANT_GRAD, WANT_STATS, MODE) the dispatcher launches: a chunk (the default paths), a chunk that also stores its
# gradient coefficients (DISTMATCH_GRAD_WEIGHT_ACCUM=tiles' forward), a tile's gradient alone.
MODES = [(grad, stats, Mode.FULL) for grad in (True, False) for stats in (True, False)]
MODES += [(True, stats, Mode.COEF_OUT) for stats in (True, False)] + [(True, False, Mode.GRAD_ONLY)]


VOCAB = 128256  # Llama 3


def resource_usage(cubin: bytes) -> str:
    """cuobjdump's resource line for the kernel ("REG:110 STACK:0 SHARED:1024 LOCAL:0 ...")."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True)
    lines = [line.strip() for line in out.stdout.splitlines() if "REG:" in line]
    assert lines, out.stdout + out.stderr
    return lines[0][lines[0].index("REG:") :]


def main(capability: int = 90, chunks: tuple[str, ...] = ("fp32", "bf16")) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: this checks the compiler, not the interpreter", file=sys.stderr)
        return 2
    names = list(SIGNATURE)
    target = GPUTarget("cuda", capability, 32)
    block, num_warps = triton_rows.launch_config(VOCAB)
    count = 0
    for chunk, loss, emo1, (want_grad, want_stats, mode) in itertools.product(
        chunks, TRITON_LOSSES, (True, False), MODES
    ):
        if loss != "emo" and not emo1:
            continue
        signature = {
            **SIGNATURE,
            "z_ptr": f"*{chunk}",
        }  # float32 chunks, or DISTMATCH_CHUNK_LOGITS=input's bf16
        values = {
            "LOSS": LOSS_IDS[loss],
            "EMO1": emo1,
            "WANT_GRAD": want_grad,
            "WANT_STATS": want_stats,
            "MODE": int(mode),
            "BLOCK": block,
        }
        constexprs = {(names.index(k),): v for k, v in values.items()}
        source = ASTSource(fn=triton_rows._distmatch_row_kernel, signature=signature, constexprs=constexprs)
        kernel = triton.compile(source, target=target, options={"num_warps": num_warps})
        usage = resource_usage(kernel.asm["cubin"])
        print(
            f"compiled {chunk} {loss} emo1={emo1} grad={want_grad} stats={want_stats} mode={mode.name} "
            f"BLOCK={block} warps={num_warps}: {usage}"
        )
        spilled = int(re.search(r"LOCAL:(\d+)", usage).group(1))
        if spilled:
            print(f"register spills: {spilled} bytes of local memory", file=sys.stderr)
            return 1
        count += 1
    print(f"{count} variants compiled for sm_{capability}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 90, tuple(sys.argv[2:3]) or ("fp32", "bf16")))
