"""Retrieval-augmented I-Tuning as a user runs it: `itune train --retrieval train` prompts every image with its
nearest other training images' captions, saves the datastore with the model, and `itune eval` retrieves from it (or
from another `--datastore`) for the images it captions; the prompt is never part of the caption."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from itune_hf.cli import main
from itune_hf.data import load_captions
from itune_hf.vision.datastore import PROMPT_START, CaptionDatastore
from itune_hf.vision.feature_cache import FeatureCache

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--mixed-precision", "no"]


@pytest.fixture(scope="module")
def data_and_cache(tmp_path_factory):
    from itune_hf.data import make_synthetic

    root = tmp_path_factory.mktemp("rag")
    data = make_synthetic(root / "world", num_images=24, seed=5, image_size=32)
    argv = ["cache-features", "--preset", "itune-tiny-random", "--data", data, "--output-dir", root / "cache"]
    assert main([str(a) for a in argv]) == 0
    return data, root / "cache"


def caption_sheet():
    """`tools/caption_sheet.py` as a module (the picture of captions beside images in the docs)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "caption_sheet.py"
    spec = importlib.util.spec_from_file_location("caption_sheet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as exit_:
        return exit_.code


@pytest.fixture(scope="module")
def retrieval_model(data_and_cache, tmp_path_factory):
    """A tiny I-Tuning model trained 2 steps with `--retrieval train --retrieval-k 2`, and what train printed."""
    import contextlib
    import io

    data, cache = data_and_cache
    model = tmp_path_factory.mktemp("rag-model") / "m"
    argv = ["train", "--data", data, "--feature-cache", cache, "--retrieval", "train", "--retrieval-k", "2",
            "--max-steps", "2", "--eval-every", "2", "--output-dir", model, *TINY]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run(argv) == 0
    return model, printed.getvalue()


def test_a_retrieval_augmented_run_saves_its_datastore_and_eval_retrieves_from_it(
    data_and_cache, retrieval_model, tmp_path, capsys
):
    data, cache = data_and_cache
    model, printed = retrieval_model
    assert "retrieval: 2 captions per prompt from a datastore of" in printed
    store = CaptionDatastore.load(model / "datastore")
    train_ids = list(load_captions(str(data))["train"]["image_id"])
    assert sorted(store.image_ids) == sorted(train_ids) and store.k == 2
    assert run(["eval", "--model", model, "--data", data, "--feature-cache", cache, "--num-beams", "1"]) == 0
    captions = [json.loads(line)["caption"] for line in (model / "eval-test" / "captions.jsonl").open()]
    assert captions and not any(caption.startswith(PROMPT_START) for caption in captions)
    capsys.readouterr()
    assert run(["eval", "--model", model, "--data", data, "--output-dir", tmp_path / "e", "--overwrite"]) == 2
    assert "pass --feature-cache" in capsys.readouterr().err
    sheet = caption_sheet().main(
        ["--model", f"I-Tuning + retrieval={model}", "--data", str(data), "--feature-cache", str(cache),
         "--num-images", "3", "--num-beams", "1", "--output", str(tmp_path / "sheet.png")]
    )  # fmt: skip
    from PIL import Image

    with Image.open(sheet) as picture:  # three bands of a thumbnail and its captions, under a heading
        assert picture.height > 3 * caption_sheet().THUMB
    # itune caption retrieves too, by the states the model's tower computes of each image file: the same prompts
    # as eval's from the feature cache, so the same captions
    test = load_captions(str(data))["test"]
    by_id = {json.loads(line)["image_id"]: json.loads(line)["caption"] for line in
             (model / "eval-test" / "captions.jsonl").open()}  # fmt: skip
    capsys.readouterr()
    assert run(["caption", "--model", model, "--num-beams", "1", "--json", *test["image_path"]]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["caption"] for line in lines] == [by_id[i] for i in test["image_id"]]
    other = tmp_path / "other-store"  # another datastore: other captions retrieved, no training
    dataclasses.replace(store, captions=[["a zebra on the moon"] for _ in store.captions]).save(other)
    assert run(["caption", "--model", model, "--datastore", other, "--num-beams", "1", "--json",
                *test["image_path"]]) == 0  # fmt: skip
    swapped = [json.loads(line)["caption"] for line in capsys.readouterr().out.splitlines()]
    assert len(swapped) == len(lines) and swapped != [line["caption"] for line in lines]
    # the pipeline retrieves from the model's datastore, or from datastore=, the same prompts and captions
    from transformers import pipeline

    captioner = pipeline("image-to-text", model=str(model))
    expected = store.prompts(FeatureCache(cache), list(test["image_id"]))
    for path, image_id in zip(test["image_path"], test["image_id"]):
        prompt = captioner.processor.batch_decode(captioner.preprocess({"images": path})["decoder_input_ids"])
        assert prompt == [expected[image_id]]
        swapped_prompt = captioner.preprocess({"images": path}, datastore=other)["decoder_input_ids"]
        assert captioner.processor.batch_decode(swapped_prompt)[0].count("a zebra on the moon") == store.k
    options = {"num_beams": 1, "max_new_tokens": 30}
    piped = [out[0]["generated_text"] for out in captioner(list(test["image_path"]), **options)]
    assert piped == [line["caption"] for line in lines]
    # batched: prompts of other lengths, padded on the left (the pipeline's own tokenizer padded them on the right)
    assert [out[0]["generated_text"] for out in captioner(list(test["image_path"]), batch_size=2, **options)] == piped
    with pytest.raises(ValueError, match="prompt is the retrieved captions"):
        captioner(test["image_path"][0], prompt="a photo of")
    from itune_hf.app import load_service

    with pytest.raises(ValueError, match="trained with retrieval prompts .* which the page does not retrieve yet"):
        load_service(str(model))  # itune serve: refused, not captioned without its prompts
    assert run(["caption", "--adapter", f"a={model}", test["image_path"][0]]) == 2  # never without its prompts
    assert "retrieval runs with --runtime torch and one --model" in capsys.readouterr().err
    assert run(["caption", "--model", model, "--prompt", "a photo of", test["image_path"][0]]) == 2
    assert "the retrieved captions are the prompt; drop --prompt" in capsys.readouterr().err


def test_make_datastore_builds_the_datastore_training_built_and_eval_reads_it(
    data_and_cache, retrieval_model, tmp_path, capsys
):
    data, cache = data_and_cache
    model, _ = retrieval_model
    built = tmp_path / "store"
    argv = ["make-datastore", "--data", data, "--feature-cache", cache, "--k", "2", "--output-dir", built]
    assert run(argv) == 0
    assert f"wrote a datastore of 20 images ({data}, train)" in capsys.readouterr().out
    mine, own = CaptionDatastore.load(built), CaptionDatastore.load(model / "datastore")
    assert (mine.image_ids, mine.captions, mine.k) == (own.image_ids, own.captions, own.k)
    assert torch.equal(mine.keys, own.keys) and mine.tower["vision_config_sha256"]  # the cache's tower, recorded
    assert own.tower["vision_weights_sha256"] == mine.tower["vision_weights_sha256"]  # by training's too
    out = ["--num-beams", "1", "--overwrite", "--output-dir"]
    assert run(["eval", "--model", model, "--data", data, "--feature-cache", cache, *out, tmp_path / "own"]) == 0
    assert run(["eval", "--model", model, "--data", data, "--feature-cache", cache, "--datastore", built,
                *out, tmp_path / "built"]) == 0  # fmt: skip
    assert (tmp_path / "own" / "results.json").read_text() == (tmp_path / "built" / "results.json").read_text()
    capsys.readouterr()
    assert run([*argv[:-1], tmp_path / "store"]) == 0  # the same folder again: rewritten
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("mine")
    assert run([*argv[:-1], tmp_path / "elsewhere"]) == 2
    assert "--overwrite" in capsys.readouterr().err and (tmp_path / "elsewhere" / "notes.txt").exists()
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    (empty / "fingerprint.json").write_text((cache / "fingerprint.json").read_text())
    assert run(["make-datastore", "--data", data, "--feature-cache", empty, "--output-dir", tmp_path / "s2"]) == 2
    assert "holds no states of 20 of the 20 images" in capsys.readouterr().err
    lite_cache, lite_store = tmp_path / "lite-cache", tmp_path / "lite-store"  # another tower's keys: refused
    lite = ["--preset", "itune-tiny-lite-random"]
    assert run(["cache-features", *lite, "--data", data, "--output-dir", lite_cache]) == 0
    assert run(["make-datastore", "--data", data, "--feature-cache", lite_cache, "--output-dir", lite_store]) == 0
    capsys.readouterr()
    assert run(["eval", "--model", model, "--data", data, "--feature-cache", cache, "--datastore", lite_store,
                *out, tmp_path / "lite"]) == 2  # fmt: skip
    assert "the datastore's keys were made by another vision tower than the feature cache" in capsys.readouterr().err


def test_retrieval_is_refused_where_it_cannot_work_naming_what_to_do(data_and_cache, tmp_path, capsys):
    data, cache = data_and_cache
    out = ["--max-steps", "1", "--output-dir", tmp_path / "o"]
    assert run(["train", "--data", data, "--retrieval", "train", *TINY, *out]) == 2
    assert "pass --feature-cache" in capsys.readouterr().err
    xgpt = ["--preset", "xgpt-tiny-random", "--report-to", "none", "--batch-size", "4"]
    assert run(["train", "--data", data, "--feature-cache", cache, "--retrieval", "train", *xgpt, *out]) == 2
    assert "retrieval augmentation gives I-Tuning's LM the retrieved captions" in capsys.readouterr().err
    assert run(["train", "--data", data, "--feature-cache", cache, "--retrieval", tmp_path, *TINY, *out]) == 2
    assert "so not a caption datastore" in capsys.readouterr().err


def test_a_training_batch_carries_the_prompt_without_loss(data_and_cache):
    """The collator's batch: BOS, the prompt, the caption; labels only on the caption and EOS."""
    from dataclasses import replace

    from itune_hf.presets import build_processor
    from itune_hf.vision.feature_cache import FeatureCache
    from itune_hf.vision.inputs import VisualInputs

    _, cache = data_and_cache
    processor = build_processor("itune-tiny-random")
    items = [{"image_id": FeatureCache(cache).image_ids()[0], "image_path": ""}]
    prompt = "Similar images: a red circle; a blue star. This image:"
    prompts = {items[0]["image_id"]: prompt}
    visual = replace(VisualInputs("grid", FeatureCache(cache)), prompts=prompts, prompt_tokens=30)
    batch = visual(processor, items, captions=["A green square."])
    prompt_ids = processor.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    caption_ids = processor.tokenizer(" A green square.", add_special_tokens=False)["input_ids"]
    ids, labels = batch["decoder_input_ids"][0].tolist(), batch["labels"][0].tolist()
    assert ids[1 : 1 + len(prompt_ids)] == prompt_ids
    assert [t for t in labels if t != -100] == [*caption_ids, processor.tokenizer.eos_token_id]
