"""Saving an I-Tuning adapter (`itune_hf.adapter.saving`): a `PeftModel` on a preset's base saves quietly, without
PEFT's Hub lookups and their warnings, offline or not."""

from __future__ import annotations


def test_saving_an_adapter_gives_no_peft_hub_lookup_warnings(tmp_path):
    import warnings

    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor

    base = build_model("itune-tiny-random", add_ituning_modules=False)
    adapted = get_peft_model(base, ITuningAdapterConfig(first_layer=1))  # its base: a preset name, not a Hub repo
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_captioner(adapted, tmp_path / "adapter", processor=build_processor("itune-tiny-random"))
    assert not [str(w.message) for w in caught if "config file" in str(w.message) or "remote file" in str(w.message)]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_every_adapter_is_checked_against_the_base_and_records_it(tmp_path):
    """PEFT runs the tuner's pre-injection hook for the first adapter only: `add_adapter` and `load_adapter` skipped
    the base check (an adapter of another tower loaded silently) and the record (a second adapter saved with null
    base fields and no reference config.json, which the Auto classes could not open)."""
    import json

    import pytest
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from itune_hf import ITuningAdapterConfig
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model

    lite = get_peft_model(build_model("itune-tiny-lite-random", add_ituning_modules=False), ITuningAdapterConfig())
    lite.save_pretrained(tmp_path / "lite")
    model = get_peft_model(build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig())
    with pytest.raises(ValueError, match=r"built for .*efficientnet_lite.*mismatch in \['vision_model_type'\]"):
        model.load_adapter(tmp_path / "lite", adapter_name="other")
    torch.manual_seed(0)
    model.add_adapter("second", ITuningAdapterConfig(first_layer=2, init="random"))
    model.save_pretrained(tmp_path / "both")
    second = tmp_path / "both" / "second"
    recorded = json.loads((second / "adapter_config.json").read_text())
    assert recorded["text_model_type"] == "gpt2" and recorded["vision_model_type"] and recorded["bottleneck_dim"]
    model.set_adapter("second")
    model.eval()
    pixels = torch.randn(1, 3, 32, 32)
    expected = model.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4)
    reloaded = AutoModelForImageTextToText.from_pretrained(second).eval()
    assert torch.equal(reloaded.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), expected)
    save_captioner(model, tmp_path / "selected", selected_adapters=["second"])  # PEFT puts it in selected/second
    assert not (tmp_path / "selected" / "config.json").exists()  # the reference went beside the adapter
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "selected" / "second").eval()
    assert torch.equal(reloaded.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), expected)


def test_save_captioner_leaves_the_models_config_as_it_was(tmp_path):
    """It named the backbones it saved (`backbones/vision`) in the live config, so a later plain save elsewhere
    pointed at folders that were not there."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from itune_hf import ITuningAdapterConfig
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor

    torch.manual_seed(0)
    adapted = get_peft_model(
        build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig(init="random")
    ).eval()
    config = adapted.get_base_model().config
    names = (config.vision_config._name_or_path, config.text_config._name_or_path)
    save_captioner(adapted, tmp_path / "a", processor=build_processor("itune-tiny-random"))
    assert (config.vision_config._name_or_path, config.text_config._name_or_path) == names
    adapted.save_pretrained(tmp_path / "b")
    pixels = torch.randn(1, 3, 32, 32)
    expected = adapted.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4)
    for folder in ("a", "b"):
        reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / folder).eval()
        assert torch.equal(reloaded.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), expected), folder
