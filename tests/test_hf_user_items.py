"""What experienced Hugging Face users do with the package (issue 14): pipeline inputs, PEFT conventions, presets."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import pipeline

import itune_hf  # noqa: F401  (registers the pipeline and the adapter type)
from itune_hf import ITuningAdapterConfig, build_model
from itune_hf.cli import main

from conftest import tiny_processor, write_photo


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


# ---------------------------------------------------------------------------------------------- item 1: one opener
def test_pipeline_processor_and_itune_caption_see_the_same_pixels(captioner, captioner_dirs, odd_images, capsys):
    processor = tiny_processor()
    for path in odd_images:
        seen = captioner.preprocess({"images": str(path)})["pixel_values"]
        assert torch.allclose(seen, processor(images=str(path))["pixel_values"]), path.name
        assert torch.allclose(captioner.preprocess({"images": Image.open(path)})["pixel_values"], seen), path.name
    piped = [r[0]["generated_text"] for r in captioner([str(p) for p in odd_images], num_beams=1, max_new_tokens=4)]
    args = [*map(str, odd_images), "--model", str(captioner_dirs["full"]), "--json", "--num-beams", "1"]
    assert main(["caption", *args, "--max-new-tokens", "4"]) == 0
    cli = [json.loads(line)["caption"] for line in capsys.readouterr().out.strip().splitlines()]
    assert piped == cli


# ---------------------------------------------------------------------------------------------- item 2: batched prompts
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


# ---------------------------------------------------------------------------------------------- item 3: streaming
def test_datasets_generators_and_iterables_stream(captioner):
    import datasets
    from transformers.pipelines.pt_utils import KeyDataset

    images = [Image.new("RGB", (40, 40), color) for color in [(200, 0, 0), (0, 0, 200)]]
    expected = [r[0]["generated_text"] for r in captioner(images, num_beams=1, max_new_tokens=2)]
    ds = datasets.Dataset.from_dict({"image": images}).cast_column("image", datasets.Image())
    for stream in (KeyDataset(ds, "image"), (image for image in images), ds["image"], ds):
        out = [r[0]["generated_text"] for r in captioner(stream, batch_size=2, num_beams=1, max_new_tokens=2)]
        assert out == expected, type(stream).__name__


# ---------------------------------------------------------------------------------------------- items 6, 7, 11: PEFT
def test_an_adapter_on_a_model_with_native_modules_is_refused():
    from peft import get_peft_model

    with pytest.raises(ValueError, match="already has native I-Tuning modules.*add_ituning_modules=False"):
        get_peft_model(build_model("itune-tiny-random"), ITuningAdapterConfig(first_layer=1))


def test_inference_mode_loads_are_frozen_and_no_future_warning(tmp_path):
    from peft import PeftModel, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model = get_peft_model(build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig())
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) > 0
    model.save_pretrained(tmp_path)
    base = build_model("itune-tiny-random", add_ituning_modules=False)
    assert sum(p.numel() for p in PeftModel.from_pretrained(base, tmp_path).parameters() if p.requires_grad) == 0
    base = build_model("itune-tiny-random", add_ituning_modules=False)
    trainable = PeftModel.from_pretrained(base, tmp_path, is_trainable=True)
    assert sum(p.numel() for p in trainable.parameters() if p.requires_grad) == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )


def test_generate_without_an_image_says_what_to_pass():
    model = build_model("itune-tiny-random")
    with pytest.raises(ValueError, match="no pixel_values or encoder_outputs.*input_ids"):
        model.generate(input_ids=torch.tensor([[1, 2]]))


# ---------------------------------------------------------------------------------------------- item 8: seeded presets
def test_random_presets_build_the_same_backbones_and_the_readme_restore_works(tmp_path):
    from peft import PeftModel, get_peft_model

    for preset in ("itune-tiny-random", "xgpt-tiny-random"):
        first, second = build_model(preset), build_model(preset)
        assert torch.equal(next(first.vision_model.parameters()), next(second.vision_model.parameters())), preset
    torch.manual_seed(3)
    model = get_peft_model(
        build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig(first_layer=0, init="random")
    ).eval()
    model.save_pretrained(tmp_path / "my-adapter")
    restored = PeftModel.from_pretrained(
        build_model("itune-tiny-random", add_ituning_modules=False), tmp_path / "my-adapter"
    )
    pixels = torch.randn(2, 3, 32, 32)
    ids = model.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5)
    assert torch.equal(restored.eval().generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    # item 5: the adapter names its base (the preset), so AutoPeftModel rebuilds it
    from peft import AutoPeftModel

    recorded = json.loads((tmp_path / "my-adapter" / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == "itune-tiny-random"
    auto = AutoPeftModel.from_pretrained(tmp_path / "my-adapter", import_allowlist=["itune_hf"]).eval()
    assert torch.equal(auto.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)


def test_adapter_folder_without_its_config_says_so(captioner_dirs, tmp_path):
    import shutil

    from itune_hf import ITuningForCaptioning

    folder = shutil.copytree(captioner_dirs["adapter"], tmp_path / "adapter")
    (folder / "adapter_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors but no adapter_config.json"):
        ITuningForCaptioning.from_pretrained(folder)


def test_adapter_only_load_follows_the_dtype(captioner_dirs):
    from itune_hf import ITuningForCaptioning

    model = ITuningForCaptioning.from_pretrained(captioner_dirs["adapter"], dtype=torch.bfloat16)
    assert {p.dtype for p in model.ituning.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.language_model.parameters()} == {torch.bfloat16}


def test_itune_params_names_random_backbones(capsys):
    assert main(["params", "--preset", "itune-tiny-random"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "vision: random (preset config" in out and "text: random (preset config" in out


# ---------------------------------------------------------------------------------------------- item 9: export, lengths
def test_a_native_model_exports_adapter_only_files_and_callers_max_length_wins(captioner_dirs, backbone_dirs, tmp_path):
    from peft import PeftModel

    from itune_hf import ITuningForCaptioning, save_adapter

    native = ITuningForCaptioning.from_pretrained(captioner_dirs["full"]).eval()
    folder = save_adapter(native, tmp_path / "exported", processor=tiny_processor())
    assert not (folder / "model.safetensors").exists() and (folder / "adapter_model.safetensors").exists()
    pixels = torch.randn(1, 3, 32, 32)
    ids = native.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5)
    reloaded = ITuningForCaptioning.from_pretrained(folder).eval()
    assert torch.equal(reloaded.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    vision, text = (str(p) for p in backbone_dirs)
    base = ITuningForCaptioning.from_vision_text_pretrained(vision, text, add_ituning_modules=False)
    with_peft = PeftModel.from_pretrained(base, folder).eval()
    assert torch.equal(with_peft.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    assert native.generate(pixel_values=pixels, num_beams=1, min_new_tokens=20, max_length=8).shape[1] == 8


# ---------------------------------------------------------------------------------------------- item 5: Hub metadata
def test_card_metadata_holds_only_hub_ids_and_the_text_says_where_backbones_are(tmp_path):
    from huggingface_hub import ModelCard

    from itune_hf.cards import CardInfo, render_card

    data = tmp_path / "captions.json"
    data.write_text("[]")
    info = CardInfo(
        model_id="run", title="run", summary="A run.", vision_model="random, stored here in backbones/vision",
        text_model="gpt2", trainable_parameters=10, adapter=True, license="mit",
        results=[{"dataset": "local", "dataset_id": str(data), "split": "val", "setting": "", "metrics": {"CIDEr": 1.0},
                  "source": "measured"}],
    )  # fmt: skip
    card = ModelCard(str(render_card(info)))
    assert card.data.base_model == ["gpt2"] and not card.data.eval_results
    assert "stored here under `backbones/`" in card.text and "no backbone weight is stored" not in card.text
    assert "CIDEr" in card.text  # the local dataset's measured result stays in the text
