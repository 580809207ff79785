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
    assert "base_model:" not in (tmp_path / "my-adapter" / "README.md").read_text()  # random: no Hub id, not ''
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

    for name in ("dtype", "torch_dtype"):  # torch_dtype: transformers' old name, which it still honours (issue 32)
        model = ITuningForCaptioning.from_pretrained(captioner_dirs["adapter"], **{name: torch.bfloat16})
        assert {p.dtype for p in model.ituning.parameters()} == {torch.bfloat16}, name
        assert {p.dtype for p in model.language_model.parameters()} == {torch.bfloat16}, name


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

    from itune_hf.hub.cards import CardInfo, render_card

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


def test_a_plain_peft_save_writes_a_valid_card_and_loads_back(backbone_dirs, tmp_path):
    from huggingface_hub import ModelCard
    from peft import AutoPeftModel, get_peft_model

    from itune_hf import ITuningForCaptioning

    hub_named = build_model("itune-tiny-random", add_ituning_modules=False)  # as if built from these Hub backbones
    hub_named.config.vision_config._name_or_path = "openai/clip-vit-base-patch32"
    hub_named.config.text_config._name_or_path = "gpt2"
    get_peft_model(hub_named, ITuningAdapterConfig()).save_pretrained(tmp_path / "hub")
    card = ModelCard.load(tmp_path / "hub" / "README.md").data
    assert card.base_model == ["openai/clip-vit-base-patch32", "gpt2"] and "base_model:adapter:gpt2" in card.tags
    vision, text = (str(p) for p in backbone_dirs)  # local backbones: no Hub id to name, none is invented
    base = ITuningForCaptioning.from_vision_text_pretrained(vision, text, add_ituning_modules=False)
    torch.manual_seed(2)
    adapted = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    adapted.save_pretrained(tmp_path / "local")
    card = ModelCard.load(tmp_path / "local" / "README.md").data
    assert card.base_model is None and not any(tag.startswith("base_model:") for tag in card.tags)
    recorded = json.loads((tmp_path / "local" / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] is None and recorded["backbones"] == [vision, text]
    pixels = torch.randn(1, 3, 32, 32)
    ids = adapted.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4)
    restored = ITuningForCaptioning.from_pretrained(tmp_path / "local")  # the base rebuilt from `backbones`
    assert torch.equal(restored.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), ids)
    with pytest.raises(ValueError, match="names no base to rebuild.*from_pretrained\\(folder\\)"):
        AutoPeftModel.from_pretrained(tmp_path / "local", import_allowlist=["itune_hf"])


@pytest.mark.filterwarnings("ignore:Unfeasible length constraints")
def test_seq2seq_trainer_generation_max_length_limits_what_is_generated(captioner_dirs, tmp_path):
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from itune_hf import ITuningForCaptioning

    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"])  # its saved generation config: 30 new tokens
    assert model.generation_config.max_new_tokens == 30
    args = Seq2SeqTrainingArguments(
        tmp_path, predict_with_generate=True, generation_max_length=8, generation_num_beams=1,
        per_device_eval_batch_size=2, report_to=[], use_cpu=True,
    )  # fmt: skip
    processor = tiny_processor()
    trainer = Seq2SeqTrainer(model=model, args=args, processing_class=processor)
    images = [{"pixel_values": torch.randn(3, 32, 32)} for _ in range(2)]
    predictions = trainer.predict(images, min_new_tokens=20).predictions  # would run to 30 tokens unless capped
    pad = processor.tokenizer.pad_token_id
    assert (predictions[:, 1:8] != pad).all() and (predictions[:, 8:] == pad).all()


def test_trainer_checkpoints_of_a_native_model_hold_only_the_adapter_and_restore(tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import Trainer, TrainingArguments

    from itune_hf import AdapterCheckpoints, ITuningForCaptioning

    torch.manual_seed(0)
    model = build_model("itune-tiny-random", first_layer=0, init="random")
    size = model.config.vision_config.image_size
    rows = [{"pixel_values": torch.randn(3, size, size), "decoder_input_ids": ids, "labels": ids}
            for ids in torch.randint(3, 50, (4, 6))]  # fmt: skip
    args = TrainingArguments(
        tmp_path, max_steps=2, save_steps=1, per_device_train_batch_size=2, learning_rate=1e-2, report_to=[],
        use_cpu=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=rows, callbacks=[AdapterCheckpoints()]).train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    saved = {}
    for step in (1, 2):
        folder = tmp_path / f"checkpoint-{step}"
        assert not {"model.safetensors", "pytorch_model.bin", "config.json"} & {p.name for p in folder.iterdir()}
        saved[step] = load_file(folder / "adapter_model.safetensors")
        assert all(".ituning_modules." in key for key in saved[step])
        assert sum(t.numel() for t in saved[step].values()) == trainable
    assert any(not torch.equal(saved[1][key], saved[2][key]) for key in saved[2])  # each step's own weights
    model.eval()
    pixels = torch.randn(1, 3, size, size)
    ids = model.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4)
    restored = ITuningForCaptioning.from_pretrained(tmp_path / "checkpoint-2")
    assert torch.equal(restored.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), ids)
    bare = build_model("itune-tiny-random", add_ituning_modules=False)
    with_peft = PeftModel.from_pretrained(bare, tmp_path / "checkpoint-2").eval()
    assert torch.equal(with_peft.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), ids)
