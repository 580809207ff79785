"""Never silently wrong, never stuck: checksummed checkpoints, atomic state files, feature-cache identity and
healing, output-directory locks, and `make-synthetic` swaps (issue 18 items 4-7, 9-11; issue 15 items 2-3)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from itune_hf import _io
from itune_hf.cli import main
from itune_hf.data.synthetic import make_synthetic

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]
TINY += ["--eval-split", "none", "--mixed-precision", "no"]


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
