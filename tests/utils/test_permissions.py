"""What the project writes gets the permissions `open()` and `mkdir()` would give it (0666 / 0777 less the umask),
not the 0600 / 0700 of temporary files and safetensors: another user or a container with another uid can read a
model or a dataset it wrote, and a umask of 077 still keeps them private."""

from __future__ import annotations

import os
import stat

import pytest

from itune_hf import build_model
from itune_hf.data import make_synthetic
from itune_hf.hub import save_captioner
from itune_hf.utils.files import atomic_write_json


def modes(root) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_datasets_models_and_json_files_follow_the_umask(tmp_path, mask):
    previous = os.umask(mask)
    try:
        make_synthetic(tmp_path / "world", num_images=6, seed=0, image_size=32)
        save_captioner(build_model("itune-tiny-random"), tmp_path / "model")
        atomic_write_json(tmp_path / "state.json", {"step": 1})
    finally:
        os.umask(previous)
    written = {**modes(tmp_path / "world"), **modes(tmp_path / "model"), "state.json": modes(tmp_path)["state.json"]}
    assert "model.safetensors" in written and "dataset.json" in written
    for name, mode in written.items():
        expected = 0o777 if (tmp_path / "world" / name).is_dir() or (tmp_path / "model" / name).is_dir() else 0o666
        assert mode == expected & ~mask, (name, oct(mode))
