"""A convolutional vision tower (a feature map, not a token sequence): I-Tuning reads its grid cells as tokens, in
the forward pass, in generation, in the feature cache and in the tower's pre-training, and takes its width from the
config's `hidden_sizes`; XGPT reads the cells as its grid regions, with their mean in place of CLS, in the forward
pass, generation (greedy and beam), from the feature cache, saved and loaded, and as remote code."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

from itune_hf.models._shared.backbones import as_vision_tokens, vision_width

from conftest import IMAGE_SIZE, tiny_model, tiny_processor


@pytest.fixture(scope="module")
def model():
    return tiny_model(vision="resnet")


def pixels(count: int = 2) -> torch.Tensor:
    return torch.randn(count, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0))


def test_the_feature_map_is_read_as_row_major_tokens_of_the_last_stage_width(model):
    assert not hasattr(model.config.vision_config, "hidden_size") or model.config.vision_config.hidden_size is None
    assert vision_width(model.config.vision_config) == 32
    feature_map = model.vision_model(pixel_values=pixels()).last_hidden_state  # (2, 32, 4, 4)
    states = model.encode_images(pixels()).last_hidden_state
    assert feature_map.shape == (2, 32, 4, 4) and states.shape == (2, 16, 32)
    assert torch.equal(states[:, 5], feature_map[:, :, 1, 1])  # cell (row 1, column 1) is token 1 * 4 + 1


def test_training_loss_and_generation_match_the_cached_states_path(model):
    decoder_input_ids = torch.tensor([[0, 5, 6, 7], [0, 8, 9, 10]])
    from_pixels = model(pixel_values=pixels(), decoder_input_ids=decoder_input_ids, labels=decoder_input_ids)
    states = model.encode_images(pixels()).last_hidden_state
    from_states = model(encoder_outputs=states, decoder_input_ids=decoder_input_ids, labels=decoder_input_ids)
    assert torch.isfinite(from_pixels.loss) and torch.allclose(from_pixels.loss, from_states.loss)
    for beams in (1, 3):
        generated = model.generate(pixel_values=pixels(), num_beams=beams, max_new_tokens=5)
        cached = model.generate(encoder_outputs=states, num_beams=beams, max_new_tokens=5)
        assert torch.equal(generated, cached), beams


def test_the_feature_cache_stores_the_tokens(model):
    from itune_hf.vision.feature_cache import _vision_states

    images = [Image.fromarray(np.full((IMAGE_SIZE, IMAGE_SIZE, 3), 40 * k, dtype=np.uint8)) for k in range(3)]
    image_processor = tiny_processor().image_processor
    cached = _vision_states(model.vision_model, image_processor, images, torch.float32)
    direct = model.encode_images(image_processor(images, return_tensors="pt")["pixel_values"]).last_hidden_state
    assert cached.shape == (3, 16, 32) and torch.allclose(cached, direct)


def test_token_sequences_pass_through_and_a_config_without_width_is_named():
    tokens = torch.randn(2, 5, 8)
    assert as_vision_tokens(tokens) is tokens

    class Bare:
        model_type = "mystery"

    with pytest.raises(ValueError, match="'mystery' has neither hidden_size nor hidden_sizes"):
        vision_width(Bare())


def test_a_frozen_batch_norm_tower_computes_as_at_inference_in_training_mode():
    model = tiny_model(vision="resnet")
    before = model.encode_images(pixels()).last_hidden_state
    statistics = model.vision_model.embedder.embedder.normalization.running_mean.clone()
    model.train()
    assert model.training and not model.vision_model.training
    assert torch.equal(model.encode_images(pixels()).last_hidden_state, before)
    assert torch.equal(model.vision_model.embedder.embedder.normalization.running_mean, statistics)
    model.vision_model.requires_grad_(True)  # a tower being trained trains as any module
    assert model.train().vision_model.training


def test_the_peft_adapter_type_builds_on_a_convolutional_tower_and_exports(tmp_path):
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig, save_adapter

    model = get_peft_model(tiny_model(vision="resnet", add_ituning_modules=False), ITuningAdapterConfig(first_layer=1))
    assert model.peft_config["default"].vision_hidden_size == 32
    decoder_input_ids = torch.tensor([[0, 5, 6, 7]])
    loss = model(pixel_values=pixels(1), decoder_input_ids=decoder_input_ids, labels=decoder_input_ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    native = tiny_model(vision="resnet")
    save_adapter(native, tmp_path / "adapter")  # the export records the tower's width too
    assert '"vision_hidden_size": 32' in (tmp_path / "adapter" / "adapter_config.json").read_text()


# ------------------------------------------------------------------------------------------------------- XGPT
@pytest.fixture(scope="module")
def xgpt():
    """A tiny XGPT (xgpt-tiny-random's settings) over the tiny ResNet, its trainable part moved from its init."""
    from itune_hf import XGPTConfig, XGPTForCaptioning
    from itune_hf.presets import get_preset

    from conftest import tiny_vision_config

    settings = get_preset("xgpt-tiny-random").settings
    torch.manual_seed(0)
    model = XGPTForCaptioning(XGPTConfig.from_vision_config(tiny_vision_config("resnet"), **settings)).eval()
    with torch.no_grad():
        for parameter in (p for p in model.parameters() if p.requires_grad):
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model


def test_xgpt_reads_the_feature_map_cells_as_grid_regions_and_their_mean_in_place_of_cls(xgpt):
    from itune_hf.families.xgpt.card import visual_input

    assert xgpt.config.reads_feature_map and xgpt.config.region_feature_size == 32
    feature_map = xgpt.vision_model(pixel_values=pixels()).last_hidden_state  # (2, 32, 4, 4)
    features, boxes, mask = xgpt.model.encoder.regions(pixels(), None, None, None, None)
    assert features.shape == (2, 17, 32) and boxes.shape == (2, 17, 4) and bool(mask.all())
    assert torch.allclose(features[:, 0], feature_map.mean(dim=(2, 3)), atol=1e-6)  # the global region, first
    assert torch.equal(features[:, 1 + 5], feature_map[:, :, 1, 1])  # then cell (row 1, column 1)
    assert boxes[0, 0].tolist() == [0.0, 0.0, 1.0, 1.0] and boxes[0, 1 + 5].tolist() == [0.25, 0.25, 0.5, 0.5]
    assert visual_input(xgpt.config).startswith("RESNET grid (every feature-map cell + their mean)")

    from itune_hf import XGPTConfig

    pooled = XGPTConfig.from_vision_config(xgpt.config.vision_config, grid_size=2, use_cls_region=False)
    regions, pooled_boxes, _ = xgpt.model.encoder.__class__(pooled).regions(None, feature_map, None, None, None)
    corner = feature_map[:, :, :2, :2].mean(dim=(2, 3))  # a 2 x 2 grid pools 2 x 2 cells each
    assert regions.shape == (2, 4, 32) and torch.allclose(regions[:, 0], corner, atol=1e-6)
    with pytest.raises(ValueError, match="differs from the width 32 of the vision tower"):
        XGPTConfig.from_vision_config(xgpt.config.vision_config, region_feature_size=64)


def test_xgpt_trains_and_generates_alike_from_pixels_the_feature_cache_and_the_feature_map(xgpt):
    from itune_hf.vision.feature_cache import _vision_states

    images = [Image.fromarray(np.full((IMAGE_SIZE, IMAGE_SIZE, 3), 60 * k, dtype=np.uint8)) for k in (1, 3)]
    image_processor = tiny_processor().image_processor
    values = image_processor(images, return_tensors="pt")["pixel_values"]
    cached = _vision_states(xgpt.vision_model, image_processor, images, torch.float32)  # what cache-features stores
    feature_map = xgpt.vision_model(pixel_values=values).last_hidden_state
    assert cached.shape == (2, 16, 32)
    labels = torch.tensor([[50256, 5, 6, 7], [50256, 8, 9, 10]])
    losses = [
        xgpt(**{name: value, "labels": labels}).loss
        for name, value in (("pixel_values", values), ("vision_hidden_states", cached),
                            ("vision_hidden_states", feature_map))
    ]  # fmt: skip
    assert torch.isfinite(losses[0]) and all(torch.allclose(losses[0], loss, atol=1e-5) for loss in losses[1:])
    for beams in (1, 2):
        generated = xgpt.generate(pixel_values=values, num_beams=beams, max_new_tokens=5)
        from_cache = xgpt.generate(vision_hidden_states=cached, num_beams=beams, max_new_tokens=5)
        assert torch.equal(generated, from_cache), beams


def _saved_xgpt(xgpt, directory):
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_processor

    return save_captioner(xgpt, directory, processor=build_processor("xgpt-tiny-random"))


def test_a_saved_xgpt_on_a_convolutional_tower_loads_and_captions_the_same(xgpt, tmp_path):
    from itune_hf.models.loading import load_captioner

    directory = _saved_xgpt(xgpt, tmp_path / "saved")
    loaded, _ = load_captioner(str(directory))
    assert loaded.config.reads_feature_map and not any(p.requires_grad for p in loaded.vision_model.parameters())
    for beams in (1, 2):
        expected = xgpt.generate(pixel_values=pixels(), num_beams=beams, max_new_tokens=5)
        assert torch.equal(loaded.generate(pixel_values=pixels(), num_beams=beams, max_new_tokens=5), expected)


@pytest.mark.slow
def test_a_saved_xgpt_on_a_convolutional_tower_loads_as_remote_code_without_itune_hf(xgpt, tmp_path):
    from itune_hf.presets import build_processor

    from conftest import run_where_itune_hf_is_not_installed, write_photo

    directory = _saved_xgpt(xgpt, tmp_path / "saved")
    photo = str(write_photo(tmp_path / "photo.png"))
    expected = xgpt.generate(**build_processor("xgpt-tiny-random")(images=[photo]), num_beams=2, max_new_tokens=4)
    call = f"model.generate(**processor(images=[{photo!r}]), num_beams=2, max_new_tokens=4)"
    module, ids = run_where_itune_hf_is_not_installed(directory, call, tmp_path)
    assert module.startswith("transformers_modules.") and ids == expected.tolist()


def test_explain_shows_xgpts_attention_over_the_feature_map_cells_and_their_mean_apart(xgpt):
    from itune_hf.explain import explain_caption
    from itune_hf.presets import build_processor

    model = copy.deepcopy(xgpt)
    with torch.no_grad():  # never ending a caption at once (random weights often pick EOS first)
        model.lm_head.bias[model.config.eos_token_id] = -1e4
    image = Image.fromarray((np.random.RandomState(0).rand(40, 60, 3) * 255).astype("uint8"))
    explanation = explain_caption(model, build_processor("xgpt-tiny-random"), image, num_beams=2, max_new_tokens=3)
    words = len(explanation.tokens)
    assert explanation.heatmaps.shape == (words, 4, 4) and explanation.boxes.shape == (16, 4)
    totals = explanation.region_attention.sum(-1) + explanation.cls_attention  # the mean region shown apart, as CLS
    assert words >= 1 and np.allclose(totals, 1.0, atol=1e-4)
