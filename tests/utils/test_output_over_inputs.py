"""No command's output directory may be one of its inputs, or hold one: `--overwrite` would delete the input (a
trained model, a dataset.json and its images) and a write could replace it. Refused before anything is written or
removed, naming the input; a new folder inside an input's folder is fine."""

from __future__ import annotations

import os

import pytest

from itune_hf.cli import main
from itune_hf.utils.output_dirs import OutputOverInputError, refuse_output_over_inputs


def entries(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_eval_refuses_to_write_over_the_model_it_evaluates(captioner_dirs, world, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(captioner_dirs["full"], model)
    before = entries(model)
    argv = ["eval", "--model", str(model), "--data", str(world), "--split", "test", "--output-dir", str(model)]
    assert main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--output-dir {model} is the command's input {model}" in err[0]
    assert entries(model) == before


def test_cache_features_refuses_the_folder_that_holds_its_data(world, tmp_path, capsys):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(world.parent, data)
    before = entries(data)
    argv = ["cache-features", "--preset", "itune-tiny-random", "--data", str(data / "dataset.json")]
    assert main([*argv, "--output-dir", str(data), "--overwrite"]) == 2
    assert f"contains the command's input {data / 'dataset.json'}" in capsys.readouterr().err
    assert entries(data) == before
    assert main([*argv, "--output-dir", str(data / "features")]) == 0  # a new folder inside the data's folder


def test_the_rule_resolves_paths_and_skips_names_that_are_not_on_disk(tmp_path):
    (tmp_path / "run" / "data").mkdir(parents=True)
    (tmp_path / "run" / "data" / "dataset.json").write_text("{}")
    os.symlink(tmp_path / "run", tmp_path / "link")
    with pytest.raises(OutputOverInputError, match="contains the command's input"):
        refuse_output_over_inputs(tmp_path / "link", [tmp_path / "run" / "data" / "dataset.json"])
    with pytest.raises(OutputOverInputError, match="is the command's input"):
        refuse_output_over_inputs(tmp_path / "run" / ".." / "run", [tmp_path / "link"])
    refuse_output_over_inputs(tmp_path / "run" / "data" / "new", [tmp_path / "run" / "data" / "dataset.json"])
    refuse_output_over_inputs(tmp_path / "out", ["itune-tiny-random", "org/model", None, ""])
