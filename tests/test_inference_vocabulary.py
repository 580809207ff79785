"""A vocabulary shortlist for faster captioning (`optimize_for_inference(vocabulary=...)`, `--vocabulary`): the LM
head and beam search work over the shortlist's tokens, and `generate` still speaks the tokenizer's ids."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from itune_hf.inference import VocabularyShortlist, caption_vocabulary, optimize_for_inference

from conftest import VOCAB, random_batch, tiny_model, tiny_processor, write_photo


def model_for(text: str):
    return tiny_model(text, init="random", scale=4.0)


def special_ids(model) -> set[int]:
    config = model.generation_config
    return {config.bos_token_id, config.eos_token_id, config.pad_token_id, config.decoder_start_token_id} - {None}


def generate(model, pixel_values, **kwargs):
    with torch.no_grad():
        return model.generate(pixel_values=pixel_values, **{"max_new_tokens": 6, **kwargs})


@pytest.mark.parametrize("text", ["gpt2", "llama"])
def test_greedy_captions_are_unchanged_when_the_shortlist_holds_their_tokens(text):
    pixel_values, _ = random_batch(batch=3)
    reference = generate(model_for(text), pixel_values, num_beams=1)
    used = set(reference.unique().tolist()) | special_ids(model_for(text))
    distractors = set(range(3, VOCAB, 7)) - used  # tokens the model never picked: the head still scores them
    shortlisted = optimize_for_inference(model_for(text), vocabulary=used | distractors)
    assert shortlisted.language_model.get_output_embeddings().out_features == len(used | distractors) < VOCAB
    assert torch.equal(generate(shortlisted, pixel_values, num_beams=1), reference)


def test_shortlisted_logits_are_the_full_logits_of_those_tokens():
    pixel_values, captions = random_batch(batch=2)
    keep = sorted(set(captions.unique().tolist()) | set(range(0, VOCAB, 3)) | special_ids(model_for("llama")))
    shortlist = VocabularyShortlist(keep, VOCAB)
    with torch.no_grad():
        full = model_for("llama")(pixel_values=pixel_values, decoder_input_ids=captions).logits
        model = optimize_for_inference(model_for("llama"), vocabulary=keep)
        short = model(pixel_values=pixel_values, decoder_input_ids=shortlist.to_short(captions, "captions")).logits
    assert short.shape[-1] == len(keep)
    torch.testing.assert_close(short, full[..., keep], rtol=1e-5, atol=1e-5)


def test_beam_search_returns_tokenizer_ids_from_the_shortlist_and_translates_a_prompt():
    pixel_values, _ = random_batch(batch=2)
    base = model_for("gpt2")
    keep = sorted({10, 11, 20, 42, 57, 99} | special_ids(base))
    model = optimize_for_inference(model_for("gpt2"), vocabulary=keep)
    out = generate(model, pixel_values, num_beams=3, return_dict_in_generate=True, output_scores=True)
    assert set(out.sequences.unique().tolist()) <= set(keep) and out.sequences.shape[0] == 2
    assert out.scores[0].shape[-1] == len(keep)  # scores stay over the shortlist (documented)
    start = base.generation_config.decoder_start_token_id
    prompt = torch.tensor([[start, 42, 11], [start, 57, 20]])
    ids = generate(model, pixel_values, num_beams=2, decoder_input_ids=prompt)
    assert torch.equal(ids[:, :3], prompt) and set(ids.unique().tolist()) <= set(keep)
    beyond = generate(model, pixel_values, num_beams=2, eos_token_id=VOCAB, max_new_tokens=4, min_new_tokens=0)
    assert beyond.shape[1] == 5  # an EOS beyond the vocabulary stays beyond the shortlist: nothing stops early
    with pytest.raises(ValueError, match=r"decoder_input_ids \(the prompt\): token ids \[12\] are not in"):
        generate(model, pixel_values, decoder_input_ids=torch.tensor([[start, 12], [start, 11]]))


def test_a_passed_generation_config_gives_what_the_same_keywords_give():
    from transformers import GenerationConfig

    from itune_hf.presets import build_model, build_processor

    torch.manual_seed(0)
    model, processor = build_model("itune-tiny-random").eval(), build_processor("itune-tiny-random")
    optimize_for_inference(model, vocabulary=caption_vocabulary(processor, ["a cat on a mat", "two birds"]))
    inputs = processor(images=[Image.new("RGB", (64, 48), (120, 30, 200))])
    with torch.no_grad():
        expected = model.generate(**inputs, num_beams=2, max_new_tokens=6)
        # its special tokens unset: generate filled them from the model's, in GPT-2's ids (an IndexError)
        got = model.generate(**inputs, generation_config=GenerationConfig(num_beams=2, max_new_tokens=6))
    assert torch.equal(got, expected)


def test_bad_shortlists_and_untranslatable_settings_are_refused():
    pixel_values, _ = random_batch(batch=1)
    with pytest.raises(ValueError, match="vocabulary: the shortlist is empty"):
        optimize_for_inference(model_for("gpt2"), vocabulary=[])
    with pytest.raises(ValueError, match=rf"token ids \[{VOCAB}\] are outside the LM's vocabulary"):
        optimize_for_inference(model_for("gpt2"), vocabulary=[1, 2, VOCAB])
    eos = model_for("gpt2").generation_config.eos_token_id
    with pytest.raises(ValueError, match=rf"the model's eos_token_id: token ids \[{eos}\] are not in"):
        optimize_for_inference(model_for("gpt2"), vocabulary=[i for i in range(VOCAB) if i != eos])
    model = optimize_for_inference(model_for("gpt2"), vocabulary=range(VOCAB))
    with pytest.raises(ValueError, match="cannot translate bad_words_ids"):
        generate(model, pixel_values, bad_words_ids=[[5]])
    with pytest.raises(ValueError, match="already has a shortlist"):
        optimize_for_inference(model, vocabulary=range(VOCAB))


def test_caption_vocabulary_holds_the_training_tokens_and_the_special_ones():
    processor = tiny_processor()
    captions = ["A red square on a blue background.", "Two green circles."]
    ids = caption_vocabulary(processor, captions, batch_size=1)
    tokens = {i for caption in captions for i in processor.tokenizer(caption, add_special_tokens=False)["input_ids"]}
    specials = {processor.bos_token_id, processor.eos_token_id, processor.pad_token_id}
    assert ids == sorted(tokens | specials)  # exactly what training feeds and predicts
    with pytest.raises(ValueError, match="no captions given"):
        caption_vocabulary(processor, [])


def test_itune_caption_with_a_vocabulary_file(captioner_dirs, tmp_path, capsys):
    from itune_hf import ITuningForCaptioning, ITuningProcessor
    from itune_hf.cli import main

    directory = captioner_dirs["full"]
    image = write_photo(tmp_path / "photo.jpg", color=(200, 30, 30))
    captions = tmp_path / "captions.txt"
    captions.write_text("a red photo of a cat\n\nthe dog sits on a mat\n", encoding="utf-8")
    assert main(["caption", str(image), "--model", str(directory), "--vocabulary", str(captions), "--json",
                 "--num-beams", "2", "--max-new-tokens", "5", "--no-progress"]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["caption"]

    processor = ITuningProcessor.from_pretrained(directory)
    vocabulary = caption_vocabulary(processor, ["a red photo of a cat", "the dog sits on a mat"])
    model = optimize_for_inference(ITuningForCaptioning.from_pretrained(directory), vocabulary=vocabulary)
    with torch.no_grad():
        ids = model.generate(**processor(images=str(image)), num_beams=2, max_new_tokens=5)
    assert set(ids.unique().tolist()) <= set(vocabulary)
    assert printed == processor.batch_decode(ids, skip_special_tokens=True)[0].strip()

    assert main(["caption", str(image), "--model", str(directory), "--vocabulary", str(tmp_path / "no.txt")]) == 2
    assert "--vocabulary " + str(tmp_path / "no.txt") + ": no such file" in capsys.readouterr().err


def test_bf16_with_a_shortlist_keeps_the_small_head_in_float32(monkeypatch):
    from itune_hf.inference import optimize as inference

    monkeypatch.setattr(inference, "native_bf16", lambda device="cpu": True)
    pixel_values, _ = random_batch(batch=2)
    keep = set(range(0, VOCAB, 2)) | special_ids(model_for("llama"))
    model = optimize_for_inference(model_for("llama"), precision="bf16", vocabulary=keep)
    head = model.language_model.get_output_embeddings()
    assert head.weight.dtype == torch.float32 and model.language_model.model.layers[0].mlp.up_proj.weight.dtype == (
        torch.bfloat16
    )
    out = generate(model, pixel_values, num_beams=2, return_dict_in_generate=True, output_scores=True)
    assert out.scores[0].dtype == torch.float32 and set(out.sequences.unique().tolist()) <= keep
