"""`itune_hf.inference.optimize_for_inference`: int8 and bf16 captioning settings, and the exact default."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from itune_hf.inference import Int8Linear, optimize_for_inference
from itune_hf.inference import optimize as inference
from itune_hf.models.ituning.modeling_ituning import ITuningModule

from conftest import random_batch, tiny_model


def model_for(text: str):
    return tiny_model(text, init="random", scale=4.0)  # modules that change the output


def logits(model, pixel_values: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(pixel_values=pixel_values, decoder_input_ids=captions).logits.float()


def greedy(model, pixel_values: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(pixel_values=pixel_values, num_beams=1, max_new_tokens=6, min_new_tokens=6)


@pytest.mark.parametrize("text", ["gpt2", "llama"])
def test_int8_is_close_to_fp32(text):
    pixel_values, captions = random_batch(batch=3)
    reference = model_for(text)
    quantised = optimize_for_inference(model_for(text), int8=True)
    expected, got = logits(reference, pixel_values, captions), logits(quantised, pixel_values, captions)
    assert not torch.equal(expected, got)  # it did quantise
    assert (got - expected).abs().max() <= 0.03 * expected.abs().max()
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree >= 0.9
    assert torch.equal(greedy(quantised, pixel_values[:1]), greedy(reference, pixel_values[:1]))


@pytest.mark.parametrize("text", ["gpt2", "llama"])
def test_int8_quantises_the_frozen_lm_only(text):
    model = optimize_for_inference(model_for(text), int8=True)
    lm_layers = [m for m in model.language_model.modules() if type(m) in (nn.Linear, Conv1D)]
    assert lm_layers == []  # every linear layer of the LM (GPT-2's Conv1D included), LM head included
    assert isinstance(model.language_model.get_output_embeddings(), Int8Linear)
    assert model.language_model.get_input_embeddings().weight.dtype == torch.float32  # tied embedding untouched
    ituning = [m for m in model.ituning.modules() if isinstance(m, nn.Linear)]
    assert len(ituning) == 4 * len(model.ituning) and all(m.weight.dtype == torch.float32 for m in ituning)
    assert not any(isinstance(m, Int8Linear) for m in model.vision_model.modules())


def test_int8_leaves_peft_ituning_modules_in_float():
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig

    base = tiny_model("llama", add_ituning_modules=False)
    adapted = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    optimize_for_inference(adapted.base_model.model, int8=True)
    modules = [m for m in adapted.modules() if isinstance(m, ITuningModule)]
    assert modules and all(isinstance(m.q_proj, nn.Linear) for m in modules)
    pixel_values, _ = random_batch(batch=2)
    assert greedy(adapted, pixel_values).shape == (2, 7)


def test_default_is_exact():
    pixel_values, captions = random_batch(batch=2)
    reference = model_for("llama")
    optimized = optimize_for_inference(model_for("llama"))
    assert torch.equal(logits(optimized, pixel_values, captions), logits(reference, pixel_values, captions))
    with torch.no_grad():
        expected = reference.generate(pixel_values=pixel_values, num_beams=3, max_new_tokens=5)
        got = optimized.generate(pixel_values=pixel_values, num_beams=3, max_new_tokens=5)
    assert torch.equal(got, expected)


def test_bf16_is_refused_without_native_support(monkeypatch):
    monkeypatch.setattr(inference, "native_bf16", lambda device="cpu": False)
    with pytest.raises(ValueError, match=r"precision='bf16'.*no native bf16.*'auto'"):
        optimize_for_inference(model_for("gpt2"), precision="bf16")
    model = optimize_for_inference(model_for("gpt2"), precision="auto")
    assert model.language_model.dtype == torch.float32 and model._itune_inference["precision"] == "fp32"


def test_bf16_where_native_keeps_ituning_in_fp32(monkeypatch):
    monkeypatch.setattr(inference, "native_bf16", lambda device="cpu": True)
    model = optimize_for_inference(model_for("llama"), precision="auto")
    assert model.language_model.dtype == torch.bfloat16 and model.vision_model.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.ituning.parameters())
    pixel_values, captions = random_batch(batch=2)
    expected = logits(model_for("llama"), pixel_values, captions)
    assert (logits(model, pixel_values, captions) - expected).abs().max() <= 0.05 * expected.abs().max()
    assert greedy(model, pixel_values).shape == (2, 7)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match=r"precision='fp16' is not one of fp32, bf16, auto"):
        optimize_for_inference(model_for("gpt2"), precision="fp16")
    with pytest.raises(TypeError, match="ITuningForCaptioning"):
        optimize_for_inference(nn.Linear(2, 2))


def test_int8_layer_matches_linear_and_conv1d():
    torch.manual_seed(0)
    linear = nn.Linear(48, 20)
    conv = Conv1D(20, 48)
    conv.weight.data = linear.weight.data.t().clone()
    conv.bias.data = linear.bias.data.clone()
    x = torch.randn(2, 5, 48)
    expected = linear(x).detach()
    for layer in (linear, conv):
        got = Int8Linear.from_float(layer)(x)
        assert got.shape == expected.shape and (got - expected).abs().max() < 0.02 * expected.abs().max()
    assert Int8Linear.from_float(linear)(x[:1, :1]).shape == (1, 1, 20)  # one row (greedy, batch 1)


def test_pipeline_with_an_optimized_model(captioner_dirs):
    from PIL import Image
    from transformers import pipeline

    from itune_hf import ITuningForCaptioning, ITuningProcessor

    directory = captioner_dirs["full"]
    model = optimize_for_inference(ITuningForCaptioning.from_pretrained(directory), int8=True)
    captioner = pipeline("image-to-text", model=model, processor=ITuningProcessor.from_pretrained(directory))
    (result,) = captioner(Image.new("RGB", (40, 32), (200, 30, 30)), num_beams=2, max_new_tokens=4)
    assert isinstance(result["generated_text"], str)
