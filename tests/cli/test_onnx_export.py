"""ONNX export for deployment (issue 31.2): `itune export --format onnx` and `itune caption --runtime onnx`."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from itune_hf.cli import main
from itune_hf.models.loading import load_captioner

from conftest import write_photo

needs_onnx = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("onnxscript", "onnxruntime")),
    reason="the [onnx] extra (onnx, onnxscript, onnxruntime) is not installed",
)

COLORS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 40), (90, 90, 90), (250, 250, 250)]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx-photos")
    return [write_photo(root / f"p{i}.png", size=(48 + 8 * i, 40), color=color) for i, color in enumerate(COLORS)]


@pytest.fixture(scope="module")
def exported(captioner_dirs, tmp_path_factory):
    """The tiny adapter-only captioner, exported through the CLI."""
    output = tmp_path_factory.mktemp("onnx") / "export"
    assert main(["export", "--model", str(captioner_dirs["adapter"]), "--output-dir", str(output)]) == 0
    return output


def captions(generate, processor, photos, beams: int) -> list[str]:
    from PIL import Image

    inputs = processor(images=[Image.open(path).convert("RGB") for path in photos])
    with torch.no_grad():
        return processor.batch_decode(generate(**inputs, num_beams=beams, max_new_tokens=8))


@needs_onnx
@pytest.mark.slow  # the export takes a minute
def test_export_writes_both_graphs_and_greedy_captions_equal_torchs(exported, captioner_dirs, photos):
    from itune_hf.onnx_runtime import load_onnx_captioner

    assert {"vision.onnx", "decoder.onnx", "onnx_config.json", "processor_config.json"} <= {
        path.name for path in exported.iterdir()
    }
    model, processor = load_captioner(captioner_dirs["adapter"])
    onnx_model, onnx_processor = load_onnx_captioner(exported)
    expected = captions(model.generate, processor, photos, beams=1)
    assert len(set(expected)) > 1  # the images get different captions: a real comparison
    assert captions(onnx_model.generate, onnx_processor, photos, beams=1) == expected
    beam = captions(onnx_model.generate, onnx_processor, photos, beams=3)
    agree = sum(a == b for a, b in zip(beam, captions(model.generate, processor, photos, beams=3)))
    assert agree >= len(photos) - 1, f"beam 3: {agree} of {len(photos)} captions agree"


@needs_onnx
@pytest.mark.slow  # uses the exported model
def test_caption_runtime_onnx_prints_what_torch_prints(exported, captioner_dirs, photos, capsys):
    images = [str(path) for path in photos]
    options = ["--num-beams", "1", "--max-new-tokens", "8", "--no-progress"]
    assert main(["caption", *images, "--model", str(captioner_dirs["adapter"]), *options]) == 0
    expected = capsys.readouterr().out
    assert main(["caption", *images, "--model", str(exported), "--runtime", "onnx", *options]) == 0
    assert capsys.readouterr().out == expected


def test_runtime_onnx_without_onnxruntime_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    photo = write_photo(tmp_path / "p.png")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    assert main(["caption", str(photo), "--model", str(tmp_path), "--runtime", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "the ONNX runtime needs onnxruntime" in err and "pip install 'itune-hf[onnx]'" in err


def test_runtime_onnx_refuses_what_is_not_an_export(tmp_path, captioner_dirs, capsys):
    photo = str(write_photo(tmp_path / "p.png"))
    for argv, message in [
        (["--model", str(captioner_dirs["adapter"])], "no onnx_config.json, so not an ONNX export"),
        (["--model", str(tmp_path / "nothing")], "no such directory; pass what itune export --format onnx wrote"),
        (["--model", str(tmp_path), "--int8"], "--int8, --precision and --vocabulary apply to --runtime torch"),
        (["--adapter", f"a={captioner_dirs['adapter']}"], "--runtime onnx runs one exported --model"),
    ]:
        assert main(["caption", photo, "--runtime", "onnx", *argv]) == 2
        assert message in capsys.readouterr().err, argv


def test_export_refuses_another_family_naming_it(tmp_path, monkeypatch, capsys):
    from itune_hf.onnx_export import check_exportable
    from itune_hf.presets import build_model

    with pytest.raises(ValueError, match=r"ONNX export covers I-Tuning captioners; XGPT \(XGPTForCaptioning\)"):
        check_exportable(build_model("xgpt-tiny-random"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    assert main(["export", "--model", str(tmp_path), "--output-dir", str(tmp_path / "out")]) == 2
    assert "itune export --format onnx needs onnxscript: pip install 'itune-hf[onnx]'" in capsys.readouterr().err
