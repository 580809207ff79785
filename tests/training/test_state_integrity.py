"""Never silently wrong, never stuck: checksummed checkpoints, atomic state files, feature-cache identity and
healing, output-directory locks, and `make-synthetic` swaps (issue 18 items 4-7, 9-11; issue 15 items 2-3)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from itune_hf.cli import main
from itune_hf.data.synthetic import make_synthetic
from itune_hf.utils import files as _io

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: make test-fast skips them

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]
TINY += ["--eval-split", "none", "--mixed-precision", "no"]


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    """In-process runs here set Accelerate's process-wide state (precision): later tests must start from none."""
    yield
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    GradientState._reset_state()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("state-world")
    return make_synthetic(root / "data", num_images=12, seed=0, image_size=32)


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


def test_state_files_are_written_atomically(tmp_path, monkeypatch):
    target = tmp_path / "failed.json"
    _io.atomic_write_json(target, {"old": 1})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed during the write")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        _io.atomic_write_json(target, {"new": 2})
    assert json.loads(target.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["failed.json"]  # no temporary file left behind


def test_a_kill_mid_save_leaves_the_saved_captioner_whole(captioner_dirs, tmp_path, monkeypatch):
    # issue 33: the card/adapter saves wrote in place (a kill after the weights left new weights, an old card)
    import torch

    from itune_hf.hub import save_captioner
    from itune_hf.models.loading import load_captioner

    target = tmp_path / "model"
    shutil.copytree(captioner_dirs["full"], target)
    before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    model, processor = load_captioner(target)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # other weights: a save would change model.safetensors

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed after the weights were written")

    monkeypatch.setattr(type(processor), "save_pretrained", killed)
    with pytest.raises(KeyboardInterrupt):
        save_captioner(model, target, processor=processor, card="new card")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before
    assert not list(target.glob(".staging-*"))
    save_captioner(model, target, processor=processor, card="new card")
    assert (target / "README.md").read_text() == "new card"
    assert (target / "model.safetensors").read_bytes() != before["model.safetensors"]


def cache_features_cli(world: Path, cache: Path, *extra: str) -> int:
    return main(["cache-features", "--preset", "itune-tiny-random", "--data", str(world), "--output-dir", str(cache),
                 "--dtype", "float32", "--shard-size", "4", *extra])  # fmt: skip


def test_readme_route_cache_train_eval_with_the_cache(world, tmp_path):
    cache, run = tmp_path / "cache", tmp_path / "run"
    assert cache_features_cli(world, cache) == 0
    assert main(["train", "--output-dir", str(run), "--data", str(world), *TINY, "--max-steps", "2",
                 "--feature-cache", str(cache)]) == 0  # fmt: skip
    evaluate = ["eval", "--model", str(run), "--data", str(world), "--split", "test", "--feature-cache", str(cache)]
    evaluate += ["--num-beams", "1", "--max-new-tokens", "3", "--metrics", "cider"]
    evaluate += ["--output-dir", str(tmp_path / "eval")]
    assert main(evaluate) == 0
    assert (tmp_path / "eval" / "metrics.json").is_file()


def test_a_cache_of_another_dataset_is_refused_by_train_and_recomputed_by_cache_features(world, tmp_path, capsys):
    other = make_synthetic(tmp_path / "other", num_images=12, seed=1, image_size=32)  # same ids, other images
    cache = tmp_path / "cache"
    assert cache_features_cli(other, cache) == 0
    common = ["train", "--output-dir", str(tmp_path / "run"), "--data", str(world), *TINY, "--max-steps", "1"]
    capsys.readouterr()
    assert main([*common, "--feature-cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "holds states of other image files" in err and str(world.parent / "images") in err

    assert cache_features_cli(world, cache) == 0  # the entries are computed again from this dataset's files
    assert "computed from other image files and were computed again" in capsys.readouterr().out
    assert main([*common, "--feature-cache", str(cache)]) == 0


def test_a_missing_or_damaged_shard_heals_and_bad_images_are_reported_by_path(world, tmp_path, capsys):
    from itune_hf.vision.feature_cache import FeatureCache

    data = tmp_path / "data"
    shutil.copytree(world.parent, data)
    cache = tmp_path / "cache"
    assert cache_features_cli(data / "dataset.json", cache) == 0  # 12 images: shards 0, 1, 2
    (cache / "shard-00001.safetensors").unlink()  # a lost middle shard
    (cache / "shard-00002.safetensors").write_bytes(b"\x00" * 20)  # a truncated one
    entries = json.loads((data / "dataset.json").read_text())["images"]
    broken = data / entries[0]["filepath"] / entries[0]["filename"]
    cached_ids = FeatureCache(cache).image_ids()
    broken.write_bytes(b"not a png")  # its cached entry no longer matches; it is computed again and fails
    capsys.readouterr()
    assert cache_features_cli(data / "dataset.json", cache) == 1
    out, err = capsys.readouterr()
    assert "shard-00002.safetensors is damaged" in err and str(broken) in err and "1 image(s) could not be read" in err
    healed = FeatureCache(cache)
    assert not healed.damaged and len(healed) == 12 and set(cached_ids) <= set(healed.image_ids())
    failed = json.loads((cache / "failed.json").read_text())
    assert [entry["path"] for entry in failed.values()] == [str(broken)]


def test_an_output_dir_is_locked_by_its_run_and_foreign_files_are_not_written_over(world, tmp_path, capsys):
    import subprocess
    import sys

    from itune_hf.training.checkpoints import LOCK_NAME

    out = tmp_path / "run"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    common = ["train", "--output-dir", str(out), "--data", str(world), *TINY, "--max-steps", "1"]
    capsys.readouterr()
    assert main(common) == 2
    assert "holds files no training run wrote (README.md)" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "my notes"

    (out / "README.md").unlink()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live run's process
    try:
        (out / LOCK_NAME).write_text(json.dumps({"pid": other.pid, "host": os.uname().nodename, "started": "x"}))
        assert main(common) == 2
        assert f"in use by a training run (pid {other.pid}" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
    assert main(common) == 0  # its process is gone: the stale lock is taken over
    assert f"from a run that is gone (pid {other.pid})" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists()
    assert main([*common, "--overwrite"]) == 0
    assert "--overwrite: removing 1 checkpoint(s) of the previous run" in capsys.readouterr().err


def _listed_images(dataset_json: Path) -> dict[str, bytes]:
    entries = json.loads(dataset_json.read_text())["images"]
    return {e["filename"]: (dataset_json.parent / e["filepath"] / e["filename"]).read_bytes() for e in entries}


def test_interrupted_make_synthetic_never_leaves_a_mixed_dataset_and_never_follows_a_link(tmp_path, monkeypatch):
    from itune_hf.data import _output

    out, fresh = tmp_path / "out", tmp_path / "fresh"
    args = ["make-synthetic", "--num-images", "6", "--image-size", "32"]
    assert main([*args, "--output-dir", str(out), "--seed", "0"]) == 0
    old = _listed_images(out / "dataset.json")
    assert main([*args, "--output-dir", str(fresh), "--seed", "1"]) == 0
    new = _listed_images(fresh / "dataset.json")
    assert old != new

    real_replace, calls = os.replace, []

    def killed_midway(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # the marker and two new images are in: killed before the third
            raise KeyboardInterrupt("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(_output.os, "replace", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--output-dir", str(out), "--seed", "1"])
    monkeypatch.setattr(_output.os, "replace", real_replace)
    assert not (out / "dataset.json").exists()  # no index that lists half of the new images
    assert main([*args, "--output-dir", str(out), "--seed", "1"]) == 0  # a rerun completes it
    assert _listed_images(out / "dataset.json") == new and not (out / ".dataset.json.replacing").exists()

    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(out / "images")
    (out / "images").symlink_to(outside)
    with pytest.raises(ValueError, match="images is a symbolic link"):
        make_synthetic(out, num_images=6, seed=2, image_size=32)
    assert not any(outside.iterdir())


def test_the_fingerprint_ignores_how_a_processor_was_saved_but_not_what_changes_pixels():
    from itune_hf.presets import build_model, build_processor
    from itune_hf.vision.feature_cache import vision_fingerprint

    vision = build_model("itune-tiny-random", pretrained=True).vision_model
    processor = build_processor("itune-tiny-random").image_processor
    before = vision_fingerprint(vision, processor, "float32")
    processor.auto_map = {"AutoImageProcessor": "processing_ituning.X"}  # what a save_pretrained round trip adds
    processor._processor_class = "ITuningProcessor"
    assert vision_fingerprint(vision, processor, "float32") == before
    processor.image_mean = [0.5, 0.5, 0.5]
    changed = vision_fingerprint(vision, processor, "float32")
    assert changed["image_processor_sha256"] != before["image_processor_sha256"]


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


# ------------------------------------------------------------------------------------------------------------------
# Issue 33: a diverging run stops on its first non-finite loss; a signal saves a checkpoint and says how to resume
# ------------------------------------------------------------------------------------------------------------------
def test_a_diverging_run_stops_at_its_first_non_finite_loss_and_keeps_the_last_good_checkpoint(
    world, tmp_path, capsys, monkeypatch
):
    from itune_hf.training import loop

    out = tmp_path / "run"
    common = ["train", "--output-dir", str(out), "--data", str(world), *TINY, "--max-steps", "6", "--save-every", "1"]
    capsys.readouterr()
    assert main([*common, "--learning-rate", "1e308"]) == 2  # was: NaN weights, exit 0
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
    assert main(common) == 130  # was: a KeyboardInterrupt traceback, no checkpoint
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
    assert status == 143, err[-2000:]  # was: 143 with nothing said, no checkpoint at the interrupt
    assert "interrupted (SIGTERM) at step" in err and "--resume" in err and "Traceback" not in err
    step = int(err.split("interrupted (SIGTERM) at step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"step-{step:07d}" / "manifest.json").is_file()


def test_cache_features_takes_the_lock_refuses_a_foreign_directory_and_non_finite_states(world, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from itune_hf.errors import InputError
    from itune_hf.vision.feature_cache import FeatureCache

    from conftest import held_by_a_live_process

    cache = tmp_path / "cache"
    with held_by_a_live_process(cache, "itune cache-features") as pid:
        assert cache_features_cli(world, cache) == 2  # was: two writers, same-named shards overwritten
    assert f"in use by itune cache-features (pid {pid}" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert cache_features_cli(world, tmp_path / "mine") == 2
    assert "holds files itune cache-features did not write (notes.txt)" in capsys.readouterr().err
    assert cache_features_cli(world, cache) == 0
    shard = cache / "shard-00000.safetensors"
    metadata = safe_open(str(shard), "pt").metadata()
    states = load_file(shard)["states"]
    states[0, 0, 0] = float("nan")
    save_file({"states": states}, str(shard), metadata=metadata)
    loaded = FeatureCache(cache)
    with pytest.raises(InputError, match="hold NaN or infinite values"):
        loaded.get(loaded.image_ids()[:2])


def test_a_lock_on_a_disk_turned_read_only_is_released_without_an_error(tmp_path, monkeypatch):
    # issue 33: a disk turning read-only mid-train added an atexit traceback (the lock's unlink) to the one line
    import errno

    from itune_hf.utils.output_dirs import OutputLock

    lock = OutputLock(tmp_path / "run").acquire()

    def read_only(self, missing_ok=False):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    lock.release()
    assert not lock.held


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
