"""XGPT in the package: its family and presets, `itune params`, the processor, `build_for_training`, the Auto classes,
remote code where itune_hf is not installed, and `pipeline("image-to-text")`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, pipeline

import itune_hf  # noqa: F401  (registers the Auto classes and the pipeline)
from itune_hf.cli import main
from itune_hf.hub import save_captioner
from itune_hf.models import family_of, get_family
from itune_hf.models.xgpt import XGPTConfig, XGPTForCaptioning, XGPTProcessor
from itune_hf.presets import build_model, build_processor, get_preset
from itune_hf.training.config import TrainingConfig

from conftest import run_where_itune_hf_is_not_installed, write_photo

REPO_ROOT = Path(__file__).resolve().parents[2]
PRESET = "xgpt-tiny-random"


@pytest.fixture(scope="module")
def captioner_dir(tmp_path_factory):
    """A saved xgpt-tiny-random captioner (full checkpoint, its code and its processor)."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("xgpt") / "captioner"
    return save_captioner(build_model(PRESET), directory, processor=build_processor(PRESET))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    return [str(write_photo(root / f"photo{i}.png", color=c)) for i, c in enumerate(colors)]


def direct_captions(model_dir, images, **generate_kwargs) -> list[str]:
    model = XGPTForCaptioning.from_pretrained(model_dir).eval()
    processor = XGPTProcessor.from_pretrained(model_dir)
    return processor.batch_decode(model.generate(**processor(images=images), **generate_kwargs))


# ------------------------------------------------------------------------------------------------------------------
# Family, presets, itune params
# ------------------------------------------------------------------------------------------------------------------
def test_the_family_is_registered_and_saves_full_models():
    family = get_family("xgpt")
    assert family.saves == "full" and family.save_adapter is None and family.model_type == "xgpt"
    assert family.load("model_class") is XGPTForCaptioning and family.load("processor_class") is XGPTProcessor
    assert family_of(XGPTConfig()) is family


def test_processors_open_images_the_same_way():
    # Remote code makes each processor carry open_image (the shared helpers are generated copies: tools/fix_copies.py).
    import inspect

    from itune_hf.models.ituning.processing_ituning import ITuningProcessor
    from itune_hf.models.xgpt.processing_xgpt import XGPTProcessor

    assert inspect.getsource(XGPTProcessor.open_image) == inspect.getsource(ITuningProcessor.open_image)


@pytest.mark.parametrize(("name", "layers"), [("xgpt-base", 12), ("xgpt-tiny", 6)])
def test_paper_presets(name, layers):
    preset = get_preset(name)
    assert preset.family_name == "xgpt" and preset.text is None
    config = preset.config()
    assert (config.architecture, config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (
        "encdec_share", layers, 768, 8,
    )  # fmt: skip
    assert config.hidden_act == "gelu" and config.hidden_dropout_prob == 0.1 and config.max_position_embeddings == 60
    assert config.use_aoa_refiner and config.visual_source == "grid" and config.grid_size == 10
    assert config.vision_config._name_or_path == "openai/clip-vit-base-patch16"


def test_ituning_presets_are_unchanged():
    preset = get_preset("itune-gpt2-base")
    assert preset.text.hub_id == "gpt2" and preset.tokenizer is None and preset.tokenizer_spec == {"offline": "gpt2"}
    assert preset.config().text_config._name_or_path == "gpt2"


def test_params_prints_the_parts_and_ends_with_the_trainable_count(capsys):
    assert main(["params", "--preset", PRESET]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    model = build_model(PRESET)
    expected = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lines[-1] == str(expected)
    assert any(line.startswith("architecture: encdec_share, 2 layers") for line in lines)
    assert f"  layers (encoder and decoder): {model.parameter_counts()['layers (encoder and decoder)']:,}" in lines
    others = next(line for line in lines if line.startswith("trainable in the other architectures"))
    encdec = build_model(PRESET, architecture="encdec")
    assert f"encdec {sum(p.numel() for p in encdec.parameters() if p.requires_grad):,}" in others


def test_params_refuses_ituning_options_for_xgpt(capsys):
    assert main(["params", "--preset", "xgpt-base", "--first-layer", "3"]) == 2
    assert "--first-layer only apply to I-Tuning presets; xgpt-base is a xgpt preset" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# Processor
# ------------------------------------------------------------------------------------------------------------------
def test_processor_training_and_generation_inputs(photos):
    processor = build_processor(PRESET)
    assert processor.max_caption_length == 60 and processor.bos_token_id == processor.eos_token_id == 50256
    batch = processor(images=photos[:2], captions=["a red square", "a green square on a table"])
    caption = processor.tokenizer("a red square", add_special_tokens=False)["input_ids"]
    assert batch["decoder_input_ids"][0, : len(caption) + 1].tolist() == [50256, *caption]
    assert batch["labels"][0, : len(caption) + 1].tolist() == [*caption, 50256]
    assert batch["labels"][0, len(caption) + 1 :].eq(-100).all() and batch["pixel_values"].shape == (2, 3, 32, 32)
    processor.max_caption_length = 4
    assert processor(images=photos[0], captions="a green square on a table")["labels"].shape == (1, 3)
    prompts = processor(images=photos[:2], text=["a", None])
    assert prompts["decoder_attention_mask"].tolist() == [[1, 1], [0, 1]]  # left padding


def test_processor_maps_boxes_into_the_cropped_frame(tmp_path):
    processor = build_processor(PRESET)  # CLIP-style: shortest edge 32, centre crop 32 x 32
    wide = write_photo(tmp_path / "wide.png", size=(60, 40))  # resized to 48 x 32, cropped from x = 8
    inputs = processor(images=[wide, wide], boxes=[[[0.2, 0.0, 0.5, 0.5]], [[0.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.6, 1]]])
    torch.testing.assert_close(inputs["region_boxes"][0, 0], torch.tensor([0.05, 0.0, 0.5, 0.5]))
    torch.testing.assert_close(inputs["region_boxes"][1, 0], torch.tensor([0.0, 0.0, 1.0, 1.0]))  # clipped
    assert inputs["region_mask"].tolist() == [[1, 0], [1, 1]]
    with pytest.raises(ValueError, match="normalised x1, y1, x2, y2"):
        processor(images=wide, boxes=[[[10, 10, 20, 20]]])
    # the call's own image options move the boxes as they move the pixels
    uncropped = processor(images=[wide], boxes=[[[0.2, 0.0, 0.5, 0.5]]], do_center_crop=False)
    assert tuple(uncropped["pixel_values"].shape[-2:]) == (32, 48)
    torch.testing.assert_close(uncropped["region_boxes"][0, 0], torch.tensor([0.2, 0.0, 0.5, 0.5]))
    small = processor(images=[wide], boxes=[[[0.2, 0.0, 0.5, 0.5]]], size=16, crop_size=16)
    assert tuple(small["pixel_values"].shape[-2:]) == (16, 16)
    torch.testing.assert_close(small["region_boxes"][0, 0], inputs["region_boxes"][0, 0])  # the same geometry, halved


def test_boxes_model_end_to_end(photos):
    model = build_model(PRESET, visual_source="boxes").eval()
    processor = build_processor(PRESET)
    inputs = processor(images=photos[:2], boxes=[[[0, 0, 0.5, 0.5], [0.5, 0, 1, 1]], [[0.2, 0.2, 0.8, 0.8]]])
    assert model.get_encoder()(**{k: inputs[k] for k in ("pixel_values", "region_boxes", "region_mask")})[
        "last_hidden_state"
    ].shape == (2, 3, 32)  # CLS + up to 2 boxes
    assert model.generate(**inputs, max_length=6).shape[0] == 2


def test_processor_pads_precomputed_region_features():
    processor = XGPTProcessor(tokenizer=build_processor(PRESET).tokenizer)  # regions need no image processor
    inputs = processor(
        region_features=[torch.ones(2, 8), torch.ones(3, 8)], boxes=[[[0, 0, 1, 1]] * 2, [[0, 0, 1, 1]] * 3]
    )
    assert inputs["region_features"].shape == (2, 3, 8) and inputs["region_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert inputs["decoder_input_ids"].shape == (2, 1)


# ------------------------------------------------------------------------------------------------------------------
# build_for_training
# ------------------------------------------------------------------------------------------------------------------
def test_build_for_training_trains_everything_but_the_vision_tower(tmp_path):
    built = get_family("xgpt").load("build_for_training")(
        TrainingConfig(output_dir=str(tmp_path), preset=PRESET, max_caption_length=30)
    )
    assert built.model is built.base and isinstance(built.model, XGPTForCaptioning)
    assert built.processor.max_caption_length == 30 and built.settings.architecture == "encdec_share"
    frozen = {n for n, p in built.model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith("model.encoder.vision_model.") for n in frozen)
    assert built.trainable_parameters == sum(
        c for part, c in built.model.parameter_counts().items() if part != "vision tower (frozen)"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_heads": 2}, "--num-heads: I-Tuning adapter settings"),
        ({"max_caption_length": 61}, "exceeds the model's 60 text positions"),
        ({"preset": None, "vision_model": "v", "text_model": "t"}, "XGPT is built from a preset"),
        ({"preset": "itune-tiny-random"}, "builds a ituning model"),
    ],
)
def test_build_for_training_refuses_what_xgpt_cannot_honour(tmp_path, overrides, message):
    config = TrainingConfig(output_dir=str(tmp_path), **{"preset": PRESET, **overrides})
    with pytest.raises(ValueError, match=message):
        get_family("xgpt").load("build_for_training")(config)


# ------------------------------------------------------------------------------------------------------------------
# Auto classes, remote code, pipeline
# ------------------------------------------------------------------------------------------------------------------
def test_auto_classes_resolve_the_xgpt_classes(captioner_dir, photos):
    assert isinstance(AutoConfig.from_pretrained(captioner_dir), XGPTConfig)
    assert isinstance(AutoProcessor.from_pretrained(captioner_dir), XGPTProcessor)
    model = AutoModelForImageTextToText.from_pretrained(captioner_dir)
    assert type(model) is XGPTForCaptioning
    assert not any(p.requires_grad for p in model.vision_model.parameters())
    config = json.loads((captioner_dir / "config.json").read_text())
    assert config["auto_map"]["AutoModelForImageTextToText"].endswith("modeling_xgpt.XGPTForCaptioning")


@pytest.mark.slow
def test_full_checkpoint_loads_with_remote_code_where_itune_hf_is_not_installed(captioner_dir, photos, tmp_path):
    assert {
        "configuration_xgpt.py", "modeling_xgpt.py", "processing_xgpt.py", "settings.py", "images.py",
    } <= {p.name for p in captioner_dir.iterdir()}  # fmt: skip
    model = XGPTForCaptioning.from_pretrained(captioner_dir).eval()
    expected = model.generate(**XGPTProcessor.from_pretrained(captioner_dir)(images=photos[0]), max_length=8)
    call = f"model.generate(**processor(images={photos[0]!r}), max_length=8)"
    module, ids = run_where_itune_hf_is_not_installed(captioner_dir, call, tmp_path)
    assert module.startswith("transformers_modules.")  # the checkpoint's own copy of the code
    assert ids == expected.tolist()


def test_image_to_text_pipeline(captioner_dir, photos):
    captioner = pipeline("image-to-text", model=str(captioner_dir))
    one = captioner(photos[0], max_length=8)
    assert one == [{"generated_text": direct_captions(captioner_dir, photos[:1], max_length=8)[0]}]
    many = captioner(photos, num_beams=1, max_new_tokens=5, batch_size=2)
    assert [r[0]["generated_text"] for r in many] == direct_captions(
        captioner_dir, photos, num_beams=1, max_new_tokens=5
    )


@pytest.mark.parametrize("architecture", ["enc", "encdec", "encdec_share"])
def test_batched_prompts_of_different_lengths_continue_as_alone(architecture, photos):
    torch.manual_seed(0)
    model = build_model(PRESET, architecture=architecture).eval()
    processor = build_processor(PRESET)
    prompts = ["a photo of a big", "the"]  # left-padded in the batch: positions and masks must skip the padding
    together = model.generate(**processor(images=photos[:2], text=prompts), num_beams=1, max_new_tokens=5)
    for row, (photo, prompt) in enumerate(zip(photos, prompts)):
        alone = model.generate(**processor(images=photo, text=prompt), num_beams=1, max_new_tokens=5)[0]
        assert together[row, -5:].tolist() == alone[-5:].tolist()


def test_itune_caption_speed_flags_are_refused_for_xgpt_with_the_reason(captioner_dir, photos, capsys):
    assert main(["caption", photos[0], "--model", str(captioner_dir), "--vocabulary", photos[0] + ".txt"]) == 2
    assert "apply to I-Tuning captioners; XGPTForCaptioning runs without them" in capsys.readouterr().err
