"""Training checkpoints (`itune_hf.training.checkpoints`): a damaged checkpoint is found by its checksums and
`--resume` falls back to the last sound one (or refuses when none is); a resumed run keeps the settings it was saved
with (a run saved by an older itune_hf included) and trains on to a larger `--max-steps`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from itune_hf.cli import main

pytestmark = [  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them
    pytest.mark.slow,
    pytest.mark.usefixtures("fresh_accelerator_state"),  # runs `itune train` in-process
]

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]
TINY += ["--eval-split", "none", "--mixed-precision", "no"]


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory) -> Path:
    """A 4-step run with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("state-run") / "run"
    assert main(["train", "--output-dir", str(out), "--data", str(world), *TINY, "--max-steps", "4",
                 "--save-every", "2"]) == 0  # fmt: skip
    return out


def test_resume_falls_back_from_a_damaged_checkpoint_and_refuses_when_none_is_sound(trained, world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    straight = (run / "adapter_model.safetensors").read_bytes()
    newest = run / "checkpoints" / "step-0000004"
    states = newest / "random_states_0.pkl"
    states.write_bytes(states.read_bytes()[:100])  # truncated RNG states: bit-exact resume would be lost
    common = ["train", "--output-dir", str(run), "--data", str(world), *TINY, "--max-steps", "4", "--save-every", "2"]
    capsys.readouterr()
    assert main([*common, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "step-0000004 is damaged (random_states_0.pkl has 100 bytes" in err and "resuming from step-0000002" in err
    assert (run / "adapter_model.safetensors").read_bytes() == straight  # steps 3-4 again, bit for bit

    for checkpoint in (run / "checkpoints").iterdir():  # foreign (here: empty) weights in every checkpoint
        (checkpoint / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert main([*common, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint in" in err and "is sound" in err and "model.safetensors has 16 bytes" in err


def test_a_resumed_run_keeps_the_training_defaults_it_was_saved_with():
    """The preset's or family's defaults may change between versions (xgpt-demo's learning rate did): a resume that
    does not give them continues with the saved run's; one that gives another value is refused."""
    import dataclasses

    from itune_hf.training.checkpoints import _check_resume_settings
    from itune_hf.training.config import TrainingConfig, describe_training_defaults

    saved = dataclasses.asdict(TrainingConfig(preset="xgpt-demo", output_dir="run", learning_rate=1e-4))
    saved.update(weight_decay=0.01, adam_beta2=0.999)  # what an older itune_hf recorded for an XGPT run
    del saved["warmup_steps"]  # and a setting it did not record at all: its built-in default
    config = TrainingConfig(preset="xgpt-demo", output_dir="run", resume=True)
    assert (config.learning_rate, config.weight_decay, config.warmup_steps) == (1e-3, 0.0, 10)
    _check_resume_settings(config, saved)
    assert (config.learning_rate, config.weight_decay, config.adam_beta2, config.warmup_steps) == (1e-4, 0.01, 0.999, 0)
    assert "learning_rate 0.0001 (the resumed run)" in describe_training_defaults(config)
    given = TrainingConfig(preset="xgpt-demo", output_dir="run", resume=True, learning_rate=5e-4)
    with pytest.raises(ValueError, match="learning_rate: 0.0001 -> 0.0005"):
        _check_resume_settings(given, saved)


def test_resume_of_a_run_saved_before_newer_options_existed_is_not_refused():
    """A run written by an older itune_hf lacks the newer resume invariants (e.g. `tasks`, `shuffle_buffer`): they
    count as their defaults, so an upgrade never blocks `--resume`; a real change is still refused."""
    import dataclasses

    from itune_hf.training.checkpoints import _check_resume_settings
    from itune_hf.training.config import TrainingConfig

    config = TrainingConfig(preset="itune-tiny-random", output_dir="run", resume=True)
    saved = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("tasks", "shuffle_buffer", "adam_beta2")}
    _check_resume_settings(config, saved)  # nothing recorded differs
    with pytest.raises(ValueError, match="shuffle_buffer: 1000 -> 7"):
        _check_resume_settings(dataclasses.replace(config, shuffle_buffer=7), saved)


def test_resume_with_a_larger_max_steps_trains_on_and_says_so(world, tmp_path, capsys):
    """Training longer is the common reason to resume: a larger --max-steps goes on from the last checkpoint."""
    from conftest import train_tiny_adapter

    run = train_tiny_adapter(world, tmp_path / "run", steps=2)
    capsys.readouterr()
    args = ["train", "--output-dir", str(run), "--data", str(world), *TINY, "--save-every", "2"]
    assert main([*args, "--resume", "--max-steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "--resume with --max-steps 4, more than the run's 2: training on from step 2 to step 4" in out
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == 4 and [h["step"] for h in summary["history"] if "loss" in h][-1] == 4
    assert main([*args, "--resume", "--max-steps", "3"]) == 2  # fewer steps than the run has: still refused
    assert "max_steps: 4 -> 3" in capsys.readouterr().err


def test_the_first_step_past_the_old_length_takes_the_stretched_schedules_rate(world, tmp_path):
    """The 2-step run's schedule ends at a rate of 0, which its checkpoint's optimizer holds: the resumed step 3 must
    take the 3-step schedule's rate (the weights move), not that one."""
    from safetensors.torch import load_file

    from conftest import train_tiny_adapter

    run = train_tiny_adapter(world, tmp_path / "run", steps=2)
    before = load_file(run / "adapter_model.safetensors")
    args = ["train", "--output-dir", str(run), "--data", str(world), *TINY, "--save-every", "1", "--resume"]
    assert main([*args, "--max-steps", "3"]) == 0
    after = load_file(run / "adapter_model.safetensors")
    assert any(not torch.equal(before[key], after[key]) for key in before)


def test_resume_refuses_random_states_it_cannot_read_and_says_what_differs_without_them(
    trained, world, tmp_path, capsys
):
    import pickle

    from itune_hf.training.checkpoints import write_manifest

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    newest = run / "checkpoints" / "step-0000004"
    states = newest / "random_states_0.pkl"
    # intact on disk (its manifest agrees) but refused by Accelerate's safe loader, as a numpy 1.x pickle is
    states.write_bytes(pickle.dumps({"random_state": pickle.PicklingError("not a tensor")}))
    write_manifest(newest)
    common = ["train", "--output-dir", str(run), "--data", str(world), *TINY, "--max-steps", "4", "--save-every", "2"]
    capsys.readouterr()
    assert main([*common, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{states}: the random states cannot be read" in err[0] and "delete the file" in err[0]
    states.unlink()  # the user's choice: resume anyway
    write_manifest(newest)
    assert main([*common, "--resume"]) == 0
    assert f"note: {states} is missing: resuming with fresh random states" in capsys.readouterr().err


def test_a_checkpoint_the_file_system_refuses_is_one_line_naming_it_and_the_cause(world, tmp_path):
    """A file-size limit (`ulimit -f`, what a full disk or a quota does to a writer, at a small scale): torch's
    `unexpected pos` traceback before; now one line naming the checkpoint and EFBIG, no half-written checkpoint."""
    import resource
    import signal
    import subprocess
    import sys

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))

    itune = str(Path(sys.executable).with_name("itune"))
    argv = [itune, "train", "--output-dir", str(tmp_path / "run"), "--data", str(world), *TINY, "--max-steps", "4",
            "--save-every", "2"]  # fmt: skip
    result = subprocess.run(argv, preexec_fn=limited, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"itune train: error: {tmp_path / 'run' / 'checkpoints' / 'step-0000002.partial'}: could not"
    )
    assert "EFBIG" in last and "Traceback" not in result.stderr
    assert not list((tmp_path / "run" / "checkpoints").glob("*.partial"))


def test_a_feature_cache_shard_the_file_system_refuses_is_one_line_naming_it(world, tmp_path):
    import resource
    import signal
    import subprocess
    import sys

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3_000, 3_000))

    itune = str(Path(sys.executable).with_name("itune"))
    argv = [itune, "cache-features", "--preset", "itune-tiny-random", "--data", str(world), "--output-dir",
            str(tmp_path / "cache")]  # fmt: skip
    result = subprocess.run(argv, preexec_fn=limited, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]  # on a line of its own: the progress bar is closed first
    assert last.startswith(f"itune cache-features: error: {tmp_path / 'cache'}/shard-00000.partial: could not be "
                           "written (EFBIG"), result.stderr[-2000:]  # fmt: skip


def test_a_final_model_save_that_fails_loses_no_step(world, tmp_path, monkeypatch, capsys):
    """The last checkpoint is written before the final model: a save that fails there (a full disk) leaves the
    run's last step in a checkpoint that `--resume` finishes from."""
    import errno

    from itune_hf.training import validation

    run = tmp_path / "run"
    common = ["train", "--output-dir", str(run), "--data", str(world), *TINY, "--max-steps", "2", "--save-every", "2"]

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "model.safetensors"))

    real_save = validation.BestModel.save
    monkeypatch.setattr(validation.BestModel, "save", full_disk)
    assert main(common) == 2
    assert "no space left on device" in capsys.readouterr().err
    assert (run / "checkpoints" / "step-0000002").is_dir()  # the last step is kept
    monkeypatch.setattr(validation.BestModel, "save", real_save)
    assert main([*common, "--resume"]) == 0
    assert (run / "adapter_model.safetensors").is_file()
