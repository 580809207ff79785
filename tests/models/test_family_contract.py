"""What every registered model family must do, run over `families()`: a new family passes the same checks by
shipping a tiny random preset (`<something>-tiny-random`) and nothing else.

Saved whole, it loads through the Auto classes and the pipeline, and as remote code where itune_hf is not installed,
captioning the same; generation with and without the KV cache agrees; `itune train` runs two steps of it and writes a
model card with YAML metadata naming the family.
"""

from __future__ import annotations

import json

import pytest
import torch

from itune_hf import cli
from itune_hf.data import make_synthetic
from itune_hf.hub import save_captioner
from itune_hf.models import families, family_of
from itune_hf.presets import build_model, build_processor, get_preset, list_presets

from conftest import run_where_itune_hf_is_not_installed, write_photo

NEW_TOKENS = 4


def tiny_preset(family: str) -> str:
    """The family's tiny random preset (every family ships one, for tests and smoke runs)."""
    names = [n for n in list_presets() if n.endswith("tiny-random") and get_preset(n).family_name == family]
    assert names, f"the {family} family has no '*-tiny-random' preset: add one to itune_hf/presets/models.json"
    return sorted(names)[0]


FAMILIES = sorted(families())


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract-photos")
    return [str(write_photo(root / f"{i}.png", color=c)) for i, c in enumerate([(200, 30, 30), (30, 30, 200)])]


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory, photos):
    """(preset, the model with its trained part moved from its init, its processor, the saved directory)."""
    preset = tiny_preset(request.param)
    torch.manual_seed(3)
    model, processor = build_model(preset).eval(), build_processor(preset)
    with torch.no_grad():  # a load that skipped the trained part would show
        for parameter in (p for p in model.parameters() if p.requires_grad):
            parameter.add_(0.05 * torch.randn_like(parameter))
    directory = save_captioner(model, tmp_path_factory.mktemp(f"saved-{request.param}"), processor=processor)
    return preset, model, processor, directory


def greedy(model, processor, photos, **kwargs) -> torch.Tensor:
    return model.generate(**processor(images=photos), num_beams=1, max_new_tokens=NEW_TOKENS, **kwargs)


def test_auto_classes_and_the_pipeline_load_the_saved_family(saved, photos):
    from transformers import AutoModelForImageTextToText, AutoProcessor, pipeline

    preset, model, processor, directory = saved
    expected = greedy(model, processor, photos)
    loaded = AutoModelForImageTextToText.from_pretrained(directory).eval()
    loaded_processor = AutoProcessor.from_pretrained(directory)
    assert family_of(loaded).name == get_preset(preset).family_name
    assert torch.equal(greedy(loaded, loaded_processor, photos), expected)
    captioner = pipeline("image-to-text", model=str(directory))
    text = captioner(photos[0], num_beams=1, max_new_tokens=NEW_TOKENS)[0]["generated_text"]
    assert text == processor.batch_decode(expected[:1])[0]


def test_generation_with_the_cache_equals_generation_without_it(saved, photos):
    _, model, processor, _ = saved
    cached, uncached = (greedy(model, processor, photos, use_cache=use) for use in (True, False))
    assert torch.equal(cached, uncached)


def test_a_callers_max_length_wins_over_the_saved_default_in_generate_and_the_pipeline(saved, photos):
    import warnings

    from transformers import GenerationConfig, pipeline

    _, model, processor, directory = saved
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "both max_new_tokens and max_length" warning: the caller's length wins
        ids = model.generate(**processor(images=photos), num_beams=1, max_length=3)
    assert ids.shape[1] <= 3 and torch.equal(ids, greedy(model, processor, photos)[:, : ids.shape[1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same length given by a passed GenerationConfig
        configured = model.generate(**processor(images=photos), generation_config=GenerationConfig(max_length=3))
    assert torch.equal(configured, model.generate(**processor(images=photos), max_length=3))
    captioner = pipeline("image-to-text", model=str(directory))
    piped = captioner(photos[0], generate_kwargs={"num_beams": 1, "max_length": 3})[0]["generated_text"]
    assert piped == processor.batch_decode(ids[:1])[0]


@pytest.mark.parametrize("beams", [1, 2])
@pytest.mark.parametrize("prompts", [None, ["a", "a red thing on the"]], ids=["plain", "prompted"])
def test_a_caption_does_not_depend_on_the_rest_of_its_batch(saved, photos, prompts, beams):
    _, model, processor, _ = saved
    decoding = {
        "num_beams": beams,
        "max_new_tokens": NEW_TOKENS,
        "output_scores": True,
        "return_dict_in_generate": True,
    }

    def inputs(rows):  # prompts of different lengths: the shorter one is left-padded in the batch
        texts = None if prompts is None else [prompts[i] for i in rows]
        return processor(images=[photos[i] for i in rows], text=texts, padding=True)

    batched = model.generate(**inputs([0, 1]), **decoding)
    for row in range(2):
        alone = model.generate(**inputs([row]), **decoding)
        for step, (together, single) in enumerate(zip(batched.scores, alone.scores)):
            torch.testing.assert_close(together[row * beams : (row + 1) * beams], single, atol=1e-4, rtol=1e-4,
                                       msg=f"row {row}, step {step}")  # fmt: skip
        assert torch.equal(batched.sequences[row, -NEW_TOKENS:], alone.sequences[0, -NEW_TOKENS:])


@pytest.mark.parametrize("family", FAMILIES)
def test_config_return_dict_false_gives_tuples_and_the_same_captions(family, photos):
    preset = tiny_preset(family)
    torch.manual_seed(0)
    model, processor = build_model(preset).eval(), build_processor(preset)
    inputs = processor(images=photos, captions=["a red thing", "a blue thing"][: len(photos)])
    with torch.no_grad():
        expected, captions = model(**inputs).loss, greedy(model, processor, photos)
        model.config.return_dict = False  # transformers' convention: forward returns a tuple, loss first
        output = model(**inputs)
        assert isinstance(output, tuple) and torch.equal(output[0], expected)
        assert torch.equal(greedy(model, processor, photos), captions)


@pytest.mark.parametrize("family", FAMILIES)
def test_prompts_as_a_tuple_are_one_per_image_as_a_list_is(family, photos):
    processor = build_processor(tiny_preset(family))
    as_list = processor(images=photos[:2], text=["a", "the red"])
    as_tuple = processor(images=photos[:2], text=("a", "the red"))
    assert torch.equal(as_tuple["decoder_input_ids"], as_list["decoder_input_ids"])
    assert processor(text=("a", "the red"))["decoder_input_ids"].shape[0] == 2  # no images: still two prompts


@pytest.mark.parametrize("family", FAMILIES)
def test_output_hidden_states_returns_the_towers_as_encoder_hidden_states(family, photos):
    preset = tiny_preset(family)
    model, processor = build_model(preset).eval(), build_processor(preset)
    inputs = processor(images=photos[:1], captions=["a red thing"])
    with torch.no_grad():
        plain, full = model(**inputs), model(**inputs, output_hidden_states=True)
    assert plain.encoder_hidden_states is None and len(full.encoder_hidden_states) > 1
    torch.testing.assert_close(full.encoder_hidden_states[-1][:, 0], full.encoder_last_hidden_state[:, 0])


@pytest.mark.parametrize("family", FAMILIES)
def test_training_mode_leaves_the_frozen_vision_tower_computing_as_at_inference(family):
    """A frozen convolutional tower in training mode would normalise by each batch and overwrite its statistics."""
    model = build_model(tiny_preset(family))
    tower = getattr(model, "vision_model", None) or model.get_encoder()
    assert not any(p.requires_grad for p in tower.parameters())
    model.train()
    assert not tower.training and not any(module.training for module in tower.modules())
    assert model.training and any(module.training for module in model.modules() if module is not tower)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_to_keep_keeps_the_last_positions_logits(family, photos):
    preset = tiny_preset(family)
    model, processor = build_model(preset).eval(), build_processor(preset)
    inputs = processor(images=photos, captions=["a red thing", "a blue thing"][: len(photos)])
    inputs.pop("labels", None)
    with torch.no_grad():
        full, last = model(**inputs).logits, model(**inputs, logits_to_keep=1).logits
    assert last.shape[1] == 1 and torch.allclose(last[:, 0], full[:, -1], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_resize_token_embeddings_grows_the_vocabulary_the_model_predicts(family, photos):
    preset = tiny_preset(family)
    model, processor = build_model(preset).eval(), build_processor(preset)
    size = model.get_input_embeddings().weight.shape[0] + 3  # e.g. added special tokens
    model.resize_token_embeddings(size)
    assert model.get_output_embeddings().weight.shape[0] == size == model.config.get_text_config().vocab_size
    assert model(**processor(images=photos[:1], text=["a"])).logits.shape[-1] == size


def test_itune_caption_decodes_as_the_models_generation_config_the_papers_unless_told(saved, photos, capsys):
    preset, model, processor, directory = saved
    family = families()[get_preset(preset).family_name]
    assert model.generation_config.num_beams == family.load("card").num_beams  # the paper's beam size, one source
    command = ["caption", *photos, "--model", str(directory), "--max-new-tokens", str(NEW_TOKENS), "--json"]
    for beams in (None, 1):
        capsys.readouterr()
        assert cli.main(command + (["--num-beams", str(beams)] if beams else [])) == 0
        printed = [json.loads(line)["caption"] for line in capsys.readouterr().out.strip().splitlines()]
        kwargs = {"num_beams": beams} if beams else {}
        ids = model.generate(**processor(images=photos), max_new_tokens=NEW_TOKENS, **kwargs)
        assert printed == processor.batch_decode(ids), beams


@pytest.mark.slow
def test_the_saved_family_loads_as_remote_code_without_itune_hf(saved, photos, tmp_path):
    _, model, processor, directory = saved
    expected = greedy(model, processor, photos[:1]).tolist()
    call = f"model.generate(**processor(images=[{photos[0]!r}]), num_beams=1, max_new_tokens={NEW_TOKENS})"
    module, ids = run_where_itune_hf_is_not_installed(directory, call, tmp_path)
    assert module.startswith("transformers_modules.") and ids == expected


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("contract-world") / "data", num_images=16, seed=2, image_size=32)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_itune_train_runs_two_steps_and_writes_a_card(family, world, tmp_path):
    preset, out = tiny_preset(family), tmp_path / "run"
    args = ["train", "--preset", preset, "--data", world, "--output-dir", out, "--max-steps", 2, "--batch-size", 4]
    args += ["--report-to", "none", "--eval-max-images", 2, "--eval-max-new-tokens", 3]
    assert cli.main(list(map(str, args))) == 0
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 2
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "\n---\n" in card[4:], "a model card starts with YAML metadata"
    assert families()[family].title in card


@pytest.mark.parametrize("family", FAMILIES)
def test_no_image_or_unbatched_pixels_are_refused_in_one_line(family, photos):
    """Each was an error from inside transformers or the tower ("not enough values to unpack")."""
    preset = tiny_preset(family)
    model, processor = build_model(preset).eval(), build_processor(preset)
    pixels = processor(images=photos[:1])["pixel_values"]
    with pytest.raises(
        ValueError, match=r"generate\(\) captions an image, but got no pixel_values or .*encoder_outputs"
    ):
        model.generate(max_new_tokens=2)
    unbatched = r"pixel_values has shape \(3, \d+, \d+\); expected \(batch, channels, height, width\)"
    with pytest.raises(ValueError, match=unbatched):
        model.generate(pixel_values=pixels[0], max_new_tokens=2)
    with pytest.raises(ValueError, match=unbatched), torch.no_grad():
        model(pixel_values=pixels[0], labels=processor(images=photos[:1], captions=["a red thing"])["labels"])


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_strings_stop_and_generate_returns_the_towers_hidden_states_with_attentions(family, photos):
    """XGPT's forward got generate's `tokenizer` (a TypeError); I-Tuning dropped `encoder_hidden_states` when
    attentions were asked for too."""
    preset = tiny_preset(family)
    torch.manual_seed(0)
    model, processor = build_model(preset).eval(), build_processor(preset)
    inputs = processor(images=photos[:1])
    free = greedy(model, processor, photos[:1])
    first = processor.tokenizer.decode(free[0, 1:2])
    assert free.shape[1] > 2 and first.strip()  # it would go on: stopping shows
    stopped = greedy(model, processor, photos[:1], stop_strings=[first], tokenizer=processor.tokenizer)
    assert stopped.shape[1] == 2 and torch.equal(stopped[0], free[0, :2])  # the start token and the stop string's
    out = model.generate(**inputs, num_beams=1, max_new_tokens=2, output_attentions=True, output_hidden_states=True,
                         return_dict_in_generate=True)  # fmt: skip
    assert out.encoder_hidden_states is not None and len(out.encoder_hidden_states) > 1


def test_clipcap_refuses_assisted_decoding_in_one_line(photos):
    """Its LM's cache holds the prefix, which assisted decoding does not count: it failed inside GPT-2."""
    model, processor = build_model("clipcap-mlp-tiny-random").eval(), build_processor("clipcap-mlp-tiny-random")
    with pytest.raises(ValueError, match="assistant_model: ClipCap's LM cache also holds its image prefix"):
        model.generate(**processor(images=photos[:1]), num_beams=1, max_new_tokens=3, assistant_model=model)
