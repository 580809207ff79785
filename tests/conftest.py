"""Shared fixtures: tiny random backbones built from configs (no downloads), seconds per test."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import CLIPVisionConfig, GPT2Config, LlamaConfig, SiglipVisionConfig

from itune_hf import ITuningConfig, ITuningForCaptioning

VOCAB = 100
BOS, EOS = 0, 1
IMAGE_SIZE = 32


def tiny_vision_config(kind: str = "clip", hidden: int = 32):
    common = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=8,
    )
    if kind == "clip":
        return CLIPVisionConfig(**common)
    if kind == "siglip":
        return SiglipVisionConfig(**common)
    raise ValueError(kind)


def tiny_text_config(kind: str = "gpt2", hidden: int = 32, layers: int = 4):
    if kind == "gpt2":
        return GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=128,
            bos_token_id=BOS,
            eos_token_id=EOS,
        )
    if kind == "llama":
        return LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=128,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=2,
        )
    raise ValueError(kind)


def tiny_config(text: str = "gpt2", vision: str = "clip", **kwargs) -> ITuningConfig:
    text_kwargs = {k: kwargs.pop(k) for k in ("hidden", "layers") if k in kwargs}
    return ITuningConfig(
        vision_config=tiny_vision_config(vision).to_dict(),
        text_config=tiny_text_config(text, **text_kwargs).to_dict(),
        **kwargs,
    )


def tiny_model(text: str = "gpt2", vision: str = "clip", seed: int = 0, **kwargs) -> ITuningForCaptioning:
    torch.manual_seed(seed)
    return ITuningForCaptioning(tiny_config(text, vision, **kwargs)).eval()


def random_batch(batch: int = 2, length: int = 7, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    pixel_values = torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    captions = torch.randint(3, VOCAB, (batch, length), generator=generator)
    return pixel_values, captions


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Tests never touch the network: the Hub is unreachable here and CI must not depend on it."""
    if not os.environ.get("ITUNE_TEST_HUB"):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
