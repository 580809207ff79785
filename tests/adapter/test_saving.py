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
