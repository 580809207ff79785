"""An adapter-only folder loads under `from_pretrained`'s options as the full checkpoint of the same model does, and a
save into a folder that held another save leaves only what it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi
from peft import get_peft_model
from transformers import AutoModelForImageTextToText, GenerationConfig

from itune_hf import ITuningAdapterConfig, ITuningForCaptioning, build_model, save_adapter
from itune_hf.hub import push_captioner_to_hub, save_captioner

from conftest import random_batch


def dtypes(model) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


def loaded(path, **options):
    out = AutoModelForImageTextToText.from_pretrained(path, **options)
    return out if isinstance(out, tuple) else (out, None)


@pytest.mark.parametrize(
    "options",
    [
        {"dtype": torch.bfloat16},
        {"dtype": "bfloat16"},
        {"dtype": "float16"},
        {"dtype": "auto"},
        {"attn_implementation": "eager"},
        {"output_loading_info": True},
        {"device_map": "cpu"},
    ],
    ids=str,
)
def test_adapter_folders_honour_the_options_a_full_checkpoint_honours(captioner_dirs, options):
    full, full_info = loaded(captioner_dirs["full"], **options)
    adapter, adapter_info = loaded(captioner_dirs["adapter"], **options)
    assert dtypes(adapter) == dtypes(full) and len(dtypes(adapter)) == 1
    if "attn_implementation" in options:
        for model in (full, adapter):
            for config in (model.config, model.language_model.config, model.vision_model.config):
                assert config._attn_implementation == options["attn_implementation"]
    assert (adapter_info is None) == (full_info is None)
    if adapter_info is not None:
        assert set(adapter_info) == set(full_info) and not any(adapter_info.values())


def test_an_adapter_saved_in_bf16_over_a_preset_loads_in_bf16_as_its_full_checkpoint(tmp_path):
    model = build_model("itune-tiny-random", init="random").to(torch.bfloat16).eval()
    save_adapter(model, tmp_path / "adapter")
    model.save_pretrained(tmp_path / "full")
    for kind in ("adapter", "full"):
        assert dtypes(loaded(tmp_path / kind)[0]) == {torch.bfloat16}
        assert dtypes(loaded(tmp_path / kind, dtype="float32")[0]) == {torch.float32}
    preset = ITuningForCaptioning.from_pretrained("itune-tiny-random", dtype="bfloat16", attn_implementation="eager")
    assert dtypes(preset) == {torch.bfloat16} and preset.config.text_config._attn_implementation == "eager"


def test_options_an_adapter_folder_cannot_honour_are_refused_by_name(captioner_dirs):
    with pytest.raises(ValueError, match="dtype='int8' is not a floating torch dtype"):
        AutoModelForImageTextToText.from_pretrained(captioner_dirs["adapter"], dtype="int8")
    with pytest.raises(ValueError, match="loads onto one device"):
        AutoModelForImageTextToText.from_pretrained(captioner_dirs["adapter"], device_map={"a": "cpu", "b": "disk"})


def test_a_save_over_another_leaves_only_what_it_wrote(captioner_dirs, tmp_path):
    full = ITuningForCaptioning.from_pretrained(captioner_dirs["full"])
    with torch.no_grad():  # another model of the same shape
        full.language_model.transformer.h[0].mlp.c_fc.weight.mul_(3)
    torch.manual_seed(1)
    adapted = get_peft_model(build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig())
    folder = tmp_path / "model"
    save_captioner(full, folder, max_shard_size="20KB")  # sharded, then an adapter, then whole
    assert list(folder.glob("model-*-of-*.safetensors"))
    save_captioner(adapted, folder)
    assert not list(folder.glob("model*.safetensors*"))
    pixel_values, captions = random_batch()
    with torch.no_grad():
        want = adapted.eval()(pixel_values=pixel_values, labels=captions).logits
        got = ITuningForCaptioning.from_pretrained(folder)(pixel_values=pixel_values, labels=captions).logits
    torch.testing.assert_close(got, want)
    save_captioner(full, folder)
    assert not (folder / "adapter_config.json").exists() and not (folder / "adapter_model.safetensors").exists()
    assert (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").exists()
    (folder / "notes.txt").write_text("mine")
    save_captioner(full, folder)
    assert (folder / "notes.txt").read_text() == "mine"  # the user's own files stay


def test_a_peft_adapter_keeps_its_decoding_and_a_presets_backbones_are_not_uploaded(tmp_path):
    adapted = get_peft_model(build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig())
    adapted.get_base_model().generation_config = GenerationConfig(
        **{**adapted.get_base_model().generation_config.to_diff_dict(), "num_beams": 2, "max_new_tokens": 7}
    )
    save_captioner(adapted, tmp_path / "adapter")
    reloaded = ITuningForCaptioning.from_pretrained(tmp_path / "adapter")
    assert (reloaded.generation_config.num_beams, reloaded.generation_config.max_new_tokens) == (2, 7)

    uploaded = {}

    class Recording(HfApi):
        def create_repo(self, *args, **kwargs):
            return None

        def upload_folder(self, *, folder_path, **kwargs):
            uploaded.update({p.name: p.stat().st_size for p in Path(folder_path).rglob("*")})
            return "commit"

    push_captioner_to_hub(adapted, "me/adapter", api=Recording())
    assert "adapter_model.safetensors" in uploaded and "backbones" not in uploaded
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        "itune-tiny-random"
    )
