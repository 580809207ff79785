"""pipeline("image-to-text") and pipeline("image-text-to-text"), called exactly as users call them: every entry point
sees the processor's pixels, batched prompts each caption their image, datasets and generators stream."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import pipeline

import itune_hf  # noqa: F401  (registers the pipeline)
from itune_hf import ITuningForCaptioning
from itune_hf.cli import main
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


def test_batched_images_keep_their_own_return_sequences(captioner_dirs, photos):
    captioner = pipeline("image-to-text", model=str(captioner_dirs["full"]))
    images = [str(p) for p in photos]
    options = {"num_beams": 4, "num_return_sequences": 3, "max_new_tokens": 4}
    one_by_one = [captioner(image, **options) for image in images]
    batched = captioner(images, batch_size=2, **options)
    assert [len(result) for result in batched] == [3] * len(images)
    assert batched == one_by_one


def test_a_generation_config_return_tensors_and_any_generate_option_reach_generate(captioner_dirs, photos):
    from transformers import GenerationConfig

    captioner = pipeline("image-to-text", model=str(captioner_dirs["full"]))
    images = [str(p) for p in photos]
    options = {"num_beams": 4, "num_return_sequences": 3, "max_new_tokens": 4}
    expected = captioner(images, batch_size=2, **options)
    config = GenerationConfig(**options)  # the count per image read from the output, not from the keywords
    assert captioner(images, batch_size=2, generation_config=config) == expected
    assert captioner(images, batch_size=2, generate_kwargs={"generation_config": config}) == expected
    # any GenerationConfig field goes to generate (min_length reached the image processor: a TypeError)
    assert len(captioner(images[0], num_beams=1, max_new_tokens=4, min_length=2)) == 1
    tensors = captioner(images, batch_size=2, return_tensors=True, **options)
    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"]).eval()
    ids = model.generate(**tiny_processor()(images=photos[1]), **options)
    assert [len(result) for result in tensors] == [3] * len(images)
    assert all(torch.equal(got["generated_token_ids"], want) for got, want in zip(tensors[1], ids))
    prompted = captioner(images[0], text="a photo of", max_new_tokens=4, return_tensors=True)
    assert torch.is_tensor(prompted[0]["generated_token_ids"])
    with pytest.raises(ValueError, match="decoding='fast' with a prompt"):
        captioner(images[0], text="a photo of", max_new_tokens=4, decoding="fast")


def test_a_prompt_works_through_image_text_to_text(captioner_dirs, photos):
    conditional = pipeline("image-text-to-text", model=str(captioner_dirs["full"]))
    out = conditional(images=str(photos[0]), text="a photo of", max_new_tokens=4)
    assert out[0]["generated_text"].startswith("a photo of")
    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"]).eval()
    processor = tiny_processor()
    ids = model.generate(**processor(images=photos[0], text="a photo of"), max_new_tokens=4)
    assert out[0]["generated_text"].replace(" ", "") == processor.batch_decode(ids)[0].replace(" ", "")
    # generation options go to generate, as image-to-text takes them (not to the processor, which refuses them)
    beams = conditional(images=str(photos[0]), text="a photo of", num_beams=3, max_new_tokens=4)
    ids = model.generate(**processor(images=photos[0], text="a photo of"), num_beams=3, max_new_tokens=4)
    assert beams[0]["generated_text"].replace(" ", "") == processor.batch_decode(ids)[0].replace(" ", "")


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


@pytest.fixture(scope="module")
def odd_images(tmp_path_factory):
    """An RGBA photo with transparent parts and a 16-bit greyscale one using a small part of the 16-bit range."""
    root = tmp_path_factory.mktemp("odd")
    rgba = np.zeros((40, 48, 4), dtype=np.uint8)
    rgba[..., 0], rgba[:, :24, 3], rgba[:, 24:, 3] = 200, 255, 0  # left half opaque red, right half transparent
    Image.fromarray(rgba, mode="RGBA").save(root / "rgba.png")
    gray = (np.arange(40 * 48, dtype=np.uint16).reshape(40, 48) % 3000 + 1000).astype(np.uint16)
    Image.fromarray(gray).save(root / "gray16.png")
    return [root / "rgba.png", root / "gray16.png"]


@pytest.fixture(scope="module")
def captioner(captioner_dirs):
    return pipeline("image-to-text", model=str(captioner_dirs["full"]))


def test_every_entry_point_sees_the_processors_pixels(captioner, captioner_dirs, odd_images, capsys):
    from transformers.pipelines import ImageTextToTextPipeline

    from itune_hf.pipelines import OpenerImageTextToTextPipeline

    processor = tiny_processor()
    prompted = pipeline("image-text-to-text", model=str(captioner_dirs["full"]))
    assert isinstance(prompted, OpenerImageTextToTextPipeline)
    for path in odd_images:
        expected = processor(images=str(path))["pixel_values"]
        for seen in (
            captioner.preprocess({"images": str(path)}),
            captioner.preprocess({"images": Image.open(path)}),
            prompted.preprocess({"images": str(path), "text": "a"}),
            prompted.preprocess({"images": [Image.open(path)], "text": ["a"]}),
        ):
            assert torch.allclose(seen["pixel_values"], expected), path.name
    # transformers' own class (what runs where itune_hf is not installed, README) converts paths with its load_image;
    # the processor's open_image, passed instead of the path, gives the processor's pixels back
    plain = pipeline(
        "image-text-to-text", model=prompted.model, processor=processor, pipeline_class=ImageTextToTextPipeline
    )
    for path in odd_images:
        expected = processor(images=str(path))["pixel_values"]
        assert not torch.allclose(plain.preprocess({"images": str(path), "text": "a"})["pixel_values"], expected)
        opened = plain.preprocess({"images": processor.open_image(path), "text": "a"})["pixel_values"]
        assert torch.allclose(opened, expected), path.name
    paths, greedy = [str(p) for p in odd_images], {"num_beams": 1, "max_new_tokens": 4}
    piped = [r[0]["generated_text"] for r in captioner(paths, **greedy)]
    args = [*paths, "--model", str(captioner_dirs["full"]), "--json", "--num-beams", "1", "--max-new-tokens", "4"]
    assert main(["caption", *args]) == 0
    assert piped == [json.loads(line)["caption"] for line in capsys.readouterr().out.strip().splitlines()]
    with_prompt = [r["generated_text"] for r in prompted(images=paths, text=["a", "a"], generate_kwargs=greedy)]
    ids = prompted.model.generate(**processor(images=paths, text=["a", "a"], padding=True), **greedy)
    assert [t.replace(" ", "") for t in with_prompt] == [t.replace(" ", "") for t in processor.batch_decode(ids)]


def greedy() -> dict:
    return {"max_new_tokens": 3, "generate_kwargs": {"num_beams": 1}}  # a new dict: the pipeline writes into it


@pytest.mark.parametrize("task", ["image-text-to-text", "image-to-text"])
def test_batched_prompts_caption_each_image_with_its_prompt(captioner_dirs, tmp_path, task):
    photos = [write_photo(tmp_path / f"p{i}.png", color=c) for i, c in enumerate([(200, 30, 30), (30, 30, 200)])]
    captioner = pipeline(task, model=str(captioner_dirs["full"]))
    out = captioner(images=[str(p) for p in photos], text=["a picture of", "the"], **greedy())
    texts = [r[0]["generated_text"] if isinstance(r, list) else r["generated_text"] for r in out]
    assert texts[0].startswith("a picture of") and texts[1].startswith("the")
    single = captioner(images=str(photos[1]), text="the", **greedy())
    assert texts[1] == single[0]["generated_text"]


def test_datasets_generators_and_iterables_stream(captioner):
    import datasets
    from transformers.pipelines.pt_utils import KeyDataset

    images = [Image.new("RGB", (40, 40), color) for color in [(200, 0, 0), (0, 0, 200)]]
    expected = [r[0]["generated_text"] for r in captioner(images, num_beams=1, max_new_tokens=2)]
    ds = datasets.Dataset.from_dict({"image": images}).cast_column("image", datasets.Image())
    for stream in (KeyDataset(ds, "image"), (image for image in images), ds["image"], ds):
        out = [r[0]["generated_text"] for r in captioner(stream, batch_size=2, num_beams=1, max_new_tokens=2)]
        assert out == expected, type(stream).__name__


def test_a_peft_model_object_is_accepted_without_an_unsupported_model_error(photos, caplog):
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig, build_model, build_processor

    model = get_peft_model(build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig())
    with caplog.at_level("ERROR"):
        captioner = pipeline("image-to-text", model=model, processor=build_processor("itune-tiny-random"))
    assert "is not supported" not in caplog.text
    assert captioner(str(photos[0]), max_new_tokens=3)[0]["generated_text"] is not None


def test_chat_format_input_prompts_the_caption_with_the_users_text(captioner_dirs, photos):
    conditional = pipeline("image-text-to-text", model=str(captioner_dirs["full"]))
    messages = [{"role": "user", "content": [{"type": "image", "url": str(photos[0])},
                                             {"type": "text", "text": "a photo of"}]}]  # fmt: skip
    chat = conditional(text=messages, max_new_tokens=4)[0]["generated_text"]
    assert chat[-1]["role"] == "assistant"
    plain = conditional(images=str(photos[0]), text="a photo of", max_new_tokens=4)[0]["generated_text"]
    assert plain.startswith("a photo of") and plain[len("a photo of") :].strip() == chat[-1]["content"].strip()
