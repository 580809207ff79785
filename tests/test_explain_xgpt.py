"""XGPT's attention over its regions: `output_attentions` of forward/generate (shaped like VisionEncoderDecoder's
`cross_attentions`), `explain_caption`'s boxes, `itune explain` and `itune serve`'s service for XGPT models."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from itune_hf.cli import main
from itune_hf.explain import Explanation, draw_explanation, explain_caption
from itune_hf.presets import build_model, build_processor

from conftest import write_photo

PRESET = "xgpt-tiny-random"
REGIONS = 17  # CLS + the 4 x 4 patches of the tiny CLIP tower


def speaking(model):
    """The model in eval mode, never ending a caption at once (its random weights would often pick EOS first)."""
    with torch.no_grad():
        model.lm_head.bias[model.config.eos_token_id] = -1e4
    return model.eval()


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return speaking(build_model(PRESET)), build_processor(PRESET)


@pytest.fixture(scope="module")
def image():
    return Image.fromarray((np.random.RandomState(0).rand(40, 60, 3) * 255).astype("uint8"))


def pixels(batch=2):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("architecture", ["encdec_share", "encdec"])  # enc decodes as encdec_share does
def test_forward_returns_the_attention_over_the_regions_without_changing_the_logits(architecture):
    torch.manual_seed(0)
    model = build_model(PRESET, architecture=architecture).eval()
    ids = torch.tensor([[50256, 5, 6, 7], [50256, 8, 9, 10]])
    plain = model(pixel_values=pixels(), decoder_input_ids=ids)
    explained = model(pixel_values=pixels(), decoder_input_ids=ids, output_attentions=True)
    assert plain.cross_attentions is None and plain.memory_shares is None
    torch.testing.assert_close(explained.logits, plain.logits, rtol=1e-5, atol=1e-5)  # unfused == fused
    heads, layers = model.config.num_attention_heads, model.config.num_hidden_layers
    assert len(explained.cross_attentions) == len(explained.decoder_attentions) == layers
    for cross, own, share in zip(explained.cross_attentions, explained.decoder_attentions, explained.memory_shares):
        assert cross.shape == (2, heads, 4, REGIONS) and own.shape == (2, heads, 4, 4)
        torch.testing.assert_close(cross.sum(-1), torch.ones(2, heads, 4))  # rows sum to 1 over the regions
        torch.testing.assert_close(own.sum(-1), torch.ones(2, heads, 4))
        assert torch.all(own.triu(diagonal=1) == 0)  # causal over the caption prefix
        if architecture == "encdec":
            assert torch.all(share == 1)
        else:
            assert torch.all((share > 0) & (share < 1))
    assert explained.encoder_attentions[0].shape == (2, heads, REGIONS, REGIONS)


@pytest.mark.parametrize("beams", [1, 2])
def test_generate_returns_the_attention_of_every_step_and_the_same_tokens(tiny, beams):
    model, _ = tiny
    images = pixels()
    options = {"pixel_values": images, "num_beams": beams, "max_new_tokens": 3}
    plain = model.generate(**options)
    out = model.generate(**options, output_attentions=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert len(out.cross_attentions) == out.sequences.shape[1] - 1 == 3  # one entry per generated token
    for step in out.cross_attentions:
        assert len(step) == model.config.num_hidden_layers
        assert step[0].shape == (2 * beams, model.config.num_attention_heads, 1, REGIONS)
        torch.testing.assert_close(step[-1].sum(-1), torch.ones(step[-1].shape[:3]))
    if beams == 1:  # greedy: step t's attention is the teacher-forced attention at position t of the same caption
        forced = model(pixel_values=images, decoder_input_ids=out.sequences[:, :-1], output_attentions=True)
        for t, step in enumerate(out.cross_attentions):
            for layer, attention in enumerate(step):
                torch.testing.assert_close(attention[:, :, 0], forced.cross_attentions[layer][:, :, t])


def test_explanation_of_grid_regions_has_boxes_and_follows_the_chosen_layer(tiny, image):
    model, processor = tiny
    everything = explain_caption(model, processor, image, num_beams=2, max_new_tokens=3)
    expected = model.generate(**processor(images=[image]), num_beams=2, max_new_tokens=3)[0]
    assert everything.caption == processor.decode(expected, skip_special_tokens=True)
    assert everything.family == "XGPT" and everything.source == "grid" and len(everything.tokens) == 3
    assert everything.boxes.shape == (16, 4) and everything.region_attention.shape == (3, 16)
    np.testing.assert_allclose(everything.boxes[5], [0.25, 0.25, 0.5, 0.5])  # row 1, column 1 of the 4 x 4 grid
    np.testing.assert_allclose(everything.region_attention.sum(1) + everything.cls_attention, 1.0, rtol=1e-5)
    assert everything.heatmaps.shape == (3, 4, 4) and 0 < everything.memory_share.min() <= 1
    first, second = (explain_caption(model, processor, image, num_beams=2, max_new_tokens=3, layer=i) for i in (0, 1))
    assert first.layers == [0] and not np.allclose(first.region_attention, second.region_attention)
    mean = (first.region_attention + second.region_attention) / 2
    np.testing.assert_allclose(mean, everything.region_attention, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="--layer 2 has no XGPT attention; choose one of \\[0, 1\\]"):
        explain_caption(model, processor, image, layer=2)
    with pytest.raises(ValueError, match="visual_source='grid'.*not boxes"):
        explain_caption(model, processor, image, boxes=[[0, 0, 1, 1]])


def drawn(image, explanation: Explanation) -> np.ndarray:
    from itune_hf.app import figure_to_image

    return np.asarray(figure_to_image(draw_explanation(image, explanation)), dtype=np.int16)


def undrawn(explanation: Explanation) -> Explanation:
    """The same panels and titles with nothing laid over the image."""
    return dataclasses.replace(explanation, boxes=None, heatmaps=None, note=" ")


def test_object_boxes_are_the_regions_and_are_drawn(image):
    torch.manual_seed(0)
    model, processor = speaking(build_model(PRESET, visual_source="boxes")), build_processor(PRESET)
    square = image.crop((0, 0, 40, 40))  # no crop: the boxes keep their coordinates in the frame the model saw
    boxes = [[0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 1.0, 1.0], [0.5, 0.0, 1.0, 0.25]]
    explanation = explain_caption(model, processor, square, max_new_tokens=2, boxes=boxes)
    assert explanation.source == "boxes" and explanation.heatmaps is None
    np.testing.assert_allclose(explanation.boxes, boxes, atol=1e-6)
    assert explanation.region_attention.shape == (2, 3)
    np.testing.assert_allclose(explanation.region_attention.sum(1) + explanation.cls_attention, 1.0, rtol=1e-5)
    with_boxes, plain = drawn(square, explanation), drawn(square, undrawn(explanation))
    assert with_boxes.shape == plain.shape and (np.abs(with_boxes - plain).max(-1) > 30).mean() > 0.01
    with pytest.raises(ValueError, match="pools its regions in object boxes.*--boxes"):
        explain_caption(model, processor, square)


def test_detector_regions_have_no_cls_and_need_their_features(image):
    torch.manual_seed(0)
    model = speaking(build_model(PRESET, visual_source="regions", region_feature_size=8))
    processor = build_processor(PRESET)
    boxes = torch.tensor([[[0.1, 0.1, 0.6, 0.9], [0.4, 0.2, 0.9, 0.5]]])
    regions = {"region_features": torch.randn(1, 2, 8), "region_boxes": boxes, "region_mask": torch.ones(1, 2)}
    explanation = explain_caption(model, processor, image, max_new_tokens=3, regions=regions)
    np.testing.assert_allclose(explanation.boxes, boxes[0].numpy())
    assert not explanation.cls_attention.any()
    np.testing.assert_allclose(explanation.region_attention.sum(1), 1.0, rtol=1e-5)
    assert "CLS" not in draw_explanation(image, explanation).axes[1].get_title()
    with pytest.raises(ValueError, match="precomputed region features.*--region-features"):
        explain_caption(model, processor, image)


def test_positions_without_boxes_are_said_never_drawn(image):
    attention = np.full((2, 3), 1 / 3)
    note = "the model attended over 3 memory positions but only 0 are image regions with a box"
    explanation = Explanation(
        "a cat", ["a", "cat"], None, np.zeros(2), [0], [0], source="grid", region_attention=attention, note=note
    )
    figure = draw_explanation(image, explanation)
    assert any(note[:30] in text.get_text().replace("\n", " ") for text in figure.axes[1].texts)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from itune_hf.hub import save_captioner

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("xgpt-explain") / "model"
    return save_captioner(speaking(build_model(PRESET)), directory, processor=build_processor(PRESET))


def test_itune_explain_draws_the_regions_of_an_xgpt_model(checkpoint, tmp_path, capsys):
    from itune_hf.models.loading import load_captioner

    photo = write_photo(tmp_path / "photo.png", size=(48, 40), color=(200, 30, 30))
    output = tmp_path / "boxes.png"
    command = ["explain", str(photo), "--model", str(checkpoint), "--output", str(output), "--max-new-tokens", "2"]
    assert main([*command, "--num-beams", "1"]) == 0
    path, caption = capsys.readouterr().out.strip().split("\t")
    model, processor = load_captioner(str(checkpoint))
    explanation = explain_caption(model, processor, photo, max_new_tokens=2)
    assert caption == explanation.caption and len(explanation.tokens) == 2
    with Image.open(output) as figure:
        assert figure.format == "PNG"
        written = np.asarray(figure.convert("RGB"), dtype=np.int16)
    plain = np.asarray(
        Image.open(_saved(photo, undrawn(explanation), tmp_path / "plain.png", processor)).convert("RGB"),
        dtype=np.int16,
    )
    assert written.shape == plain.shape and (np.abs(written - plain).max(-1) > 30).mean() > 0.01  # boxes drawn
    assert main([*command, "--boxes", "[[0, 0, 1, 1]]"]) == 2
    assert "not boxes" in capsys.readouterr().err
    assert main([*command, "--boxes", "[[0, 0, 2]]"]) == 2
    assert "--boxes [[0, 0, 2]]: expected a non-empty list" in capsys.readouterr().err


def _saved(photo, explanation, path, processor):
    from itune_hf.explain import save_explanation

    return save_explanation(photo, explanation, path, image_processor=processor.image_processor)


def test_the_demo_service_explains_an_xgpt_model(tmp_path):
    from itune_hf.app import _check_servable, load_service

    service = load_service(PRESET)
    assert (service.family, service.layers, service.num_heads) == ("XGPT", [0, 1], 4)
    result = service.caption(write_photo(tmp_path / "photo.png"), num_beams=2, max_new_tokens=3, layer="1")
    assert result.figure is not None and "Model `xgpt-tiny-random`" in result.message, result.message
    assert "layer 1" in result.message
    with pytest.raises(ValueError, match="XGPT models are trained whole and have no adapters"):
        load_service(PRESET, ["some/adapter"])
    with pytest.raises(ValueError, match="reads object boxes .* the demo takes photos alone"):
        _check_servable("boxes-model", build_model(PRESET, visual_source="boxes"), [])
