"""The frozen LM in 8 and 4 bits (`itune_hf.models.quantization`, bitsandbytes): close to full precision, a fraction of
the bytes, trained through, and refused where it cannot apply."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from itune_hf.errors import InputError
from itune_hf.models.quantization import frozen_linear_layers, parameter_bytes, quantize_frozen_lm

from conftest import random_batch, tiny_model

# Relative error of the logits (Frobenius norm) on tiny random LMs: measured 0.005-0.008 (8bit), 0.09-0.13 (4bit);
# the real SmolLM2-135M: 0.07 (8bit, same top-1 token at every position) and 0.18 (4bit).
BOUNDS = {"8bit": 0.03, "4bit": 0.25}


@pytest.fixture
def bnb():
    """bitsandbytes (the `quant` extra, which `make test` installs); the tests that quantise skip without it."""
    return pytest.importorskip("bitsandbytes")


def quantised_class(bnb, load_in: str) -> type:
    return {"8bit": bnb.nn.Linear8bitLt, "4bit": bnb.nn.Linear4bit}[load_in]


def logits(model, pixel_values, captions):
    with torch.no_grad():
        return model(pixel_values=pixel_values, decoder_input_ids=captions).logits


@pytest.mark.parametrize("load_in", ["8bit", "4bit"])
@pytest.mark.parametrize("text", ["gpt2", "llama"])
def test_logits_stay_close_to_full_precision_and_only_the_lms_own_layers_are_quantised(bnb, text, load_in):
    model = tiny_model(text, hidden=64)
    pixel_values, captions = random_batch()
    expected = logits(model, pixel_values, captions)
    vision_before = {k: v.clone() for k, v in model.vision_model.state_dict().items()}
    linear = len(frozen_linear_layers(model.language_model))

    done = quantize_frozen_lm(model, load_in)

    found = logits(model, pixel_values, captions)
    error = ((found - expected).norm() / expected.norm()).item()
    assert error < BOUNDS[load_in], error
    quantised = quantised_class(bnb, load_in)
    assert done.layers == linear == sum(isinstance(m, quantised) for m in model.language_model.modules())
    assert not frozen_linear_layers(model.language_model)  # every Linear/Conv1D was replaced (GPT-2's Conv1D too)
    assert type(model.language_model.get_output_embeddings()) is nn.Linear  # the LM head stays
    assert not any(isinstance(m, quantised) for m in model.vision_model.modules())
    assert all(torch.equal(vision_before[k], v) for k, v in model.vision_model.state_dict().items())
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.ituning.parameters())


@pytest.mark.parametrize(("load_in", "low", "high"), [("8bit", 3.5, 4.0), ("4bit", 6.5, 8.0)])
def test_the_quantised_layers_take_about_a_quarter_or_an_eighth_of_the_bytes(bnb, load_in, low, high):
    model = tiny_model("llama", hidden=128)  # no biases: the bytes are the weights' and their scales'
    layers = frozen_linear_layers(model.language_model)
    before = sum(parameter_bytes(getattr(parent, name)) for parent, name in layers)

    done = quantize_frozen_lm(model, load_in)

    after = sum(parameter_bytes(getattr(parent, name)) for parent, name in layers)
    assert low < before / after <= high, before / after
    assert done.bytes_before - done.bytes_after == before - after  # the record counts the same bytes


def test_conv1d_weights_are_quantised_in_the_orientation_of_a_linear_layer(bnb):
    layer = Conv1D(96, 64)  # GPT-2's layer: weight (in, out)
    torch.nn.init.normal_(layer.weight, std=0.02)
    parent = nn.Sequential(layer).requires_grad_(False)
    inputs = torch.randn(3, 64)
    expected = parent(inputs)
    quantize_frozen_lm(parent, "8bit")
    assert isinstance(parent[0], bnb.nn.Linear8bitLt)
    assert ((parent(inputs) - expected).norm() / expected.norm()).item() < 0.02


@pytest.mark.parametrize("load_in", ["8bit", "4bit"])
def test_a_training_step_changes_only_the_adapter_and_its_loss_is_close_to_full_precision(bnb, load_in):
    from peft import get_peft_model

    from itune_hf.adapter import ITuningAdapterConfig

    pixel_values, captions = random_batch(batch=4)
    losses, changed, frozen = {}, {}, {}
    for load in (None, load_in):
        base = tiny_model("llama", hidden=64, add_ituning_modules=False)
        if load is not None:
            quantize_frozen_lm(base, load)
        torch.manual_seed(0)
        model = get_peft_model(base, ITuningAdapterConfig(first_layer=1)).train()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        frozen_before = {k: v.clone() for k, v in base.language_model.state_dict().items() if "ituning" not in k}
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        loss = model(pixel_values=pixel_values, labels=captions).loss
        loss.backward()
        optimizer.step()
        losses[load] = loss.item()
        changed[load] = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
        state = base.language_model.state_dict()
        frozen[load] = all(torch.equal(state[k], v) for k, v in frozen_before.items())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed[load_in] and changed[load_in] <= trainable  # the modules learned, nothing else moved
    assert all(".ituning_modules." in n for n in changed[load_in])
    assert frozen[load_in] and frozen[None]
    assert abs(losses[load_in] - losses[None]) / losses[None] < {"8bit": 0.01, "4bit": 0.05}[load_in], losses


def test_without_bitsandbytes_the_option_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if it were not installed
    with pytest.raises(InputError, match=r"--load-in 4bit: .* needs bitsandbytes.*pip install 'itune_hf\[quant\]'"):
        quantize_frozen_lm(tiny_model("llama", hidden=64), "4bit")


def test_refusals_name_the_problem_and_what_to_do(bnb):
    model = tiny_model("llama", hidden=64)
    with pytest.raises(ValueError, match="load_in must be one of 8bit, 4bit"):
        quantize_frozen_lm(model, "3bit")
    model.language_model.model.layers[0].mlp.requires_grad_(True)
    with pytest.raises(ValueError, match="3 linear layers of the LM train; only a frozen LM is quantised"):
        quantize_frozen_lm(model, "8bit")
    model.language_model.requires_grad_(False)
    quantize_frozen_lm(model, "8bit")
    with pytest.raises(ValueError, match="already loaded in 8bit; load it again"):
        quantize_frozen_lm(model, "4bit")
