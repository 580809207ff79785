"""Atomic writes (`itune_hf.utils.files`): a state file killed mid-write keeps its old content and leaves no
temporary file; a saved captioner killed mid-save (staged as a whole) is left as it was."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from itune_hf.utils import files as _io

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them


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
    # the folder is staged whole: a kill after the weights must not leave new weights beside an old card
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
