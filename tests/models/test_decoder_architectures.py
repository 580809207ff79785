"""Decoder architectures of `DECODER_FFN_MAPPING` that run I-Tuning end to end from a tiny random config: the fresh
modules leave the frozen LM's logits unchanged, a training step reaches every module and nothing else, and beam
search generates. Every architecture of the mapping is here; the README lists exactly these as tested
(tests/package/test_readme.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from itune_hf import ITuningConfig, ITuningForCaptioning

from conftest import BOS, EOS, VOCAB, random_batch, tiny_vision_config

# model type -> its tiny config's own fields (sizes common to all are added below)
TINY_DECODERS: dict[str, dict] = {
    "qwen2": {"num_key_value_heads": 2},
    "qwen3": {"num_key_value_heads": 2, "head_dim": 8},
    "gemma": {"num_key_value_heads": 2, "head_dim": 8},
    "gemma2": {"num_key_value_heads": 2, "head_dim": 8},
    "mistral": {"num_key_value_heads": 2},
    "falcon": {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True},
    "gpt_neox": {},
    "phi": {},
    "olmo": {},
    "bloom": {"n_head": 4},
    "gptj": {"n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "num_layers": 2, "num_heads": 4},
    "gpt_bigcode": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
    "codegen": {"n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4, "n_positions": 64, "n_ctx": 64},
    "mixtral": {"num_key_value_heads": 2, "num_local_experts": 2, "num_experts_per_tok": 1},
    "olmo2": {"num_key_value_heads": 2},
    "phi3": {"num_key_value_heads": 2},
    "stablelm": {"num_key_value_heads": 2},
    "granite": {"num_key_value_heads": 2},
    "cohere": {"num_key_value_heads": 2},
    "smollm3": {"num_key_value_heads": 2},
}
# how the README names each (tests/package/test_readme.py checks it lists exactly these as tested)
NAMES = {
    "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma", "gemma2": "Gemma2", "mistral": "Mistral", "falcon": "Falcon",
    "gpt_neox": "GPT-NeoX", "phi": "Phi", "olmo": "OLMo", "bloom": "Bloom", "gptj": "GPT-J", "gpt_neo": "GPT-Neo",
    "gpt_bigcode": "GPT-BigCode", "codegen": "CodeGen", "mixtral": "Mixtral", "olmo2": "OLMo2", "phi3": "Phi-3",
    "stablelm": "StableLM", "granite": "Granite", "cohere": "Cohere", "smollm3": "SmolLM3",
}  # fmt: skip
# GPT-2 and Llama run throughout tests/models/test_modeling.py (and the real SmolLM2-135M in the demo's tests).
TESTED_DECODERS = ("gpt2", "llama", *TINY_DECODERS)


def test_every_mapped_architecture_is_run_here():
    from itune_hf.models.ituning.modeling_ituning import DECODER_FFN_MAPPING

    assert set(DECODER_FFN_MAPPING) == set(TESTED_DECODERS)


def tiny_decoder_config(model_type: str):
    sizes = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=2,
    )
    return AutoConfig.for_model(model_type, **{**sizes, **TINY_DECODERS[model_type]})


@pytest.mark.parametrize("model_type", list(TINY_DECODERS))
def test_ituning_runs_on_the_decoder(model_type):
    text_config = tiny_decoder_config(model_type)
    config = ITuningConfig(vision_config=tiny_vision_config().to_dict(), text_config=text_config.to_dict())
    torch.manual_seed(0)
    model = ITuningForCaptioning(config).eval()
    assert len(model.ituning) == text_config.num_hidden_layers
    pixel_values, captions = random_batch()
    ids = torch.cat([torch.full_like(captions[:, :1], BOS), captions[:, :-1]], dim=1)
    plain_lm = AutoModelForCausalLM.from_config(model.config.text_config).eval()
    plain_lm.load_state_dict(model.language_model.state_dict())
    with torch.no_grad():  # zero-initialised modules: the frozen LM, exactly
        torch.testing.assert_close(
            model(pixel_values=pixel_values, decoder_input_ids=ids).logits, plain_lm(input_ids=ids).logits
        )

    model.train()
    model(pixel_values=pixel_values, labels=captions).loss.backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, p in model.named_parameters() if p.grad is not None}
    assert trainable and all(n.startswith("ituning.") for n in trainable)

    model.eval()
    out = model.generate(pixel_values=pixel_values, num_beams=2, max_new_tokens=3, min_new_tokens=3)
    assert out.shape[0] == 2 and out.shape[1] >= 3
