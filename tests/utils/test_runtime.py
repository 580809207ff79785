"""The hardware runtime (`itune_hf.utils.runtime`): mixed precision chosen for the hardware (native bf16 detected,
not assumed; `accelerate launch`'s choice and an explicit one honoured), CPU threads and the allocator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from itune_hf.training import TrainingConfig
from itune_hf.utils import runtime


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Pretend the CPU has (True) or lacks (False) native bf16, whatever this machine has."""

    def set_native(native: bool) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: native)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)

    return set_native


def test_auto_precision_is_bf16_only_where_the_cpu_has_it_natively(cpu_bf16):
    cpu_bf16(True)
    assert runtime.resolve_mixed_precision("auto", "cpu")[0] == "bf16"
    cpu_bf16(False)
    precision, reason = runtime.resolve_mixed_precision("auto", "cpu")
    assert precision == "no" and "no native bf16" in reason


def test_a_oneDNN_isa_limit_below_bf16_counts_as_not_native(cpu_bf16, monkeypatch):
    cpu_bf16(True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")  # how an AVX2-only host is emulated on a newer one
    assert not runtime.native_bf16("cpu")
    assert runtime.resolve_mixed_precision("auto", "cpu")[0] == "no"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert runtime.native_bf16("cpu")


def test_kernels_limited_to_avx2_count_as_not_native(cpu_bf16, monkeypatch):
    cpu_bf16(True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # ATEN_CPU_CAPABILITY=avx2
    assert not runtime.native_bf16("cpu")


def test_explicit_bf16_on_an_emulating_cpu_is_kept_with_a_warning(cpu_bf16):
    cpu_bf16(False)
    with pytest.warns(RuntimeWarning, match="no native bf16"):
        assert runtime.resolve_mixed_precision("bf16", "cpu")[0] == "bf16"


def test_bad_precisions_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        runtime.resolve_mixed_precision("fp16", "cpu")
    with pytest.raises(ValueError, match="'fp8'"):
        runtime.resolve_mixed_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="mixed_precision"):
        TrainingConfig(output_dir="x", mixed_precision="fp8")
    with pytest.raises(ValueError, match="time_budget"):
        TrainingConfig(output_dir="x", time_budget=0)


def test_training_defaults_to_auto_precision():
    assert TrainingConfig(output_dir="x").mixed_precision == "auto"


def _fresh_python(code: str, env: dict[str, str] | None = None) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GOMP_", "OMP_", "MALLOC_"))}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**clean, **(env or {})}
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


CONFIGURE = """
import json, os
from itune_hf.utils.runtime import configure_cpu_runtime, set_openmp_environment, available_cpus
set_openmp_environment()
state = configure_cpu_runtime()
import torch
print(json.dumps({"spin": os.environ.get("GOMP_SPINCOUNT"), "allocator": state.allocator,
                  "threads": torch.get_num_threads(), "cpus": available_cpus(), "text": state.describe()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator settings")
def test_cpu_runtime_shortens_spinning_keeps_freed_memory_and_uses_the_available_cpus():
    state = _fresh_python(CONFIGURE)
    assert state["spin"] == runtime.OMP_SPIN_COUNT
    assert state["allocator"].startswith("freed memory kept for reuse")
    assert state["threads"] == state["cpus"] >= 1
    assert f"{state['threads']} CPU threads" in state["text"]


def test_cpu_runtime_leaves_the_users_own_settings_alone():
    state = _fresh_python(CONFIGURE, {"OMP_WAIT_POLICY": "ACTIVE", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"})
    assert state["spin"] is None
    assert state["allocator"] == "allocator as set in the environment"
    assert state["threads"] == 1


def test_accelerate_launchs_mixed_precision_wins_over_auto_and_an_explicit_choice_wins_over_it(cpu_bf16, monkeypatch):
    from itune_hf.training.accelerator import _choose_runtime

    cpu_bf16(True)  # auto alone would pick bf16
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # what `accelerate launch --mixed_precision no` sets
    precision, note = _choose_runtime(TrainingConfig(output_dir="x", mixed_precision="auto"))
    assert precision == "no" and "accelerate launch's --mixed_precision no" in note
    assert _choose_runtime(TrainingConfig(output_dir="x", mixed_precision="bf16"))[0] == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    with pytest.raises(ValueError, match="accelerate launch --mixed_precision fp8 .*itune trains in no, bf16, fp16"):
        _choose_runtime(TrainingConfig(output_dir="x"))
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert _choose_runtime(TrainingConfig(output_dir="x"))[0] == "bf16"
