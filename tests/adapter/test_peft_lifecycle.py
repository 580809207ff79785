"""The I-Tuning adapter through the PEFT calls a LoRA user makes, behaving as LoRA does where both can."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from huggingface_hub import ModelCard
from peft import PeftModel, get_peft_model
from transformers import CLIPVisionModel, GPT2LMHeadModel

from itune_hf import ITuningAdapterConfig, ITuningForCaptioning

from conftest import random_batch, tiny_model, tiny_text_config, tiny_vision_config


def bare_base(seed: int = 0, **kwargs):
    return tiny_model(seed=seed, add_ituning_modules=False, **kwargs)


def logits_of(model, pixel_values, captions):
    with torch.no_grad():
        return model(pixel_values=pixel_values, labels=captions).logits


@pytest.mark.parametrize("visual_tokens", ["all", "cls"])
def test_a_bf16_base_trains_with_the_fp32_adapter_weights_peft_keeps(visual_tokens):
    model = get_peft_model(bare_base().to(torch.bfloat16), ITuningAdapterConfig(visual_tokens=visual_tokens))
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}  # PEFT's autocast_adapter_dtype
    pixel_values, _ = random_batch()
    captions = torch.randint(3, 100, (2, 60))  # long enough that the module attends with autograd on, unregrouped
    model.train()(pixel_values=pixel_values.to(torch.bfloat16), labels=captions).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_an_adapter_of_another_base_saved_into_the_same_folder_loads_as_saved(tmp_path):
    torch.manual_seed(0)
    CLIPVisionModel(tiny_vision_config()).save_pretrained(tmp_path / "vision")
    for width in (32, 48):
        GPT2LMHeadModel(tiny_text_config(hidden=width)).save_pretrained(tmp_path / f"gpt2-{width}")
    folder = tmp_path / "adapter"
    for width in (32, 48):  # a run again with another LM, into the same output folder
        base = ITuningForCaptioning.from_vision_text_pretrained(
            str(tmp_path / "vision"), str(tmp_path / f"gpt2-{width}"), add_ituning_modules=False
        )
        adapted = get_peft_model(base, ITuningAdapterConfig(init="random")).eval()
        adapted.save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["text_config"]["_name_or_path"].endswith("gpt2-48")
    pixel_values, captions = random_batch()
    reloaded = ITuningForCaptioning.from_pretrained(folder)
    torch.testing.assert_close(logits_of(reloaded, pixel_values, captions), logits_of(adapted, pixel_values, captions))


def test_a_named_adapter_saved_alone_gets_a_card_without_pefts_empty_base(tmp_path):
    model = get_peft_model(bare_base(), ITuningAdapterConfig())
    model.add_adapter("b", ITuningAdapterConfig())
    model.save_pretrained(tmp_path, selected_adapters=["b"], save_embedding_layers=False)
    assert (tmp_path / "b" / "adapter_config.json").is_file()
    assert ModelCard.load(tmp_path / "README.md").data.base_model is None  # PEFT wrote base_model: ''


def test_low_cpu_mem_usage_loads_as_a_plain_load_does(tmp_path):
    adapted = get_peft_model(bare_base(), ITuningAdapterConfig(init="random")).eval()
    adapted.save_pretrained(tmp_path, save_embedding_layers=False)
    reloaded = PeftModel.from_pretrained(bare_base(), tmp_path, low_cpu_mem_usage=True).eval()
    assert not any(p.is_meta for p in reloaded.parameters())
    pixel_values, captions = random_batch()
    assert torch.equal(logits_of(reloaded, pixel_values, captions), logits_of(adapted, pixel_values, captions))
    empty = get_peft_model(bare_base(), ITuningAdapterConfig(), low_cpu_mem_usage=True)
    assert all(p.is_meta for n, p in empty.named_parameters() if ".ituning_modules." in n)  # as LoRA's: to load into


def test_one_config_serves_bases_of_other_sizes_as_a_lora_config_does():
    config = ITuningAdapterConfig()
    small = get_peft_model(bare_base(), config)
    large = get_peft_model(tiny_model(add_ituning_modules=False, layers=6), config)
    assert config.text_num_layers is None and config.target_modules is None  # the caller's config is left as given
    assert small.peft_config["default"].text_num_layers == 4 and large.peft_config["default"].text_num_layers == 6


def test_a_text_task_type_and_text_model_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="has no PEFT task type"):
        ITuningAdapterConfig(task_type="CAUSAL_LM")
    model, (pixel_values, captions) = bare_base(), random_batch()
    loss = model(pixel_values=pixel_values, labels=captions).loss
    given_none = model(pixel_values=pixel_values, labels=captions, input_ids=None, attention_mask=None)
    assert torch.equal(given_none.loss, loss)
    with pytest.raises(ValueError, match="takes the caption as decoder_input_ids"):
        model(pixel_values=pixel_values, input_ids=captions)


def test_unmerging_with_nothing_merged_warns_as_lora_does():
    model = get_peft_model(bare_base(), ITuningAdapterConfig())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.unmerge_adapter()
    assert any("Nothing to do" in str(w.message) for w in caught)
    with pytest.raises(NotImplementedError, match="cannot be merged"):
        model.merge_adapter()
