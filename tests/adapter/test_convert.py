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
