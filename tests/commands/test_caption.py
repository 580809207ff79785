"""`itune caption` as a user runs it: files and folders, batching, JSON lines, image paths from stdin (`-`), and every
kind of bad file."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image

from itune_hf.cli import main

from conftest import write_photo

ITUNE = str(Path(sys.executable).parent / "itune")


def png_claiming_size(path: Path, width: int, height: int) -> Path:
    """A valid PNG header announcing a huge image (a decompression bomb) with almost no data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")
    )
    return path


def run(*args, cwd):
    return subprocess.run([ITUNE, "caption", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def folder(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for i, color in enumerate([(200, 20, 20), (20, 200, 20), (20, 20, 200)]):
        write_photo(photos / f"good{i}.jpg", color=color)
    good = (photos / "good0.jpg").read_bytes()
    (photos / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (photos / "empty.png").write_bytes(b"")
    (photos / "notes.txt").write_text("a text file, not an image")
    png_claiming_size(photos / "bomb.png", 30000, 30000)
    png_claiming_size(photos / "header_only_wide.png", 300_000, 1)  # 116 bytes; tiny-preset resize: 3.45 GB
    Image.new("L", (1, 100_000)).save(photos / "thin.png")  # raised OverflowError in the resize
    (photos / "garbage.png").write_bytes(os.urandom(64))
    (photos / "readme.md").write_text("ignored: folders contribute image files only")
    return photos


@pytest.mark.slow  # a subprocess per command
def test_bad_files_get_one_line_each_and_the_others_are_captioned(captioner_dirs, folder):
    result = run(
        str(folder),
        str(folder / "notes.txt"),
        "--model",
        str(captioner_dirs["full"]),
        "--num-beams",
        "2",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--no-progress",
        cwd=folder.parent,
    )
    assert result.returncode == 1
    captioned = [line.split("\t") for line in result.stdout.strip().splitlines()]
    assert [Path(path).name for path, _ in captioned] == ["good0.jpg", "good1.jpg", "good2.jpg"]
    assert all(caption for _, caption in captioned)
    errors = [line for line in result.stderr.splitlines() if line.startswith("itune caption: error:")]
    reasons = {Path(line.split(": ")[2]).name: line for line in errors}
    bad = {"truncated.jpg", "empty.png", "notes.txt", "bomb.png", "header_only_wide.png", "thin.png", "garbage.png"}
    assert set(reasons) == bad
    assert "unreadable image data" in reasons["truncated.jpg"] and "empty file" in reasons["empty.png"]
    assert "not an image file" in reasons["notes.txt"] and "decompression bomb" in reasons["bomb.png"]
    assert "not an image file" in reasons["garbage.png"]
    assert "300000x1" in reasons["header_only_wide.png"] and "limit of 100:1" in reasons["header_only_wide.png"]
    assert "1x100000" in reasons["thin.png"] and "aspect ratio" in reasons["thin.png"]
    assert "7 of 10 images could not be read and were skipped; 3 captioned" in result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("itune caption:")] == []


@pytest.mark.slow
def test_json_lines_and_success_exit_status(captioner_dirs, folder):
    good = [str(folder / f"good{i}.jpg") for i in range(3)]
    result = run(
        *good,
        "--model",
        str(captioner_dirs["adapter"]),
        "--json",
        "--num-beams",
        "1",
        "--max-new-tokens",
        "3",
        cwd=folder.parent,
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["path"] for r in records] == good and all(isinstance(r["caption"], str) for r in records)


def test_usage_errors_exit_2_with_one_line(captioner_dirs, tmp_path):
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    result = run(str(empty), "--model", str(captioner_dirs["full"]), cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == f"itune caption: error: no images found in {empty}"
    result = run(str(empty), "--model", str(captioner_dirs["full"]), "--batch-size", "0", cwd=tmp_path)
    assert result.returncode == 2 and "argument --batch-size: expected an integer >= 1, got '0'" in result.stderr


def test_int8_and_precision_flags(captioner_dirs, folder, capsys):
    # in-process (the subprocess path is covered above): four interpreters' start-up saved
    good = [str(folder / f"good{i}.jpg") for i in range(2)]
    common = ("--model", str(captioner_dirs["full"]), "--num-beams", "2", "--max-new-tokens", "3", "--json")
    for flags in ((), ("--int8",), ("--precision", "auto"), ("--int8", "--precision", "auto")):
        capsys.readouterr()
        assert main(["caption", *good, *common, *flags]) == 0, (flags, capsys.readouterr().err)
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [Path(row["path"]).name for row in rows] == ["good0.jpg", "good1.jpg"], flags
        assert all(isinstance(row["caption"], str) for row in rows)


@pytest.mark.slow
def test_bf16_refused_on_a_host_without_native_bf16(captioner_dirs, folder):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}  # how an AVX2-only CPU looks to torch
    result = subprocess.run(
        [ITUNE, "caption", str(folder / "good0.jpg"), "--model", str(captioner_dirs["full"]), "--precision", "bf16"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "--precision 'bf16'" in result.stderr and "no native bf16" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_file_name_cannot_forge_a_tsv_row_and_a_caption_past_the_lms_positions_is_refused(captioner_dirs, tmp_path,
                                                                                            capsys):  # fmt: skip
    # "x\nforged.png\ta caption.png" must not print a forged row; --max-new-tokens 200 on a 128-position LM is refused
    # (in caption, eval and explain alike), not an IndexError
    forged = tmp_path / "x\nforged.png\ta caption.png"
    write_photo(forged)
    common = ["--model", str(captioner_dirs["full"]), "--num-beams", "1"]
    assert main(["caption", str(forged), *common, "--max-new-tokens", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].split("\t")[0] == str(tmp_path) + "/x\\nforged.png\\ta caption.png"
    assert main(["caption", str(forged), *common, "--max-new-tokens", "200"]) == 2
    err = capsys.readouterr().err
    assert "--max-new-tokens 200: the captioner's language model has 128 positions" in err and "127 tokens" in err
    assert "Traceback" not in err
    prompted = [*common, "--prompt", "a b c", "--max-new-tokens", "127"]  # the prompt's 3 tokens take positions too
    assert main(["caption", str(forged), *prompted]) == 2
    assert "(4 taken before the caption), so a caption has at most 124 tokens" in capsys.readouterr().err

    from itune_hf.errors import InputError
    from itune_hf.evaluation import generate_captions
    from itune_hf.explain import explain_caption
    from itune_hf.models.loading import load_captioner

    model, processor = load_captioner(captioner_dirs["full"])
    with pytest.raises(InputError, match="has 128 positions"):  # eval and validation caption through this
        generate_captions(model, processor, [], max_new_tokens=200)
    with pytest.raises(InputError, match="has 128 positions"):
        explain_caption(model, processor, str(forged), max_new_tokens=200)


def test_generate_captions_returns_each_images_n_best_list_best_first(captioner_dirs, tmp_path):
    from datasets import Dataset

    from itune_hf.evaluation import generate_captions
    from itune_hf.models.loading import load_captioner

    from conftest import write_photo

    model, processor = load_captioner(captioner_dirs["full"])
    photos = [str(write_photo(tmp_path / f"{i}.png", color=(90 * i, 40, 0))) for i in range(3)]
    rows = Dataset.from_dict({"image_id": ["a", "b", "c"], "image_path": photos})
    kwargs = {"num_beams": 3, "max_new_tokens": 4, "batch_size": 2, "progress": False}
    best = generate_captions(model, processor, rows, **kwargs)
    nbest = generate_captions(model, processor, rows, num_return_sequences=3, **kwargs)
    assert set(nbest) == {"a", "b", "c"} and len(set(best.values())) > 1  # distinct images: a mix-up would show
    for image_id, candidates in nbest.items():
        assert len(candidates) == 3 and all(isinstance(c, str) for c in candidates)
        assert candidates[0] == best[image_id]  # the beam's best is the caption generate_captions gives alone
    with pytest.raises(ValueError, match="raise num_beams"):
        generate_captions(model, processor, rows, num_return_sequences=4, **kwargs)
    # num_beams None: the model's own beam count (I-Tuning's paper setting, 5) bounds the list
    own = {**kwargs, "num_beams": None}
    assert model.generation_config.num_beams == 5
    assert all(len(c) == 5 for c in generate_captions(model, processor, rows, num_return_sequences=5, **own).values())


def test_itune_caption_dash_reads_image_paths_from_stdin(captioner_dirs, tmp_path, capsys, monkeypatch):
    import io

    from conftest import write_photo

    photos = [str(write_photo(tmp_path / f"{i}.png", color=(60 * i, 0, 0))) for i in range(2)]
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{photos[0]}\n\n{photos[1]}\n"))
    command = ["caption", "-", "--model", str(captioner_dirs["full"]), "--json", "--num-beams", "1"]
    assert main([*command, "--max-new-tokens", "3"]) == 0
    printed = [json.loads(line)["path"] for line in capsys.readouterr().out.strip().splitlines()]
    assert printed == photos
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(command) == 2
    assert "no images found in stdin" in capsys.readouterr().err


@pytest.mark.parametrize("visual_source", ["boxes", "regions"])
def test_an_xgpt_model_reading_detector_regions_is_refused_naming_itune_eval(tmp_path, capsys, visual_source):
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor

    model_dir = tmp_path / visual_source
    model = build_model("xgpt-tiny-random", visual_source=visual_source)
    save_captioner(model, model_dir, processor=build_processor("xgpt-tiny-random"))
    photo = str(write_photo(tmp_path / "p.png"))
    capsys.readouterr()  # saving's progress bar
    assert main(["caption", photo, "--model", str(model_dir)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        f"itune caption: error: --model {model_dir} reads detector regions (visual_source='{visual_source}'), which "
        "itune caption cannot give it; caption with itune eval --region-features FILE (the regions of its images)"
    )


def test_the_default_length_is_the_models_own(tmp_path, captioner_dirs, capsys):
    """XGPT's generation config says max_length 60 (the paper's test setting): itune caption, eval and explain
    stopped its captions at 30 new tokens, where generate() and the pipeline give up to 59."""
    import torch

    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor

    torch.manual_seed(0)
    model, processor = build_model("xgpt-tiny-random").eval(), build_processor("xgpt-tiny-random")
    with torch.no_grad():  # weights drawn wider: its captions run to the length limit
        for name, parameter in model.named_parameters():
            if "vision_model" not in name and parameter.dim() == 2:
                parameter.normal_(0, 0.3)
    directory = save_captioner(model, tmp_path / "xgpt", processor=processor)
    photo = write_photo(tmp_path / "p.png")
    with torch.no_grad():
        ids = model.generate(**processor(images=[Image.open(photo).convert("RGB")]), num_beams=1)
    assert ids.shape[1] > 31  # longer than the old default of 30 new tokens
    assert main(["caption", str(photo), "--model", str(directory), "--num-beams", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["caption"] == processor.batch_decode(ids)[0]
    from itune_hf.models.loading import load_captioner

    model, processor = load_captioner(captioner_dirs["adapter"])  # I-Tuning's: 30 new tokens (not generate's 20)
    with torch.no_grad():
        ids = model.generate(**processor(images=[Image.open(photo).convert("RGB")]), num_beams=1)
    assert ids.shape[1] == 31
    assert main(["caption", str(photo), "--model", str(captioner_dirs["adapter"]), "--num-beams", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["caption"] == processor.batch_decode(ids)[0]


@pytest.mark.slow  # a subprocess
def test_a_reader_that_stops_early_ends_the_command_quietly(captioner_dirs, tmp_path):
    """`itune caption ... | head -1`: the closed pipe stops it with 141 (128 + SIGPIPE), as Unix tools, without an
    error line."""
    images = [str(write_photo(tmp_path / f"p{i}.png", color=(20 * i, 90, 200))) for i in range(12)]
    argv = [ITUNE, "caption", *images, "--model", str(captioner_dirs["full"]), "--batch-size", "1", "--num-beams", "1"]
    process = subprocess.Popen([*argv, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith(images[0])
    process.stdout.close()  # as head -1 does once it has its line
    stderr = process.stderr.read()
    assert process.wait(timeout=300) == 141, stderr
    assert "error" not in stderr and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
