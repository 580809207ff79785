"""Which vision tokens the I-Tuning modules read (`visual_tokens`) and the vision tower's final layer norm on them
(`final_norm`): the baselines study's ablations, as settings of the native model, the PEFT adapter and `itune train`."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from peft import PeftModel, get_peft_model

from itune_hf import ITuningAdapterConfig, save_adapter
from itune_hf.cli import main
from itune_hf.data import make_synthetic
from itune_hf.explain import explain_caption
from itune_hf.models.ituning import modeling_ituning
from itune_hf.models.loading import load_captioner
from itune_hf.presets import build_model, build_processor

from conftest import random_batch, tiny_model

TOKENS = 17  # the tiny CLIP tower: CLS + a 4 x 4 patch grid


def with_random_modules(**settings):
    return tiny_model(seed=0, init="random", first_layer=2, **settings)


@functools.cache
def states_and_ids():
    """A default model (every token, as the tower returns it), the tower's states of a batch and its captions."""
    pixel_values, captions = random_batch()
    model = with_random_modules()
    with torch.no_grad():
        states = model.encode_images(pixel_values).last_hidden_state  # what a feature cache holds
    return model, states, captions


@pytest.mark.parametrize(
    "settings, keys, select",
    [
        ({"visual_tokens": "cls"}, 1, lambda states, norm: states[:, :1]),
        ({"visual_tokens": "patches"}, TOKENS - 1, lambda states, norm: states[:, 1:]),
        ({"final_norm": True}, TOKENS, lambda states, norm: norm(states)),
        ({"visual_tokens": "cls", "final_norm": True}, 1, lambda states, norm: norm(states[:, :1])),  # = pooler_output
    ],
)
def test_each_setting_gives_the_modules_the_tokens_it_names(settings, keys, select):
    default, states, captions = states_and_ids()
    model = with_random_modules(**settings)
    with torch.no_grad():
        out = model(encoder_outputs=states, labels=captions, output_attentions=True)  # cached raw states
        expected = default(encoder_outputs=select(states, model.vision_model.post_layernorm), labels=captions)
    assert all(attention.shape[-1] == keys for attention in out.cross_attentions)
    torch.testing.assert_close(out.logits, expected.logits)
    assert out.encoder_last_hidden_state is states  # the model still reports the tower's own output


def test_defaults_are_every_token_as_the_tower_returns_it():
    default, states, captions = states_and_ids()
    assert (default.config.visual_tokens, default.config.final_norm) == ("all", None)
    explicit = with_random_modules(visual_tokens="all", final_norm=False)  # CLIP returns its states before the norm
    with torch.no_grad():
        ours = default(encoder_outputs=states, labels=captions, output_attentions=True)
        theirs = explicit(encoder_outputs=states, labels=captions, output_attentions=True)
    assert torch.equal(ours.logits, theirs.logits) and ours.cross_attentions[0].shape[-1] == TOKENS
    assert sum(p.numel() for p in with_random_modules(visual_tokens="cls").parameters() if p.requires_grad) == sum(
        p.numel() for p in default.parameters() if p.requires_grad
    )


def test_generation_projects_the_selected_keys_once():
    model = with_random_modules(visual_tokens="patches", final_norm=True)
    seen = []
    model.ituning["3"].k_proj.register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    pixel_values, _ = random_batch()
    model.generate(pixel_values=pixel_values, num_beams=3, max_new_tokens=3, min_new_tokens=3)
    assert seen == [(2, TOKENS - 1, 32)]  # the selection is memoised: the cached keys/values stay valid


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"visual_tokens": "center"}, "visual_tokens must be one of"),
        ({"final_norm": "yes"}, "final_norm must be"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        ITuningAdapterConfig(**settings)
    with pytest.raises((ValueError, TypeError), match="visual_tokens|final_norm"):
        tiny_model(**settings)


def test_a_tower_that_cannot_give_the_tokens_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="visual_tokens='cls': the vision tower siglip_vision_model has no CLS"):
        tiny_model(vision="siglip", visual_tokens="cls")
    with pytest.raises(ValueError, match="final_norm=False: the vision tower siglip_vision_model applies"):
        get_peft_model(tiny_model(vision="siglip", add_ituning_modules=False), ITuningAdapterConfig(final_norm=False))
    tiny_model(vision="siglip", visual_tokens="patches", final_norm=True)  # SigLIP has no CLS and normalises itself
    monkeypatch.delitem(modeling_ituning.VISION_TOWER_LAYOUTS, "clip_vision_model")
    with pytest.raises(ValueError, match="token layout of the vision tower CLIPVisionModel .* is unknown"):
        tiny_model(visual_tokens="patches")
    tiny_model()  # the defaults need no layout


def test_the_adapter_honours_the_settings_and_saves_them(tmp_path):
    native = with_random_modules(visual_tokens="patches", final_norm=True)
    save_adapter(native, tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (saved["visual_tokens"], saved["final_norm"]) == ("patches", True)
    adapter = PeftModel.from_pretrained(tiny_model(seed=0, add_ituning_modules=False), tmp_path / "adapter").eval()
    assert adapter.peft_config["default"].visual_tokens == "patches"
    pixel_values, captions = random_batch()
    with torch.no_grad():
        expected = native(pixel_values=pixel_values, labels=captions).logits
        torch.testing.assert_close(adapter(pixel_values=pixel_values, labels=captions).logits, expected)
    adapter.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
    assert (again["visual_tokens"], again["final_norm"]) == ("patches", True)


def test_itune_train_flags_reach_the_saved_adapter(tmp_path):
    world = make_synthetic(tmp_path / "world", num_images=8, seed=1, image_size=32)
    features, out = tmp_path / "features", tmp_path / "run"
    cache = ["cache-features", "--data", str(world), "--preset", "itune-tiny-random", "--output-dir", str(features)]
    assert main(cache) == 0  # the tower's raw last hidden states: the same cache serves every setting
    argv = ["train", "--preset", "itune-tiny-random", "--data", str(world), "--output-dir", str(out)]
    argv += ["--max-steps", "1", "--batch-size", "2", "--eval-split", "none", "--report-to", "none"]
    argv += ["--visual-tokens", "cls", "--final-norm", "--feature-cache", str(features)]
    assert main(argv) == 0
    saved = json.loads((out / "adapter_config.json").read_text())
    assert (saved["visual_tokens"], saved["final_norm"]) == ("cls", True)
    model, _ = load_captioner(str(out))
    assert (model.config.visual_tokens, model.config.final_norm) == ("cls", True)


def test_itune_train_refuses_a_bad_value_naming_the_flag(tmp_path, capsys):
    argv = ["train", "--preset", "itune-tiny-random", "--output-dir", str(tmp_path / "x"), "--visual-tokens", "mid"]
    assert main(argv) == 2
    assert "visual_tokens must be one of" in capsys.readouterr().err


def test_explain_draws_the_patches_and_refuses_a_cls_only_model():
    image = np.random.RandomState(0).randint(0, 255, (32, 32, 3), dtype=np.uint8)
    processor = build_processor("itune-tiny-random")
    torch.manual_seed(0)
    model = build_model("itune-tiny-random", visual_tokens="patches").eval()
    for module in model.ituning.values():
        torch.nn.init.normal_(module.o_proj.weight, std=0.5)
    explained = explain_caption(model, processor, image, max_new_tokens=3)
    assert explained.heatmaps.shape[1:] == (4, 4) and not explained.cls_attention.any()
    np.testing.assert_allclose(explained.heatmaps.sum((1, 2)), 1.0, rtol=1e-5)
    model.config.visual_tokens = "cls"  # the modules read the setting at each forward pass
    with pytest.raises(ValueError, match="visual_tokens='cls'.*no map over the image"):
        explain_caption(model, processor, image, max_new_tokens=3)
