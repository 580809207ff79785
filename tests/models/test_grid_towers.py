"""A convolutional vision tower (a feature map, not a token sequence): I-Tuning reads its grid cells as tokens, in
the forward pass, in generation, in the feature cache and in the tower's pre-training, and takes its width from the
config's `hidden_sizes`."""

from __future__ import annotations

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
    from itune_hf.feature_cache import _vision_states

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


def test_xgpt_refuses_a_convolutional_tower_by_name():
    from itune_hf import XGPTConfig

    from conftest import tiny_vision_config

    with pytest.raises(ValueError, match="the vision tower 'resnet' gives a feature map"):
        XGPTConfig(vision_config=tiny_vision_config("resnet").to_dict())
