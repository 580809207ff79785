"""Precision, threads and allocator chosen for the hardware; time budgets sized from a measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from itune_hf.commands.demo import EvaluationCost, training_seconds
from itune_hf.training import TimeBudget, TrainingConfig, steps_within_budget
from itune_hf.training.accelerator import make_scheduler, stretch_scheduler
from itune_hf.training.budget import WARM_STEPS
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


def test_steps_within_budget():
    assert steps_within_budget(100.0, 2.0, 200) == 50
    assert steps_within_budget(100.0, 2.0, 30) == 30  # never more than asked for
    assert steps_within_budget(1.0, 2.0, 30) == 1  # at least one step
    assert steps_within_budget(100.0, 0.0, 30) == 30


def test_time_budget_counts_only_unpaused_time(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("itune_hf.training.budget.time.perf_counter", lambda: now[0])
    budget = TimeBudget(10.0)
    now[0] = 11.0
    assert not budget.overrun()  # within the 20% tolerance
    with budget.paused():
        now[0] = 100.0  # validation: not counted
    assert not budget.overrun()
    now[0] = 101.5
    assert budget.overrun()
    assert not TimeBudget(None).overrun()


def test_time_budget_fits_the_run_to_its_own_timed_steps(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("itune_hf.training.budget.time.perf_counter", lambda: now[0])
    budget = TimeBudget(100.0, resize_at=10, max_steps=1000)
    lengths = []
    for step in range(1, 11):
        now[0] += 5.0 if step <= WARM_STEPS else 2.0  # the first steps are slow; the rest take 2 s
        with budget.paused():
            now[0] += 50.0  # validation: not counted
        lengths.append(budget.fitted_length(step))
    assert lengths[:-1] == [None] * 9
    # 10 + 26 + 16 = 26 s spent at step 10, 74 s left at 2 s a step: 37 more
    assert lengths[-1] == 47 and budget.measured == pytest.approx(2.0)
    assert budget.fitted_length(11) is None  # once only
    assert TimeBudget(100.0, resize_at=10, max_steps=20).fitted_length(10) is None  # its warm-up was not timed


def test_time_budget_fitting_keeps_to_max_steps_and_ends_a_run_over_its_budget(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("itune_hf.training.budget.time.perf_counter", lambda: now[0])
    quick, slow = TimeBudget(100.0, resize_at=4, max_steps=20), TimeBudget(10.0, resize_at=4, max_steps=20)
    for step in range(1, 5):
        now[0] += 4.0
        fitted = quick.fitted_length(step), slow.fitted_length(step)
    assert fitted == (20, 4)  # never past max_steps; 16 s of a 10 s budget spent: the run ends at this step
    assert TimeBudget(None, resize_at=4, max_steps=20).fitted_length(4) is None
    assert TimeBudget(100.0, resize_at=None, max_steps=20).fitted_length(4) is None  # a resumed run keeps its length


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_a_stretched_schedule_continues_as_one_planned_with_that_length(schedule):
    config = TrainingConfig(output_dir="x", warmup_steps=10, lr_schedule=schedule, learning_rate=1e-3)

    def rates(scheduler, steps):
        out = []
        for _ in range(steps):
            scheduler.optimizer.step()
            scheduler.step()
            out.append(scheduler.get_last_lr()[0])
        return out

    def optimizer():
        return torch.optim.AdamW([torch.zeros(2, requires_grad=True)], lr=config.learning_rate)

    planned = make_scheduler(config, optimizer(), 40)
    stretched = make_scheduler(config, optimizer(), 200)
    assert rates(stretched, 10) == rates(planned, 10)  # the warm-up does not depend on the length
    stretch_scheduler(stretched, config, 40)
    assert rates(stretched, 30) == pytest.approx(rates(planned, 30))
    assert stretched.optimizer.param_groups[0]["lr"] == pytest.approx(planned.optimizer.param_groups[0]["lr"])


def test_demo_reserves_evaluation_time_before_sizing_training():
    cost = EvaluationCost(load=5.0, greedy_per_image=0.1, beam_per_image=0.3)
    # 540 - 100 spent - (2 x 5 load + 100 x 0.1 greedy + 2 x 100 x 0.3 beam) = 360, 90% of it for training
    assert training_seconds(540.0, 100.0, cost, val_images=100, test_images=100) == pytest.approx(324.0)
    assert training_seconds(540.0, 500.0, cost, val_images=100, test_images=100) == 0.0
    slower = EvaluationCost(load=5.0, greedy_per_image=0.2, beam_per_image=0.6)
    assert training_seconds(540.0, 100.0, slower, val_images=100, test_images=100) < 324.0


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
