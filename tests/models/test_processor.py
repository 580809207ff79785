"""ITuningProcessor: every image form users have, captions for training, prompts for generation, decoding, and the
tokenizer's arguments (padding, truncation; XGPT's processor too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from itune_hf.models._shared.images import ImageError

from conftest import tiny_processor, write_photo


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


def reference_pixels(processor, rgb_image):
    return processor.image_processor(rgb_image, return_tensors="pt")["pixel_values"]


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "CMYK", "I;16", "I", "F", "1"])
def test_every_pil_mode_becomes_an_rgb_batch(processor, mode):
    image = Image.new("RGB", (40, 40), (120, 60, 30)).convert(mode)
    batch = processor(images=image)
    assert batch["pixel_values"].shape == (1, 3, 32, 32)
    assert torch.isfinite(batch["pixel_values"]).all()


def test_paths_arrays_and_pil_images_give_identical_pixels(processor, tmp_path):
    path = write_photo(tmp_path / "photo.png")
    rgb = Image.open(path).convert("RGB")
    expected = reference_pixels(processor, rgb)
    array = np.asarray(rgb)
    for source in (path, str(path), rgb, array, array.astype(np.float32) / 255.0, np.moveaxis(array, -1, 0)):
        torch.testing.assert_close(processor(images=source)["pixel_values"], expected, atol=1e-5, rtol=0)


def test_transparent_images_are_composited_on_white(processor):
    clear = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    torch.testing.assert_close(
        processor(images=clear)["pixel_values"], reference_pixels(processor, Image.new("RGB", (32, 32), "white"))
    )


def test_sixteen_bit_images_use_their_range(processor):
    ramp = np.tile(np.linspace(0, 4095, 32, dtype=np.uint16), (32, 1))  # 12-bit data in a 16-bit image
    pixels = processor(images=Image.fromarray(ramp))["pixel_values"]
    assert pixels.max() - pixels.min() > 3.0  # spread over the full normalised range, not clipped to black


def test_exif_orientation_is_applied(processor, tmp_path):
    upright = Image.new("RGB", (48, 24), (200, 20, 20))
    upright.paste((20, 20, 200), (0, 0, 12, 24))  # blue band on the left
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # a camera stores it sideways (90 degrees counter-clockwise)
    exif = Image.Exif()
    exif[0x0112] = 6  # ... and tags it "rotate 90 degrees clockwise to display"
    path = tmp_path / "rotated.jpg"
    stored.save(path, exif=exif, quality=100)
    assert Image.open(path).size == (24, 48)
    displayed = Image.open(path).transpose(Image.Transpose.ROTATE_270)  # 90 degrees clockwise
    assert displayed.size == (48, 24) and displayed.getpixel((2, 12))[2] > 150  # the blue band is back on the left
    torch.testing.assert_close(processor(images=path)["pixel_values"], reference_pixels(processor, displayed))


def test_unreadable_images_are_named_in_the_error(processor, tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("not an image")
    with pytest.raises(ImageError, match=r"notes\.txt: not an image file"):
        processor(images=[write_photo(tmp_path / "ok.png"), bad])


def test_training_captions_give_aligned_labels(processor):
    batch = processor(images=[Image.new("RGB", (32, 32))] * 2, captions=["A red circle.", "Two dogs on a beach"])
    tokenizer = processor.tokenizer
    first = tokenizer("A red circle.", add_special_tokens=False).input_ids
    second = tokenizer("Two dogs on a beach", add_special_tokens=False).input_ids
    bos, eos = processor.bos_token_id, processor.eos_token_id
    assert batch["decoder_input_ids"][1, : len(second) + 1].tolist() == [bos, *second]
    assert batch["labels"][1, : len(second) + 1].tolist() == [*second, eos]
    padding = batch["labels"][0, len(first) + 1 :]
    assert (padding == -100).all() and (batch["decoder_attention_mask"][0, len(first) + 1 :] == 0).all()
    assert batch["decoder_input_ids"].shape == batch["labels"].shape


def test_prompts_are_masked_in_labels_and_left_padded_for_generation(processor):
    image = Image.new("RGB", (32, 32))
    train = processor(images=image, text="a photo of", captions="a cat")
    prompt = processor.tokenizer("a photo of", add_special_tokens=False).input_ids
    cat = processor.tokenizer(" a cat", add_special_tokens=False).input_ids
    assert train["decoder_input_ids"][0].tolist() == [processor.bos_token_id, *prompt, *cat]
    assert train["labels"][0].tolist() == [-100] * len(prompt) + [*cat, processor.eos_token_id]

    generate = processor(images=[image, image], text=["a photo of", "a"])
    ids, mask = generate["decoder_input_ids"], generate["decoder_attention_mask"]
    assert ids[0].tolist() == [processor.bos_token_id, *prompt]
    assert mask[1].tolist() == [0] * (len(prompt) - 1) + [1, 1]  # left padded
    assert processor(images=image)["decoder_input_ids"].tolist() == [[processor.bos_token_id]]


def test_mismatched_counts_and_overlong_prompts_are_explained(processor):
    image = Image.new("RGB", (32, 32))
    with pytest.raises(ValueError, match="2 images but 1 captions"):
        processor(images=[image, image], captions=["only one"])
    with pytest.raises(ValueError, match="2 images but 1 captions"):  # one caption string was taken for both
        processor(images=[image, image], captions="only one")
    overlong = r"max_caption_length=64 leaves no room for a caption after a prompt of 80 tokens and the start and end"
    with pytest.raises(ValueError, match=overlong):
        processor(images=image, text="word " * 80, captions="a cat")
    with pytest.raises(ValueError, match=r"^max_length=2 leaves no room for a caption after the start and end tokens"):
        processor(images=image, captions="a cat", max_length=2)  # it spoke of "the prompt None"


def test_batch_decode_strips_special_tokens(processor):
    tokenizer = processor.tokenizer
    ids = [
        [
            processor.bos_token_id,
            *tokenizer("a dog runs", add_special_tokens=False).input_ids,
            processor.eos_token_id,
            processor.pad_token_id,
        ]
    ]
    assert processor.batch_decode(torch.tensor(ids)) == ["a dog runs"]
    assert processor.decode(torch.tensor(ids[0])) == "a dog runs"


def test_processor_round_trips_through_save_and_auto_processor(processor, tmp_path):
    from transformers import AutoProcessor

    import itune_hf  # noqa: F401

    processor.save_pretrained(tmp_path)
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "ITuningProcessor"
    image = Image.new("RGB", (40, 30), (10, 200, 30))
    for key, value in processor(images=image, captions="a green square").items():
        torch.testing.assert_close(loaded(images=image, captions="a green square")[key], value)


def test_a_caption_prefix_starts_every_sequence_is_masked_saved_and_decoded_away(tmp_path):
    from transformers import AutoProcessor

    import itune_hf  # noqa: F401

    processor = tiny_processor()
    processor.caption_prefix = "\n"
    newline = processor.tokenizer("\n", add_special_tokens=False).input_ids
    cat = processor.tokenizer("a cat", add_special_tokens=False).input_ids
    bos, eos = processor.bos_token_id, processor.eos_token_id
    image = Image.new("RGB", (32, 32))
    train = processor(images=image, captions="a cat")
    assert train["decoder_input_ids"][0].tolist() == [bos, *newline, *cat]
    assert train["labels"][0].tolist() == [-100] * len(newline) + [*cat, eos]  # the first word follows the prefix
    assert processor(images=image)["decoder_input_ids"][0].tolist() == [bos, *newline]
    prompted = processor(images=image, text="a photo of")["decoder_input_ids"][0].tolist()
    assert prompted[: 1 + len(newline)] == [bos, *newline]
    assert processor.batch_decode(torch.tensor([[bos, *newline, *cat, eos]])) == ["a cat"]

    processor.caption_prefix = "Caption:"
    assert processor.decode(processor(images=image, captions="a cat")["decoder_input_ids"][0]) == "a cat"
    processor.save_pretrained(tmp_path)
    assert AutoProcessor.from_pretrained(tmp_path).caption_prefix == "Caption:"


def test_the_demo_preset_puts_a_newline_after_smollm2s_bos():
    from itune_hf.models.packaged_backbones import smollm2_dir
    from itune_hf.presets import build_processor, get_preset

    try:
        smollm2_dir()
    except Exception as error:  # noqa: BLE001 - the package is optional outside make test
        pytest.skip(f"SmolLM2 is not installed: {error}")
    assert get_preset("itune-demo").processor == {"caption_prefix": "\n"}
    assert build_processor("itune-demo").caption_prefix == "\n"
    assert build_processor("itune-gpt2-base").caption_prefix == ""  # the paper's presets: BOS only


def test_torch_tensors_and_uint16_arrays_are_taken_as_clips_image_processor_takes_them(processor):
    """ITuningProcessor(images=tensor) and np.uint16 arrays were refused; CLIP's image processor takes them."""
    generator = torch.Generator().manual_seed(0)
    uint8 = torch.randint(0, 256, (3, 36, 44), dtype=torch.uint8, generator=generator)
    as_float = uint8.float() / 255.0
    cases = {
        "uint8 tensor, channels first": uint8,
        "uint8 tensor, channels last": uint8.permute(1, 2, 0),
        "uint16 array in [0, 255]": uint8.permute(1, 2, 0).numpy().astype(np.uint16),
        "float tensor in [0, 1]": as_float,  # CLIP's processor takes it with do_rescale=False (else scales twice)
    }
    for name, image in cases.items():
        options = {"do_rescale": False} if image.dtype == torch.float32 else {}
        expected = processor.image_processor(image, return_tensors="pt", **options)["pixel_values"]
        torch.testing.assert_close(processor(images=image)["pixel_values"], expected, atol=1e-5, rtol=0, msg=name)
    batch = processor(images=torch.stack([uint8, uint8]))  # a 4-d tensor is a batch, as for CLIP
    assert batch["pixel_values"].shape == (2, 3, 32, 32)
    wide = uint8.permute(1, 2, 0).numpy().astype(np.uint16) * 257  # the 16-bit range: scaled to 8 bits
    torch.testing.assert_close(
        processor(images=wide)["pixel_values"], processor(images=uint8)["pixel_values"], atol=1e-5, rtol=0
    )


def test_size_limits_refuse_before_anything_large_is_allocated(processor, tmp_path, monkeypatch):
    """A 1 x 100,000 image raised OverflowError in the resize; a 300,000 x 1 one took 3.45 GB. Both are refused
    from their size, naming the input, its size and the limit, before the image processor resizes anything."""
    from itune_hf.models.ituning import images

    resized = []
    monkeypatch.setattr(type(processor.image_processor), "resize", lambda self, *a, **k: resized.append(1))
    thin = tmp_path / "thin.png"
    Image.new("L", (1, 100_000)).save(thin)
    with pytest.raises(ImageError, match=r"thin\.png: 1x100000 has an aspect ratio of 100,000:1.*limit of 100:1"):
        processor(images=thin)
    with pytest.raises(ImageError, match=r"300000x1 .*limit of 100:1"):
        processor(images=np.zeros((1, 300_000), dtype=np.uint8))
    monkeypatch.setattr(processor.image_processor, "size", {"shortest_edge": 3000})  # bounded after the resize too
    with pytest.raises(ImageError, match=r"would be resized to 150000x3000 .*above the limit of 16,777,216"):
        processor(images=torch.zeros(3, 50, 2500, dtype=torch.uint8))
    assert resized == []
    assert images.MAX_RESIZED_PIXELS * 3 * 4 < 2**30  # the largest image the processor may build stays < 1 GiB


def test_processor_takes_tokenizer_arguments():
    processor = tiny_processor()
    image = Image.new("RGB", (30, 30))
    padded = processor(images=[image, image], text=["a picture of", "the"], padding=True)
    assert padded["decoder_input_ids"].shape[1] == 4 and padded["decoder_attention_mask"][1].tolist() == [0, 0, 1, 1]
    wide = processor(images=[image], text=["the"], padding="max_length", max_length=6)
    assert wide["decoder_input_ids"].shape == (1, 6)
    caption = ["a red square on a blue field"]
    cut = processor(images=[image], captions=caption, truncation=True, max_length=4)
    processor.max_caption_length = 4  # max_length caps as the processor's own budget does (BOS and EOS counted)
    assert cut["labels"].tolist() == processor(images=[image], captions=caption)["labels"].tolist()
    assert cut["labels"].shape[1] < len(processor(images=[image], captions=caption, padding=True)["labels"][0]) + 1
    with pytest.raises(ValueError, match="padding_side"):
        processor(images=[image], text=["the"], padding_side="right")


def test_xgpt_processor_takes_tokenizer_arguments():
    from itune_hf.presets import build_processor

    processor = build_processor("xgpt-tiny-random")
    out = processor(images=[Image.new("RGB", (30, 30))] * 2, text=["a picture of", "the"], padding=True)
    assert out["decoder_attention_mask"][1].tolist()[:2] == [0, 0]


@pytest.mark.parametrize("preset", ["itune-tiny-random", "xgpt-tiny-random"])
def test_return_tensors_none_gives_python_lists_as_transformers_processors_do(preset):
    from itune_hf.presets import build_processor

    processor = build_processor(preset)
    images = [Image.new("RGB", (30, 30), (200, 0, 0))] * 2
    tensors = processor(images=images, captions=["a red square", "red"])
    lists = processor(images=images, captions=["a red square", "red"], return_tensors=None)
    assert set(lists) == set(tensors)
    for key, value in lists.items():
        assert isinstance(value, list), key
        assert torch.tensor(value).tolist() == tensors[key].tolist(), key


def test_decode_of_generates_output_gives_one_caption_per_row(processor):
    """A 2-D input made the tokenizer's decode return a list, which `.strip()` failed on."""
    ids = torch.tensor([[processor.bos_token_id, *processor.tokenizer(" a dog")["input_ids"], processor.eos_token_id]])
    assert processor.decode(ids) == ["a dog"] and processor.decode(ids[0]) == "a dog"


def test_channels_first_wins_where_both_ends_could_be_channels(processor):
    """A (3, 1, 1) red pixel was read as a 1x3 image (white, black, black); transformers takes it channels first."""
    red = torch.tensor([255, 0, 0], dtype=torch.uint8).view(3, 1, 1)
    with pytest.warns(UserWarning, match=r"channel axis of an array of shape \(3, 1, 1\) is ambiguous"):
        opened = processor.open_image(red)
    assert opened.size == (1, 1) and opened.getpixel((0, 0)) == (255, 0, 0)


def test_wide_integer_pixels_keep_their_brightness_whatever_the_container():
    """16- and 32-bit PIL images were stretched image by image (a flat one went black; an 8-bit image converted to
    mode I lost its level) and disagreed with the same data as an array."""
    from itune_hf.models._shared.images import open_image

    def grey(image) -> int:
        return open_image(image).getpixel((0, 0))[0]

    flat = np.full((8, 8), 30000, np.uint16)
    assert grey(Image.fromarray(flat)) == grey(flat) == round(30000 * 255 / 65535)  # 16 bits
    twelve_bit = np.full((8, 8), 2000, np.uint16)
    assert grey(Image.fromarray(twelve_bit)) == grey(twelve_bit) == round(2000 * 255 / 4095)  # 12 bits in 16
    eight_bit = Image.new("L", (8, 8), 200)
    assert grey(eight_bit.convert("I")) == grey(np.full((8, 8), 200, np.uint16)) == 200
    assert grey(Image.fromarray(np.full((8, 8), 0.5, np.float32), mode="F")) == 128


def test_max_length_alone_cuts_captions_and_truncation_false_cuts_nothing(processor):
    """`max_length` without `truncation` and `truncation=False` were both ignored for training captions."""
    image, long_caption = Image.new("RGB", (32, 32)), "word " * 100
    # max_length counts BOS, the caption and EOS: a row of max_length - 1 positions (EOS is only a label)
    assert processor(images=image, captions=long_caption, max_length=10)["labels"].shape == (1, 9)
    default = processor(images=image, captions=long_caption)["labels"]
    assert default.shape[1] == processor.max_caption_length - 1 < 101
    uncut = processor(images=image, captions=long_caption, truncation=False)["labels"]
    assert uncut.shape[1] == 101 and uncut[0, -1] == processor.eos_token_id  # 100 words, then EOS
