"""The run-folder lock and the memory-efficient paths' settings, from their documented contract (docs/losses.md
"Memory-efficient paths: settings", docs/refusals.md): what the outside audit of those changes found untested.

In process: the lock's holder rule, the launcher's check for a plain run the hook caught, the settings' fallback
and device rules, and the settings reaching the loss through every caller (the patched forward on both paths,
`token_loss`, the plan's chunk budget, the run record's history and resume).
The Axolotl hook's default output folder: tests/axolotl/test_activation_hook.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from distmatch.errors import DistMatchConfigError
from tests.helpers.flock_probe import holder, probe
from tests.helpers.sft import make_config
from tests.helpers.tiny_model import tiny_llama_in_memory
from trl_ext import output_lock
from trl_ext.cli import check_parsed
from trl_ext.losses import FusedSettings, auto_chunk_size, token_loss
from trl_ext.losses.plan import make_plan
from trl_ext.losses.row_backends import kernel_unavailable
from trl_ext.model_forward import LossRequest, install_loss_forward
from trl_ext.options import check_fused_settings, run_device_type, with_path_env_fallback
from trl_ext.resume import resolve_resume, used_options, write_record


@pytest.fixture
def release(monkeypatch):
    """Forget and release the locks a test took, and the holder variable a launcher exports."""
    monkeypatch.delenv(output_lock.HOLDER_ENV, raising=False)
    before = dict(output_lock._HELD)
    yield
    for key in [k for k in output_lock._HELD if k not in before]:
        fd = output_lock._HELD.pop(key)
        if fd is not None:
            os.close(fd)


# ---- the output folder's lock ------------------------------------------------------------------------------------


@pytest.mark.launches
def test_a_holder_variable_naming_no_ancestor_does_not_excuse_the_lock(tmp_path, monkeypatch, release):
    """Only a live ancestor (the launcher) holds the lock for a process: a variable inherited from elsewhere, naming
    a live process that is not an ancestor or a dead one, must not let the run skip the lock."""
    out = tmp_path / "out"
    out.mkdir()
    sibling = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        monkeypatch.setenv(output_lock.HOLDER_ENV, f"{sibling.pid}:{out.resolve()}")
        output_lock.lock_output_dir(out)
        assert probe(out) == "busy"  # this process took the lock itself
    finally:
        sibling.communicate("", timeout=60)


@pytest.mark.launches
def test_the_launcher_checks_and_locks_the_folder_for_a_plain_run_the_hook_caught(tmp_path, release):
    """A plain `trl sft` (no distmatch loss) the hook acts for is refused while another run writes the folder, and
    once its checks pass its launcher holds the lock for the processes it starts (named in the holder variable)."""
    out = tmp_path / "out"
    out.mkdir()
    held = holder(out)  # it holds the lock now
    try:
        with pytest.raises(DistMatchConfigError, match="is being written by another training run"):
            check_parsed([make_config(tmp_path, overwrite_run=True)], hold=True)
    finally:
        held.communicate("", timeout=60)
    check_parsed([make_config(tmp_path)])  # a check only: the folder stays free
    assert probe(out) == "free"
    check_parsed([make_config(tmp_path)], hold=True)
    assert probe(out) == "busy"
    assert os.environ[output_lock.HOLDER_ENV] == f"{os.getpid()}:{out.resolve()}"


# ---- the settings' rules -----------------------------------------------------------------------------------------


def test_a_set_option_wins_over_its_environment_variable_in_every_framework(monkeypatch):
    """`with_path_env_fallback` (Axolotl's YAML, ms-swift's options): the variable fills only what is unset."""
    monkeypatch.setenv("DISTMATCH_GRAD_WEIGHT_ACCUM", "float32")
    monkeypatch.setenv("DISTMATCH_CHUNK_MEMORY_MB", "abc")  # never read: the option is set
    options = with_path_env_fallback({"loss_grad_weight_accum": "weight", "loss_chunk_memory_mb": 8.0})
    assert (options["loss_grad_weight_accum"], options["loss_chunk_memory_mb"]) == ("weight", 8.0)
    monkeypatch.delenv("DISTMATCH_CHUNK_MEMORY_MB")
    assert with_path_env_fallback({"loss_grad_weight_accum": None})["loss_grad_weight_accum"] == "float32"


def test_use_cpu_makes_a_run_a_cpu_run_even_beside_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the rule for a machine with a GPU
    assert (run_device_type(use_cpu=True), run_device_type(use_cpu=False)) == ("cpu", "cuda")


def test_loss_kernels_torch_means_no_kernel_even_on_cuda():
    assert kernel_unavailable("gem_ls", "torch", "cuda") == "loss_kernels is 'torch'"
    for value in (("loss_grad_weight_accum", "tiles"), ("loss_chunk_logits", "input")):
        with pytest.raises(DistMatchConfigError, match=r"loss_kernels is 'torch'") as info:
            check_fused_settings("gem_ls", {"loss_kernels": "torch", value[0]: value[1]}, "cuda")
        assert f"{value[0]}={value[1]!r}" in str(info.value)


# ---- the settings reach the loss -------------------------------------------------------------------------------


@pytest.mark.parametrize("force_logits", [False, True], ids=["fused", "logits"])
def test_the_patched_forward_computes_with_the_runs_settings(monkeypatch, force_logits):
    """The run's settings, not the environment's: a setting that cannot run on a CPU (`loss_kernels: triton`
    without Triton's interpreter) is refused by the loss when the request carries it, on both paths, and the same
    request with the environment saying otherwise changes nothing."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("DISTMATCH_KERNELS", "torch")
    model = tiny_llama_in_memory()
    install_loss_forward(model)
    ids = torch.arange(6).reshape(1, 6)
    forced = LossRequest("ce", {}, force_logits_path=force_logits, settings=FusedSettings(kernels="triton"))
    with pytest.raises(ValueError, match="loss_kernels='triton' needs a CUDA device"):
        model(input_ids=ids, labels=ids, distmatch_loss=forced)
    plain = LossRequest("ce", {}, force_logits_path=force_logits, settings=FusedSettings(kernels="torch"))
    monkeypatch.setenv("DISTMATCH_KERNELS", "triton")
    assert torch.isfinite(model(input_ids=ids, labels=ids, distmatch_loss=plain).per_token_loss).all()


def test_token_loss_honours_the_settings_it_is_given_over_the_environment(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("DISTMATCH_KERNELS", "triton")  # would be refused on this CPU
    logits, labels = torch.randn(5, 11), torch.tensor([1, 2, -100, 4, 5])
    got = token_loss("gem_ls", logits, labels, settings=FusedSettings(kernels="torch"))
    assert got.shape == (5,) and got[2] == 0


def test_the_chunk_budget_setting_sizes_the_chunks():
    """`chunk_memory_mb` given as a setting (no environment): rows per chunk = budget / bytes per row."""
    assert auto_chunk_size(1024, torch.float32, 2, settings=FusedSettings(chunk_memory_mb=1)) == 2**20 // (
        1024 * 8
    )
    hidden = torch.randn(64, 4)
    plan = make_plan("gem_ls", {}, 1024, hidden, None, False, settings=FusedSettings(chunk_memory_mb=0.125))
    assert plan.chunk_size == int(0.125 * 2**20) // (1024 * 4 * 3)  # the closed forms' 3 float32 buffers
    wide = make_plan("gem_ls", {}, 1024, hidden, None, False, settings=FusedSettings(chunk_memory_mb=1))
    assert wide.chunk_size == 2**20 // (1024 * 4 * 3)


# ---- the run record ----------------------------------------------------------------------------------------------


def test_a_non_default_path_setting_is_part_of_the_history_and_of_a_resumes_check(tmp_path):
    """The history and the resume check compare the loss's options and the path settings that differ from their
    defaults: a run trained with `weight` resumed without it (or with another value) needs `allow_loss_change`."""
    assert used_options("gem_ls", {"loss_grad_weight_accum": "weight"}) == {
        "gem_beta": 0.7,
        "loss_grad_weight_accum": "weight",
    }
    assert used_options("gem_ls", {"loss_grad_weight_accum": "float32"}) == {"gem_beta": 0.7}
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / "trainer_state.json").write_text('{"global_step": 2}')
    write_record(folder, "gem_ls", {"loss_grad_weight_accum": "weight"}, "trl")
    assert resolve_resume(str(folder), "gem_ls", {"loss_grad_weight_accum": "weight"}).action == "same"
    adopted = resolve_resume(str(folder), None, {})
    assert adopted.action == "adopt" and adopted.options["loss_grad_weight_accum"] == "weight"
    with pytest.raises(DistMatchConfigError, match="loss_grad_weight_accum='weight'.*allow_loss_change"):
        resolve_resume(str(folder), "gem_ls", {})
    assert resolve_resume(str(folder), "gem_ls", {}, allow_change=True).action == "change"
