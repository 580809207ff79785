"""IDA's attention-driven image-text matching (XGPT section 4.3) reads the regions' representation x^I of section 3
(features and boxes projected to the hidden size), not the AoA-refined x' of appendix A.1 that the encoder reads."""

from __future__ import annotations

import torch

from itune_hf.models.xgpt import XGPTConfig, XGPTForCaptioning

from conftest import tiny_vision_config

HIDDEN, REGIONS, WORDS = 32, 5, 4


def tiny_xgpt() -> XGPTForCaptioning:
    config = XGPTConfig(
        vision_config=tiny_vision_config().to_dict(), hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, vocab_size=50, grid_size=None, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    return XGPTForCaptioning(config).eval()


def test_ida_matches_words_with_the_regions_before_the_aoa_refiner():
    encoder = tiny_xgpt().model.encoder
    assert encoder.refiner is not None  # the preset's setting: the refined regions differ from x^I
    generator = torch.Generator().manual_seed(1)
    states = torch.randn(2, 17, encoder.config.region_feature_size, generator=generator)  # the tower's 4x4 + CLS
    text = torch.randn(2, WORDS, HIDDEN, generator=generator)
    with torch.no_grad():
        out = encoder(vision_hidden_states=states, text_embeds=text, align_text=True, output_hidden_states=True)
        features, boxes, mask = encoder.regions(None, states, None, None, None)
        projected = encoder.region_embedding(features, boxes)  # x^I
        refined = encoder.refiner(projected, mask.bool()[:, None, None, :])  # x'
        count = projected.shape[1]
        first_layer_input = out.hidden_states[0]
        assert torch.allclose(first_layer_input[:, :count], refined)  # the encoder reads x'
        matched = first_layer_input[:, count:]
        assert torch.allclose(matched, encoder.text.align(text, projected, mask), atol=1e-6)  # IDA reads x^I
        assert not torch.allclose(matched, encoder.text.align(text, refined, mask), atol=1e-3)
