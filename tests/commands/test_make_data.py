"""`itune make-synthetic`, `itune make-photos` and `itune make-clipart` run as a user runs them (the console script, in
a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from itune_hf.cli import COMMANDS, build_parser, main

ITUNE = Path(sys.executable).parent / "itune"


def itune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ITUNE), *args], capture_output=True, text=True, timeout=300)


def test_commands_are_registered():
    assert COMMANDS["make-synthetic"] == "make_synthetic" and COMMANDS["make-photos"] == "make_photos"
    assert COMMANDS["make-clipart"] == "make_clipart"
    args = build_parser().parse_args(["make-synthetic", "--output-dir", "x"])
    assert (args.num_images, args.seed, args.image_size, args.overwrite) == (2000, 0, 64, False)


def test_make_synthetic_writes_prints_and_refuses_to_clobber(tmp_path):
    out = tmp_path / "world"
    result = itune(
        "make-synthetic", "--output-dir", str(out), "--num-images", "40", "--seed", "3", "--image-size", "48"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"wrote {out / 'dataset.json'} (40 images")
    assert lines[1] == "images per split: train 32, val 4, test 4"
    assert lines[2] == f"use it with: --data {out / 'dataset.json'} --image-root {out}"
    data = json.loads((out / "dataset.json").read_text())
    assert data["generator"]["seed"] == 3 and data["generator"]["image_size"] == 48
    assert len(list((out / "images").glob("*.png"))) == 40

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("do not lose")
    refused = itune("make-synthetic", "--output-dir", str(tmp_path / "mine"), "--num-images", "5")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"itune make-synthetic: error: {tmp_path / 'mine'}: directory is not empty and is not a previous itune "
        "make-synthetic output; choose a new directory or pass --overwrite (files of the same names are replaced, "
        "other files are kept)"
    ]
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["thesis.tex"]


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    for flag, value, expected in [("--image-size", "8", "from 24 to 1024"), ("--num-images", "0", ">= 1")]:
        with pytest.raises(SystemExit) as refused:  # refused while parsing, by the option's type
            main(["make-synthetic", "--output-dir", str(tmp_path / "tiny"), flag, value])
        assert refused.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last == f"itune make-synthetic: error: argument {flag}: expected an integer {expected}, got '{value}'"
    assert not (tmp_path / "tiny").exists()


def test_make_photos_writes_the_test_split(tmp_path):
    out = tmp_path / "photos"
    result = itune("make-photos", "--output-dir", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "dataset.json").read_text())
    assert f"images per split: test {len(data['images'])}" in result.stdout
    assert all((out / entry["filepath"] / entry["filename"]).is_file() for entry in data["images"])

    (out / "images" / "chelsea.png").unlink()
    assert main(["make-photos", "--output-dir", str(out)]) == 0  # a previous output of the same command is replaced
    assert (out / "images" / "chelsea.png").is_file()


def test_make_clipart_writes_the_corpus_and_names_what_it_skipped(tmp_path):
    pytest.importorskip("cairosvg", reason="cairosvg renders the SVGs: pip install '.[real]'")
    from clipart_support import BLANK, BROKEN, ENTITY, write_svg_tree

    tree, out, cache = write_svg_tree(tmp_path / "svg"), tmp_path / "clipart", tmp_path / "cache"
    common = ["--svg-root", str(tree), "--cache-dir", str(cache), "--image-size", "40", "--workers", "2"]
    result = itune("make-clipart", "--output-dir", str(out), *common)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "dataset.json").read_text())
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"wrote {out / 'dataset.json'} ({len(data['images'])} images")
    sizes = data["generator"]["split_sizes"]
    assert lines[1] == "images per split: " + ", ".join(f"{s} {sizes[s]}" for s in ("train", "val", "test") if sizes[s])
    cleaning = data["generator"]["cleaning"]
    assert lines[3].startswith(f"dropped: {cleaning['no_caption_dropped']} images without a caption, "
                               f"{cleaning['group_cap_dropped']} by the group cap")  # fmt: skip
    assert lines[4] == f"skipped 3 files that do not parse or render: {out / 'skipped.json'}"
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert sorted(note.split()[1] for note in notes) == sorted([BLANK, BROKEN, ENTITY])
    assert data["generator"]["image_size"] == 40
    assert all((out / e["filepath"] / e["filename"]).is_file() for e in data["images"])

    again = itune("make-clipart", "--output-dir", str(out), *common)  # a previous output: replaced, from the cache
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "dataset.json").read_text()) == data


def test_make_clipart_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch):
    from itune_hf.data import clipart

    with pytest.raises(SystemExit):
        main(["make-clipart", "--output-dir", str(tmp_path / "x"), "--image-size", "8"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "itune make-clipart: error: argument --image-size: expected an integer from 16 to 2048, got '8'"
    )
    assert main(["make-clipart", "--output-dir", str(tmp_path / "x"), "--svg-root", str(tmp_path / "none")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"itune make-clipart: error: --svg-root {tmp_path / 'none'}: no such directory"
    )
    monkeypatch.setattr(clipart, "_dpkg", lambda command: None)
    monkeypatch.setattr(clipart, "DEFAULT_SVG_ROOT", tmp_path / "absent")
    assert main(["make-clipart", "--output-dir", str(tmp_path / "x"), "--cache-dir", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"itune make-clipart: error: the openclipart-svg package is not installed (no {tmp_path / 'absent'}): "
        "apt-get install openclipart-svg"
    )
    assert not (tmp_path / "x").exists()
