"""Cross-attentions out of forward/generate (shaped like VisionEncoderDecoder's, without sdpa's warning) and
`itune explain`'s heatmaps: decoding as the model's generation config unless told, families it does not draw refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from itune_hf.cli import main
from itune_hf.explain import explain_caption, patch_grid_shape, visible_region
from itune_hf.presets import build_model, build_processor

from conftest import write_photo


@pytest.fixture(scope="module")
def tiny():
    """The tiny preset with outputs large enough that the modules change the captions."""
    torch.manual_seed(0)
    model = build_model("itune-tiny-random").eval()
    for module in model.ituning.values():
        torch.nn.init.normal_(module.o_proj.weight, std=0.5)
    return model, build_processor("itune-tiny-random")


def pixels(model, batch=2):
    size = model.config.vision_config.image_size
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(3))


def test_forward_returns_one_attention_per_module_without_changing_the_logits(tiny):
    model, _ = tiny
    ids = torch.tensor([[0, 5, 6, 7], [0, 8, 9, 10]])
    plain = model(pixel_values=pixels(model), decoder_input_ids=ids)
    explained = model(pixel_values=pixels(model), decoder_input_ids=ids, output_attentions=True)
    assert plain.cross_attentions is None
    torch.testing.assert_close(explained.logits, plain.logits, rtol=1e-5, atol=1e-5)  # unfused == fused
    visual = model.config.vision_config
    tokens = (visual.image_size // visual.patch_size) ** 2 + 1
    assert len(explained.cross_attentions) == len(model.image_layers())
    for attention in explained.cross_attentions:
        assert attention.shape == (2, model.config.num_heads, 4, tokens)
        torch.testing.assert_close(attention.sum(-1), torch.ones(2, model.config.num_heads, 4))
    with model.disable_ituning():
        assert model(pixel_values=pixels(model), decoder_input_ids=ids, output_attentions=True).cross_attentions is None


@pytest.mark.parametrize("beams", [1, 3])
def test_generate_returns_the_attention_of_every_step(tiny, beams):
    model, _ = tiny
    images = pixels(model)
    out = model.generate(
        pixel_values=images,
        num_beams=beams,
        max_new_tokens=4,
        min_new_tokens=4,
        output_attentions=True,
        return_dict_in_generate=True,
    )
    assert len(out.cross_attentions) == 4  # one entry per generated token, as VisionEncoderDecoder's
    for step in out.cross_attentions:
        assert len(step) == len(model.image_layers())
        assert step[0].shape[:3] == (2 * beams, model.config.num_heads, 1)
    if beams == 1:  # greedy: step t's attention is the teacher-forced attention at position t of the same caption
        forced = model(pixel_values=images, decoder_input_ids=out.sequences[:, :-1], output_attentions=True)
        for t, step in enumerate(out.cross_attentions):
            for module, attention in enumerate(step):
                torch.testing.assert_close(attention[:, :, 0], forced.cross_attentions[module][:, :, t])


def test_explanation_has_one_map_per_word_and_follows_the_chosen_layer(tiny):
    model, processor = tiny
    image = Image.fromarray((np.random.RandomState(0).rand(40, 60, 3) * 255).astype("uint8"))
    everything = explain_caption(model, processor, image, num_beams=3, max_new_tokens=6)
    assert everything.caption == processor.decode(
        model.generate(**processor(images=[image], return_tensors="pt"), num_beams=3, max_new_tokens=6)[0],
        skip_special_tokens=True,
    )
    assert len(everything.tokens) == everything.heatmaps.shape[0] == everything.cls_attention.shape[0] > 0
    assert everything.heatmaps.shape[1:] == (4, 4)  # 32 px / 8 px patches
    np.testing.assert_allclose(everything.heatmaps.sum((1, 2)) + everything.cls_attention, 1.0, rtol=1e-5)
    first, second = (explain_caption(model, processor, image, num_beams=3, max_new_tokens=6, layer=i) for i in (1, 2))
    assert first.layers == [1] and not np.allclose(first.heatmaps, second.heatmaps)
    np.testing.assert_allclose((first.heatmaps + second.heatmaps) / 2, everything.heatmaps, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="--layer 0 has no I-Tuning attention; choose one of \\[1, 2\\]"):
        explain_caption(model, processor, image, layer=0)


def test_grid_geometry():
    assert patch_grid_shape(197, has_cls=True) == (14, 14)
    assert patch_grid_shape(196, has_cls=False) == (14, 14)
    with pytest.raises(ValueError, match="not a square grid"):
        patch_grid_shape(150, has_cls=True)

    class ClipLike:  # shortest edge 224, centre crop 224: a 448 x 224 image shows its central 224 x 224
        do_center_crop, crop_size, size = True, {"height": 224, "width": 224}, {"shortest_edge": 224}

    assert visible_region((448, 224), ClipLike()) == (112.0, 0.0, 336.0, 224.0)
    assert visible_region((100, 50), object()) == (0.0, 0.0, 100.0, 50.0)
    from transformers import CLIPImageProcessor

    real = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})  # sizes: SizeDicts
    assert visible_region((256, 192), real) == (32.0, 0.0, 224.0, 192.0)  # the central 192 x 192, as it sees it


def test_itune_explain_writes_a_png_and_prints_the_caption(captioner_dirs, tmp_path, capsys):
    photo = write_photo(tmp_path / "photo.png")
    output = tmp_path / "heat.png"
    command = ["explain", str(photo), "--model", str(captioner_dirs["adapter"]), "--output", str(output)]
    assert main([*command, "--num-beams", "1", "--max-new-tokens", "5"]) == 0
    path, caption = capsys.readouterr().out.strip().split("\t")
    assert path == str(photo) and caption
    with Image.open(output) as figure:
        assert figure.format == "PNG" and figure.width > 300
    assert main([*command, "--layer", "0"]) == 2
    assert "--layer 0 has no I-Tuning attention" in capsys.readouterr().err
    assert main([*command[:-1], str(tmp_path / "heat.jpg")]) == 2
    assert "give a path ending in .png" in capsys.readouterr().err


@pytest.mark.slow
def test_docs_snippets_run_as_written(captioner_dirs, tmp_path):
    from conftest import code_blocks, run_python_snippet

    page = (Path(__file__).resolve().parents[1] / "docs" / "captioning.md").read_text()
    section = page[page.index("## Where the captioner looks") : page.index("## Try it in the browser")]
    (command,) = code_blocks(section, "bash")
    (snippet,) = code_blocks(section, "python")
    photo, heat = write_photo(tmp_path / "photo.jpg"), tmp_path / "heat.png"
    names = {"outputs/demo": str(captioner_dirs["adapter"]), "photo.jpg": str(photo), "heat.png": str(heat)}
    arguments = command.split()[1:]
    assert main([names.get(word, word) for word in arguments]) == 0 and heat.exists()
    heat.unlink()
    out = run_python_snippet(snippet, {f'"{old}"': repr(new) for old, new in names.items()})
    assert "(" in out and heat.exists()


def test_a_model_without_attention_over_the_image_is_refused_with_the_reason():
    with pytest.raises(
        ValueError, match="needs an I-Tuning or XGPT captioner: .*does not draw Linear's \\(not a captioner"
    ):
        explain_caption(torch.nn.Linear(1, 1), None, np.zeros((32, 32, 3), dtype=np.uint8))


def test_itune_explain_decodes_as_the_models_generation_config_unless_told(captioner_dirs, tmp_path, capsys):
    from itune_hf.models.loading import load_captioner

    from conftest import write_photo

    photo = write_photo(tmp_path / "photo.png")
    model, processor = load_captioner(str(captioner_dirs["full"]))
    command = ["explain", str(photo), "--model", str(captioner_dirs["full"]), "--output", str(tmp_path / "h.png")]
    for beams in (None, 1):
        assert main([*command, "--max-new-tokens", "4", *(["--num-beams", str(beams)] if beams else [])]) == 0
        printed = capsys.readouterr().out.strip().split("\t")[1]
        ids = model.generate(
            **processor(images=[str(photo)]), max_new_tokens=4, **({"num_beams": beams} if beams else {})
        )
        assert printed == processor.batch_decode(ids)[0].strip(), beams


def test_explain_refuses_a_family_it_does_not_draw_without_a_wrong_reason():
    from itune_hf.explain import attention_source
    from itune_hf.presets import build_model

    for preset in ("crossattn-tiny-random", "clipcap-mlp-tiny-random"):
        with pytest.raises(ValueError, match="needs an I-Tuning or XGPT captioner") as error:
            attention_source(build_model(preset))
        assert "no attention over the image" not in str(error.value)  # cross-attention attends over the image
        assert "does not draw the " in str(error.value)


def test_ituning_generate_with_output_attentions_warns_nothing_and_returns_the_modules_attention(monkeypatch):
    import transformers.integrations.sdpa_attention as sdpa

    from itune_hf.presets import build_model, build_processor

    warned = []
    monkeypatch.setattr(sdpa.logger, "warning_once", lambda *args, **kwargs: warned.append(args))
    model, processor = build_model("itune-tiny-random").eval(), build_processor("itune-tiny-random")
    assert model.vision_model.config._attn_implementation == "sdpa"
    inputs = processor(images=[np.zeros((32, 32, 3), dtype=np.uint8)])
    plain = model.generate(**inputs, num_beams=1, max_new_tokens=3)
    out = model.generate(**inputs, num_beams=1, max_new_tokens=3, output_attentions=True, return_dict_in_generate=True)
    assert not warned
    assert torch.equal(out.sequences, plain)
    assert len(out.cross_attentions) == out.sequences.shape[1] - 1
    assert all(len(step) == len(model.image_layers()) for step in out.cross_attentions)


@pytest.mark.parametrize("beams", [1, 3])
def test_explain_captions_exactly_as_itune_caption_with_a_caption_prefix(tmp_path, capsys, beams):
    """A processor with a caption prefix (the demo's and the SmolLM2 presets' "\\n") starts every caption after it:
    `itune explain` (and the web page, which explains through `explain_caption`) must decode from the same start."""
    model = build_model("itune-tiny-random").eval()
    torch.manual_seed(0)
    for parameter in model.parameters():  # a tiny random LM at init repeats one token whatever it starts from
        if parameter.dim() == 2:
            torch.nn.init.normal_(parameter, std=0.3)
    processor = build_processor("itune-tiny-random")
    processor.caption_prefix = " the"
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    photo = write_photo(tmp_path / "photo.png")
    options = ["--num-beams", str(beams), "--max-new-tokens", "6"]
    assert main(["caption", str(photo), "--model", str(folder), *options]) == 0
    captioned = capsys.readouterr().out.strip().split("\t")[1]
    assert main(["explain", str(photo), "--model", str(folder), "--output", str(tmp_path / "h.png"), *options]) == 0
    explained = capsys.readouterr().out.strip().split("\t")[1]
    assert explained == captioned
    explanation = explain_caption(model, processor, str(photo), num_beams=beams, max_new_tokens=6)
    assert explanation.caption.strip() == captioned
    assert len(explanation.tokens) == len(explanation.heatmaps) and 0 < len(explanation.tokens) <= 6
