"""How the training loop (`itune_hf.training.loop`) stops before its last step: a diverging run stops at its first
non-finite loss and keeps the last good checkpoint; Ctrl-C (SIGINT) or SIGTERM saves a checkpoint at the interrupt
and prints how to resume."""

from __future__ import annotations

import os

import pytest

from itune_hf.cli import main

pytestmark = [  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them
    pytest.mark.slow,
    pytest.mark.usefixtures("fresh_accelerator_state"),  # runs `itune train` in-process
]

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]
TINY += ["--eval-split", "none", "--mixed-precision", "no"]


def test_a_diverging_run_stops_at_its_first_non_finite_loss_and_keeps_the_last_good_checkpoint(
    world, tmp_path, capsys, monkeypatch
):
    from itune_hf.training import loop

    out = tmp_path / "run"
    common = ["train", "--output-dir", str(out), "--data", str(world), *TINY, "--max-steps", "6", "--save-every", "1"]
    capsys.readouterr()
    assert main([*common, "--learning-rate", "1e308"]) == 2  # not NaN weights with exit 0
    err = capsys.readouterr().err
    assert "error: step 1: 16 trainable weight tensor(s) hold NaN or infinite values" in err and "Traceback" not in err
    assert not (out / "checkpoints").exists() and not (out / "adapter_model.safetensors").exists()

    real, calls = loop._train_micro_batch, []

    def nan_at_the_third(*args, **kwargs):
        calls.append(1)
        losses = real(*args, **kwargs)
        return {"loss": float("nan")} if len(calls) == 3 else losses

    monkeypatch.setattr(loop, "_train_micro_batch", nan_at_the_third)
    assert main([*common, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "error: step 3: the training loss or its gradient is not finite (loss nan) (the run diverged)" in err
    assert f"the last good checkpoint, {out / 'checkpoints' / 'step-0000002'}, is kept" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000001", "step-0000002"]
    assert not (out / ".itune-train.lock").exists()


def test_an_fp16_loss_scale_overflow_skips_the_step_as_trainer_does_instead_of_stopping(world, tmp_path, monkeypatch):
    """fp16's dynamic loss scale overflows at the start (and after each growth): the scaler skips those steps and
    lowers the scale. Accelerate's fp16 path on a CPU stand-in: a GradScaler whose first scales overflow."""
    import json

    import torch

    from itune_hf.training import loop

    real, scales = loop.make_accelerator, []

    def with_an_overflowing_scaler(config):
        accelerator, precision, note = real(config)
        accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
        accelerator.native_amp, accelerator.state._mixed_precision = True, "fp16"  # (unscaled in clip_grad_norm_)
        scales.append(accelerator.scaler)
        return accelerator, precision, note

    monkeypatch.setattr(loop, "make_accelerator", with_an_overflowing_scaler)
    out = tmp_path / "run"
    assert main(["train", "--output-dir", str(out), "--data", str(world), *TINY, "--max-steps", "3"]) == 0
    assert scales[0].get_scale() == 2.0**124  # three overflows, each step skipped and the scale halved
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 3


def test_ctrl_c_saves_a_checkpoint_at_the_interrupt_and_prints_the_resume_line(world, tmp_path, capsys, monkeypatch):
    import signal

    from itune_hf.training import loop

    real, calls = loop._train_micro_batch, []

    def interrupted_at_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the third step runs
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "_train_micro_batch", interrupted_at_the_third)
    out = tmp_path / "run"
    common = ["train", "--output-dir", str(out), "--data", str(world), *TINY, "--max-steps", "50"]
    capsys.readouterr()
    assert main(common) == 130  # no KeyboardInterrupt traceback
    err = capsys.readouterr().err
    assert f"interrupted (SIGINT) at step 3; checkpoint {out / 'checkpoints' / 'step-0000003'} is saved" in err
    assert "continue with: itune train --output-dir" in err and "--max-steps 50 --resume\n" in err
    assert (out / "checkpoints" / "step-0000003" / "manifest.json").is_file()


def test_sigterm_saves_a_checkpoint_and_exits_143(world, tmp_path):
    import signal
    import sys

    from conftest import kill_once_checkpointed

    out = tmp_path / "run"
    command = [sys.executable, "-m", "itune_hf.cli", "train", "--output-dir", str(out), "--data", str(world), *TINY,
               "--max-steps", "2000", "--save-every", "1"]  # fmt: skip
    status, err = kill_once_checkpointed(command, out / "checkpoints" / "step-0000001", signum=signal.SIGTERM)
    assert status == 143, err[-2000:]  # said, with a checkpoint at the interrupt
    assert "interrupted (SIGTERM) at step" in err and "--resume" in err and "Traceback" not in err
    step = int(err.split("interrupted (SIGTERM) at step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"step-{step:07d}" / "manifest.json").is_file()
