"""pipeline("image-to-text") and pipeline("image-text-to-text"), called exactly as users call them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import pipeline

import itune_hf  # noqa: F401  (registers the pipeline)
from itune_hf import ITuningForCaptioning
from itune_hf.pipelines import ImageToTextPipeline

from conftest import tiny_processor, write_photo


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    return [write_photo(root / f"photo{i}.png", color=c) for i, c in enumerate(colors)]


def direct_captions(model_dir, images, **generate_kwargs):
    model = ITuningForCaptioning.from_pretrained(model_dir).eval()
    processor = tiny_processor()
    return [processor.batch_decode(model.generate(**processor(images=image), **generate_kwargs))[0] for image in images]


@pytest.mark.parametrize("kind", ["full", "adapter"])
def test_image_to_text_returns_generated_text_per_image(captioner_dirs, photos, kind):
    captioner = pipeline("image-to-text", model=str(captioner_dirs[kind]))
    assert isinstance(captioner, ImageToTextPipeline)
    one = captioner(str(photos[0]), num_beams=3, max_new_tokens=6)
    assert one == [
        {"generated_text": direct_captions(captioner_dirs["full"], photos[:1], num_beams=3, max_new_tokens=6)[0]}
    ]
    many = captioner([str(p) for p in photos], num_beams=3, max_new_tokens=6)
    assert isinstance(many, list) and len(many) == 3 and all(len(r) == 1 for r in many)
    assert [r[0]["generated_text"] for r in many] == direct_captions(
        captioner_dirs["full"], photos, num_beams=3, max_new_tokens=6
    )


def test_batch_size_num_beams_and_max_new_tokens_are_honoured(captioner_dirs, photos):
    captioner = pipeline("image-to-text", model=str(captioner_dirs["full"]))
    images = [str(p) for p in photos]
    batched = captioner(images, batch_size=2, num_beams=2, max_new_tokens=5)
    assert batched == captioner(images, batch_size=1, num_beams=2, max_new_tokens=5)
    greedy = captioner(images, num_beams=1, max_new_tokens=5)
    assert [r[0]["generated_text"] for r in greedy] == direct_captions(
        captioner_dirs["full"], photos, num_beams=1, max_new_tokens=5
    )
    short = captioner(images[0], num_beams=1, max_new_tokens=2)[0]["generated_text"]
    assert short == direct_captions(captioner_dirs["full"], photos[:1], num_beams=1, max_new_tokens=2)[0]
    assert len(short) < len(greedy[0][0]["generated_text"])
    several = captioner(images[0], num_beams=4, num_return_sequences=3, max_new_tokens=4)
    assert len(several) == 3


def test_a_prompt_works_through_image_text_to_text(captioner_dirs, photos):
    conditional = pipeline("image-text-to-text", model=str(captioner_dirs["full"]))
    out = conditional(images=str(photos[0]), text="a photo of", max_new_tokens=4)
    assert out[0]["generated_text"].startswith("a photo of")
    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"]).eval()
    processor = tiny_processor()
    ids = model.generate(**processor(images=photos[0], text="a photo of"), max_new_tokens=4)
    assert out[0]["generated_text"].replace(" ", "") == processor.batch_decode(ids)[0].replace(" ", "")


def test_pipeline_from_a_model_object(captioner_dirs, photos):
    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"])
    captioner = pipeline("image-to-text", model=model, processor=tiny_processor())
    assert (
        captioner(str(photos[1]), num_beams=1, max_new_tokens=4)[0]["generated_text"]
        == direct_captions(captioner_dirs["full"], photos[1:2], num_beams=1, max_new_tokens=4)[0]
    )


@pytest.mark.slow
def test_no_traceback_or_error_in_the_log(captioner_dirs, photos):
    script = textwrap.dedent(f"""
        import itune_hf
        from transformers import pipeline
        captioner = pipeline("image-to-text", model={str(captioner_dirs["full"])!r})
        print(captioner({str(photos[0])!r}, max_new_tokens=3))
        prompted = pipeline("image-text-to-text", model={str(captioner_dirs["full"])!r})
        print(prompted(images={str(photos[0])!r}, text="a photo of", max_new_tokens=3))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "generated_text" in result.stdout
    for marker in ("Traceback", "Logging error", "is not supported", "has been removed", "ERROR"):
        assert marker not in result.stderr, result.stderr


def test_image_to_text_works_for_other_captioning_models_too(photos):
    """The restored task is generic: a transformers VisionEncoderDecoder model with a processor captions too."""
    from transformers import (
        CLIPImageProcessorPil,
        GPT2Config,
        GPT2TokenizerFast,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
    )

    from itune_hf.models.packaged_backbones import gpt2_tokenizer_dir

    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        ViTConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=32,
            patch_size=8,
        ),
        GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50257),
    )
    config.decoder_start_token_id = config.pad_token_id = 50256
    model = VisionEncoderDecoderModel(config=config).eval()
    tokenizer = GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir())
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    captioner = pipeline("image-to-text", model=model, tokenizer=tokenizer, image_processor=image_processor)
    assert isinstance(captioner, ImageToTextPipeline)
    torch.manual_seed(0)
    out = captioner(str(photos[0]), max_new_tokens=3, num_beams=1)
    assert list(out[0]) == ["generated_text"] and isinstance(out[0]["generated_text"], str)
