"""ONNX export for deployment (`itune_hf.onnx`): `itune export --format onnx` (with `--quantize int8` and
`--vocabulary`) and `itune caption --runtime onnx`."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import numpy as np
import pytest
import torch

from itune_hf.cli import main
from itune_hf.errors import InputError
from itune_hf.models.loading import load_captioner

from conftest import write_photo

needs_onnx = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("onnxscript", "onnxruntime")),
    reason="the [onnx] extra (onnx, onnxscript, onnxruntime) is not installed",
)

SHORTLIST_CAPTIONS = ["a red square on a blue field", "two green circles near a yellow box", "grey sky, white cloud"]
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


@pytest.fixture(scope="module")
def exported_int8_shortlist(captioner_dirs, tmp_path_factory):
    """The same captioner exported with `--quantize int8 --vocabulary CAPTIONS`; the directory and the captions."""
    root = tmp_path_factory.mktemp("onnx-int8")
    (root / "captions.txt").write_text("\n".join(SHORTLIST_CAPTIONS) + "\n")
    argv = ["--quantize", "int8", "--vocabulary", str(root / "captions.txt")]
    assert main(["export", "--model", str(captioner_dirs["adapter"]), "--output-dir", str(root / "out"), *argv]) == 0
    return root / "out"


def open_rgb(path):
    from PIL import Image

    return Image.open(path).convert("RGB")


def captions(generate, processor, photos, beams: int) -> list[str]:
    return processor.batch_decode(token_ids(generate, processor, photos, beams))


def assert_onnx_captions_as_torch(model_dir, export_dir, photos) -> None:
    """The export's greedy captions are torch's, on images that get different captions; beam 3 agrees on all but one."""
    from itune_hf.onnx.runtime import load_onnx_captioner

    model, processor = load_captioner(model_dir)
    onnx_model, onnx_processor = load_onnx_captioner(export_dir)
    expected = captions(model.generate, processor, photos, beams=1)
    assert len(set(expected)) > 1  # the images get different captions: a real comparison
    assert captions(onnx_model.generate, onnx_processor, photos, beams=1) == expected
    beam = captions(onnx_model.generate, onnx_processor, photos, beams=3)
    agree = sum(a == b for a, b in zip(beam, captions(model.generate, processor, photos, beams=3)))
    assert agree >= len(photos) - 1, f"beam 3: {agree} of {len(photos)} captions agree"


def token_ids(generate, processor, photos, beams: int):
    inputs = processor(images=[open_rgb(path) for path in photos])
    with torch.no_grad():
        return generate(**inputs, num_beams=beams, max_new_tokens=8)


def first_step_logits(directory, decoder: str, processor, photos) -> np.ndarray:
    """The logits of `directory/decoder` for the start token after each photo (an empty cache)."""
    import onnxruntime
    from PIL import Image

    config = json.loads((directory / "onnx_config.json").read_text())
    pixels = processor(images=[Image.open(path).convert("RGB") for path in photos])["pixel_values"].numpy()
    (states,) = onnxruntime.InferenceSession(str(directory / "vision.onnx")).run(None, {"pixel_values": pixels})
    cache = np.zeros((config["num_layers"], len(photos), config["kv_heads"], 0, config["head_dim"]), np.float32)
    ids = np.full((len(photos), 1), config["decoder_start_token_id"], np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "vision_states": states}
    session = onnxruntime.InferenceSession(str(directory / decoder))
    return session.run(None, {**feed, "past_keys": cache, "past_values": cache})[0]


@needs_onnx
@pytest.mark.slow  # the export takes a minute
def test_export_writes_both_graphs_and_greedy_captions_equal_torchs(exported, captioner_dirs, photos):

    assert {"vision.onnx", "decoder.onnx", "onnx_config.json", "processor_config.json"} <= {
        path.name for path in exported.iterdir()
    }
    assert_onnx_captions_as_torch(captioner_dirs["adapter"], exported, photos)


@needs_onnx
@pytest.mark.slow  # uses the exported model
def test_caption_runtime_onnx_prints_what_torch_prints(exported, captioner_dirs, photos, capsys):
    images = [str(path) for path in photos]
    options = ["--num-beams", "1", "--max-new-tokens", "8", "--no-progress"]
    assert main(["caption", *images, "--model", str(captioner_dirs["adapter"]), *options]) == 0
    expected = capsys.readouterr().out
    assert main(["caption", *images, "--model", str(exported), "--runtime", "onnx", *options]) == 0
    assert capsys.readouterr().out == expected


@needs_onnx
@pytest.mark.slow  # uses the exported model
def test_runtime_generate_refuses_settings_it_would_not_apply_and_reads_max_length(exported, captioner_dirs, photos):
    from itune_hf.onnx.runtime import load_onnx_captioner

    onnx_model, processor = load_onnx_captioner(exported)
    inputs = processor(images=[open_rgb(path) for path in photos[:2]])
    for settings in ({"do_sample": True}, {"no_repeat_ngram_size": 2}, {"num_return_sequences": 2},
                     {"return_dict_in_generate": True}, {"temprature": 0.5}):  # fmt: skip
        with pytest.raises(InputError, match=r"generate\(.*\): the ONNX runtime does not apply it"):
            onnx_model.generate(**inputs, num_beams=1, max_new_tokens=3, **settings)
    same = onnx_model.generate(**inputs, num_beams=1, max_new_tokens=3, do_sample=False, use_cache=True)
    model, _ = load_captioner(captioner_dirs["adapter"])
    assert np.array_equal(same, model.generate(**inputs, num_beams=1, max_new_tokens=3).numpy())
    assert np.array_equal(
        onnx_model.generate(**inputs, num_beams=1, max_length=6), model.generate(**inputs, num_beams=1, max_length=6)
    )


@needs_onnx
@pytest.mark.slow  # uses the exported model
def test_int8_decoder_quantises_the_lm_weights_only_and_its_logits_follow_fp32(exported, photos, tmp_path):
    import onnx

    from itune_hf.onnx.export import quantize_decoder
    from itune_hf.onnx.runtime import load_onnx_captioner

    copy = shutil.copytree(exported, tmp_path / "export")
    quantize_decoder(copy / "decoder.onnx", copy / "decoder.int8.onnx")
    graph = onnx.load(str(copy / "decoder.int8.onnx"), load_external_data=False)
    quantised = [node for node in graph.graph.node if node.op_type == "MatMulInteger"]
    # the tiny GPT-2's 3 layers x 4 Conv1D (exported as Gemm) + its tied LM head; the I-Tuning modules stay float
    assert len(quantised) == 3 * 4 + 1
    assert not any(node.op_type == "Gemm" for node in graph.graph.node)
    weights = {t.name: t for t in onnx.load(str(copy / "decoder.int8.onnx")).graph.initializer}
    largest = max(np.abs(onnx.numpy_helper.to_array(weights[n.input[1]]).astype(int)).max() for n in quantised)
    assert largest <= 64  # 7-bit weights: at full range (127), CPUs without VNNI saturate (the demo wrote nonsense)
    _, processor = load_onnx_captioner(exported)
    fp32, int8 = (first_step_logits(copy, name, processor, photos) for name in ("decoder.onnx", "decoder.int8.onnx"))
    assert fp32.shape == int8.shape == (len(photos), 50257)
    correlation = np.corrcoef(fp32.ravel(), int8.ravel())[0, 1]
    assert correlation > 0.98, f"the int8 decoder's logits correlate {correlation:.3f} with fp32's"
    print(f"int8 decoder: logits correlate {correlation:.4f} with fp32's; the same top token for "
          f"{int((fp32.argmax(-1) == int8.argmax(-1)).sum())} of {len(photos)} images")  # fmt: skip
    assert not np.allclose(fp32, int8)  # it did quantise


@needs_onnx
@pytest.mark.slow  # exports the model (a minute)
def test_export_quantize_int8_with_a_shortlist_captions_through_the_cli(exported_int8_shortlist, photos, capsys):
    from itune_hf.onnx.runtime import load_onnx_captioner

    config = json.loads((exported_int8_shortlist / "onnx_config.json").read_text())
    assert config["quantize"] == "int8" and config["graphs"]["decoder"] == "decoder.int8.onnx"
    assert (exported_int8_shortlist / "decoder.int8.onnx").is_file()
    options = ["--num-beams", "1", "--max-new-tokens", "8", "--no-progress", "--json"]
    images = [str(path) for path in photos]
    assert main(["caption", *images, "--model", str(exported_int8_shortlist), "--runtime", "onnx", *options]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["path"] for row in printed] == images and all(row["caption"].strip() for row in printed)
    modes = {path.name: path.stat().st_mode & 0o777 for path in exported_int8_shortlist.glob("*.onnx.data")}
    assert modes["decoder.int8.onnx.data"] == modes["decoder.onnx.data"]  # onnx writes it owner-only (0600)
    model, processor = load_onnx_captioner(exported_int8_shortlist)
    assert model.decoder_file == "decoder.int8.onnx"
    ids = token_ids(model.generate, processor, photos, beams=1)
    assert set(np.unique(ids).tolist()) <= set(config["vocabulary"])  # tokenizer ids, from the shortlist only
    assert [row["caption"] for row in printed] == processor.batch_decode(ids)


@needs_onnx
@pytest.mark.slow  # uses the exported model
def test_shortlisted_export_captions_as_torch_does_with_the_same_shortlist(
    exported_int8_shortlist, captioner_dirs, photos
):
    from itune_hf.inference import caption_vocabulary, optimize_for_inference
    from itune_hf.onnx.runtime import load_onnx_captioner

    model, processor = load_captioner(captioner_dirs["adapter"])
    vocabulary = caption_vocabulary(processor, SHORTLIST_CAPTIONS)
    torch_model = optimize_for_inference(model, vocabulary=vocabulary)
    fp32, onnx_processor = load_onnx_captioner(exported_int8_shortlist, int8=False)
    assert json.loads((exported_int8_shortlist / "onnx_config.json").read_text())["vocabulary"] == vocabulary
    expected = captions(torch_model.generate, processor, photos, beams=1)
    assert len(set(expected)) > 1  # the images get different captions: a real comparison
    assert captions(fp32.generate, onnx_processor, photos, beams=1) == expected
    beam = captions(fp32.generate, onnx_processor, photos, beams=3)
    agree = sum(a == b for a, b in zip(beam, captions(torch_model.generate, processor, photos, beams=3)))
    assert agree >= len(photos) - 1, f"beam 3: {agree} of {len(photos)} captions agree"
    int8, _ = load_onnx_captioner(exported_int8_shortlist)  # the export's default: its int8 decoder
    agree = sum(a == b for a, b in zip(captions(int8.generate, onnx_processor, photos, beams=1), expected))
    print(f"int8 + shortlist greedy: {agree} of {len(photos)} captions equal torch fp32 + shortlist")
    with pytest.raises(InputError, match=r"the prompt \(decoder_input_ids\): token ids \[9999\] are not in the "):
        fp32.generate(torch.zeros(1, 3, 32, 32), decoder_input_ids=torch.tensor([[9999]]))


@needs_onnx
@pytest.mark.slow  # exports the model again (a minute)
def test_an_export_into_an_earlier_one_leaves_none_of_its_graphs(
    exported_int8_shortlist, captioner_dirs, tmp_path, capsys
):
    again = shutil.copytree(exported_int8_shortlist, tmp_path / "again")
    assert main(["export", "--model", str(captioner_dirs["adapter"]), "--output-dir", str(again)]) == 0
    assert "wrote " + str(again) + ": decoder.onnx, vision.onnx," in capsys.readouterr().out
    assert not (again / "decoder.int8.onnx").exists() and not (again / "decoder.int8.onnx.data").exists()
    config = json.loads((again / "onnx_config.json").read_text())
    assert config["quantize"] is None and config["vocabulary"] is None


@needs_onnx
@pytest.mark.slow  # uses the exported model
def test_runtime_int8_refuses_an_export_without_it(exported):
    from itune_hf.onnx.runtime import OnnxCaptioner

    assert OnnxCaptioner(exported).decoder_file == "decoder.onnx"
    with pytest.raises(InputError, match="no int8 decoder in this export; export with itune export --quantize int8"):
        OnnxCaptioner(exported, int8=True)


def test_export_vocabulary_that_is_not_there_is_refused_before_loading(tmp_path, capsys):
    argv = ["export", "--model", str(tmp_path), "--output-dir", str(tmp_path / "out")]
    assert main([*argv, "--vocabulary", str(tmp_path / "none.txt")]) == 2
    assert "--vocabulary " + str(tmp_path / "none.txt") + ": no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--quantize", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err


@needs_onnx
def test_export_refuses_an_opset_the_exporter_cannot_write_before_loading(tmp_path, capsys):
    from itune_hf.onnx.export import highest_opset

    argv = ["export", "--model", str(tmp_path / "none"), "--output-dir", str(tmp_path / "out")]
    for opset in (7, 17, highest_opset() + 1):  # it wrote opset 18 for these, naming the failure in a warning only
        assert main([*argv, "--opset", str(opset)]) == 2
        err = capsys.readouterr().err
        assert f"--opset {opset}: the exporter writes opsets 18 to {highest_opset()} here" in err, err


@needs_onnx
@pytest.mark.slow  # exports the model (20 s)
def test_an_opset_the_conversion_misses_is_refused_and_its_graphs_removed(
    captioner_dirs, tmp_path, monkeypatch, capsys
):
    import onnx

    from itune_hf.onnx.export import highest_opset

    beyond = highest_opset() + 1  # onnx knows it, onnxscript does not convert to it: the exporter kept its own opset
    if beyond > onnx.defs.onnx_opset_version():
        pytest.skip(f"onnxscript converts to every opset onnx {onnx.__version__} knows")
    monkeypatch.setattr("itune_hf.onnx.export.highest_opset", onnx.defs.onnx_opset_version)
    out = tmp_path / "out"
    assert (
        main(["export", "--model", str(captioner_dirs["full"]), "--output-dir", str(out), "--opset", str(beyond)]) == 2
    )
    assert f"--opset {beyond}: the exporter could not convert the graphs to it" in capsys.readouterr().err
    assert not list(out.glob("*.onnx*"))


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
        (["--model", str(tmp_path), "--load-in", "8bit"], "--load-in 8bit quantises torch's language model; drop it"),
    ]:
        assert main(["caption", photo, "--runtime", "onnx", *argv]) == 2
        assert message in capsys.readouterr().err, argv


def test_export_refuses_generation_settings_the_runtime_would_not_apply(captioner_dirs, tmp_path, capsys):
    model = shutil.copytree(captioner_dirs["full"], tmp_path / "model")
    settings = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**settings, "no_repeat_ngram_size": 2}))
    assert main(["export", "--model", str(model), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "its generation_config.json sets no_repeat_ngram_size=2, which the ONNX runtime does not apply" in err, err
    assert not (tmp_path / "out").exists()
    photo = str(write_photo(tmp_path / "p.png"))  # an export given to the torch runtime: the flag is named
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "onnx_config.json").write_text("{}")
    assert main(["caption", photo, "--model", str(tmp_path / "export")]) == 2
    assert (
        "an ONNX export (onnx_config.json), not a torch checkpoint: caption it with itune caption --runtime onnx"
        in (capsys.readouterr().err)
    )


def test_export_refuses_another_family_naming_it(tmp_path, monkeypatch, capsys):
    from itune_hf.onnx.export import check_exportable
    from itune_hf.presets import build_model

    with pytest.raises(ValueError, match=r"covers I-Tuning and XGPT captioners; ClipCap \(ClipCapForCaptioning\)"):
        check_exportable(build_model("clipcap-mlp-tiny-random"))
    with pytest.raises(ValueError, match=r"XGPT models that read their images on a grid .*; this one reads 'boxes'"):
        check_exportable(build_model("xgpt-tiny-random", visual_source="boxes"))
    with pytest.raises(ValueError, match="XGPT is trained whole and exports in fp32 only: export without them"):
        check_exportable(build_model("xgpt-tiny-random"), quantize="int8")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    assert main(["export", "--model", str(tmp_path), "--output-dir", str(tmp_path / "out")]) == 2
    assert "itune export --format onnx needs onnxscript: pip install 'itune-hf[onnx]'" in capsys.readouterr().err


def xgpt_captioner(architecture: str):
    """xgpt-tiny-random with its weights (the tower's aside) drawn wider, so that its greedy captions differ by
    image (at the preset's initialisation every image gets the same)."""
    from itune_hf.presets import build_model

    torch.manual_seed(0)
    return widened(build_model("xgpt-tiny-random", architecture=architecture).eval())


def widened(model):
    """`model` with its weights (the tower's aside) redrawn wider, in place: its greedy captions differ by image."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "vision_model" not in name and parameter.dim() == 2:
                parameter.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def xgpt_dir(tmp_path_factory):
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_processor

    directory = tmp_path_factory.mktemp("xgpt") / "captioner"
    return save_captioner(xgpt_captioner("encdec_share"), directory, processor=build_processor("xgpt-tiny-random"))


@needs_onnx
@pytest.mark.slow  # exports the model (a minute)
def test_xgpt_exports_its_encoder_and_decoder_and_captions_as_torch_does(xgpt_dir, photos, tmp_path, capsys):
    from itune_hf.onnx.runtime import load_onnx_captioner

    output = tmp_path / "export"
    assert main(["export", "--model", str(xgpt_dir), "--output-dir", str(output)]) == 0
    assert {"encoder.onnx", "decoder.onnx", "onnx_config.json"} <= {path.name for path in output.iterdir()}
    config = json.loads((output / "onnx_config.json").read_text())
    assert config["family"] == "xgpt" and config["graphs"]["image_outputs"] == ["memory_mask", "memory_keys",
                                                                                 "memory_values"]  # fmt: skip
    assert_onnx_captions_as_torch(xgpt_dir, output, photos)
    onnx_model, processor = load_onnx_captioner(output)  # XGPT's max_length (60) counts the prompt, as torch's does
    inputs = processor(images=[open_rgb(path) for path in photos[:2]], text=["a photo of"] * 2)
    expected = load_captioner(xgpt_dir)[0].generate(**inputs, num_beams=1)
    assert expected.shape[1] == 60 and np.array_equal(onnx_model.generate(**inputs, num_beams=1), expected.numpy())
    capsys.readouterr()
    images = [str(path) for path in photos]
    options = ["--num-beams", "1", "--max-new-tokens", "8", "--no-progress"]
    assert main(["caption", *images, "--model", str(xgpt_dir), *options]) == 0
    expected = capsys.readouterr().out
    assert main(["caption", *images, "--model", str(output), "--runtime", "onnx", *options]) == 0
    assert capsys.readouterr().out == expected


@needs_onnx
@pytest.mark.slow  # exports the model (a minute each)
@pytest.mark.parametrize("architecture", ["enc", "encdec"])
def test_xgpt_architectures_without_a_shared_stack_caption_as_torch_does(architecture, photos, tmp_path):
    from itune_hf.onnx.export import export_onnx
    from itune_hf.onnx.runtime import load_onnx_captioner
    from itune_hf.presets import build_processor

    processor = build_processor("xgpt-tiny-random")
    expected = captions(xgpt_captioner(architecture).generate, processor, photos, beams=1)
    assert len(set(expected)) > 1
    export_onnx(xgpt_captioner(architecture), processor, tmp_path)
    onnx_model, _ = load_onnx_captioner(tmp_path)
    assert captions(onnx_model.generate, processor, photos, beams=1) == expected


@needs_onnx
@pytest.mark.slow  # exports the model (15 s)
def test_xgpt_over_a_tapped_efficientnet_lite_exports_and_captions_as_torch_does(photos, tmp_path):
    """xgpt-lite0 reads Lite0 as hypercolumns (`feature_taps`: earlier maps area-pooled onto the head's grid); the
    image graph carries the pooling: a tiny tapped tower's export captions as torch does."""
    from itune_hf.hub import save_captioner
    from itune_hf.models.xgpt.configuration_xgpt import XGPTConfig
    from itune_hf.models.xgpt.modeling_xgpt import XGPTForCaptioning
    from itune_hf.presets import build_processor, get_preset

    tower = get_preset("itune-tiny-lite-random").vision.to_config()  # 32 px: the stem at 16x16, the head at 8x8
    tower.feature_taps = [0, 2]
    config = XGPTConfig.from_vision_config(
        tower, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = widened(XGPTForCaptioning(config).eval())
    assert model.config.vision_config.hidden_sizes[-1] == 32 + 8 + 16
    processor = build_processor("xgpt-tiny-random")
    processor.image_processor = build_processor("itune-tiny-lite-random").image_processor  # the tower's own
    directory = save_captioner(model, tmp_path / "captioner", processor=processor)
    export_dir = tmp_path / "export"
    assert main(["export", "--model", str(directory), "--output-dir", str(export_dir)]) == 0
    assert_onnx_captions_as_torch(directory, export_dir, photos)


def test_a_load_in_run_exports_in_fp32_and_a_retrieval_model_is_refused(captioner_dirs, tmp_path, capsys):
    quantised = tmp_path / "load-in"
    shutil.copytree(captioner_dirs["full"], quantised)
    (quantised / "frozen_lm.json").write_text(json.dumps({"load_in": "8bit"}))  # trained with --load-in 8bit
    assert main(["export", "--model", str(quantised), "--output-dir", str(tmp_path / "out")]) == 0
    assert "decoder.onnx" in capsys.readouterr().out  # the LM as trained, in fp32 (a quantised LM did not export)
    retrieving = tmp_path / "retrieval"
    shutil.copytree(captioner_dirs["full"], retrieving)
    (retrieving / "datastore").mkdir()
    explain = ["explain", str(write_photo(tmp_path / "p.png")), "--output", str(tmp_path / "e.png")]
    for argv in (["export", "--output-dir", str(tmp_path / "out2")], explain):
        assert main([*argv, "--model", str(retrieving)]) == 2
        error = capsys.readouterr().err.strip()
        assert f"--model {retrieving} was trained with retrieval prompts (its datastore/)" in error, error
