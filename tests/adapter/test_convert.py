"""Adapter-only checkpoints and native models (`itune_hf.adapter.convert`): a native model exported as adapter-only
files that load back natively and with PEFT, an adapter-only load in the dtype it is given, and a folder holding an
adapter's weights without its config."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_processor


def test_adapter_folder_without_its_config_says_so(captioner_dirs, tmp_path):
    import shutil

    from itune_hf import ITuningForCaptioning

    folder = shutil.copytree(captioner_dirs["adapter"], tmp_path / "adapter")
    (folder / "adapter_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors but no adapter_config.json"):
        ITuningForCaptioning.from_pretrained(folder)


def test_adapter_only_load_follows_the_dtype(captioner_dirs):
    from itune_hf import ITuningForCaptioning

    for name in ("dtype", "torch_dtype"):  # torch_dtype: transformers' old name, which it still honours
        model = ITuningForCaptioning.from_pretrained(captioner_dirs["adapter"], **{name: torch.bfloat16})
        assert {p.dtype for p in model.ituning.parameters()} == {torch.bfloat16}, name
        assert {p.dtype for p in model.language_model.parameters()} == {torch.bfloat16}, name


def test_a_native_model_exports_adapter_only_files_and_callers_max_length_wins(captioner_dirs, backbone_dirs, tmp_path):
    from peft import PeftModel

    from itune_hf import ITuningForCaptioning, save_adapter

    native = ITuningForCaptioning.from_pretrained(captioner_dirs["full"]).eval()
    folder = save_adapter(native, tmp_path / "exported", processor=tiny_processor())
    assert not (folder / "model.safetensors").exists() and (folder / "adapter_model.safetensors").exists()
    pixels = torch.randn(1, 3, 32, 32)
    ids = native.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5)
    reloaded = ITuningForCaptioning.from_pretrained(folder).eval()
    assert torch.equal(reloaded.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    vision, text = (str(p) for p in backbone_dirs)
    base = ITuningForCaptioning.from_vision_text_pretrained(vision, text, add_ituning_modules=False)
    with_peft = PeftModel.from_pretrained(base, folder).eval()
    assert torch.equal(with_peft.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    assert native.generate(pixel_values=pixels, num_beams=1, min_new_tokens=20, max_length=8).shape[1] == 8


def test_an_adapter_folder_carries_its_generation_config(tmp_path):
    from itune_hf import ITuningForCaptioning, build_model, save_adapter

    model = build_model("itune-tiny-random")
    model.generation_config.num_beams, model.generation_config.max_new_tokens = 2, 4
    save_adapter(model, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "generation_config.json").is_file()
    loaded = ITuningForCaptioning.from_pretrained(tmp_path / "adapter")
    assert (loaded.generation_config.num_beams, loaded.generation_config.max_new_tokens) == (2, 4)
    # a folder whose generation_config.json a user edited: the load follows the file
    (tmp_path / "adapter" / "generation_config.json").write_text('{"num_beams": 3, "max_new_tokens": 7}')
    edited = ITuningForCaptioning.from_pretrained(tmp_path / "adapter").generation_config
    assert (edited.num_beams, edited.max_new_tokens) == (3, 7)
