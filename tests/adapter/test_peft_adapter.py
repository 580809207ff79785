"""I-Tuning as a PEFT adapter type, used exactly through PEFT's public API."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file, save_file

from itune_hf import ITuningAdapterConfig, build_model

from conftest import random_batch, tiny_model


def bare_base(seed: int = 0, **kwargs):
    return tiny_model(seed=seed, add_ituning_modules=False, **kwargs)


def per_module_params(d: int = 32, dv: int = 32) -> int:
    r = d // 2
    return (d * r + r) + 2 * (dv * r + r) + (r * d + d)


def logits_of(model, pixel_values, captions):
    with torch.no_grad():
        return model(pixel_values=pixel_values, labels=captions).logits


def test_get_peft_model_trains_only_adapter_weights_and_reports_them(capsys):
    base = bare_base()
    total_base = sum(p.numel() for p in base.parameters())
    model = get_peft_model(base, ITuningAdapterConfig(first_layer=1))
    model.print_trainable_parameters()
    reported = capsys.readouterr().out
    trainable, total = (int(x.replace(",", "")) for x in re.findall(r"params: ([\d,]+)", reported)[:2])
    assert trainable == 3 * per_module_params()
    assert total == total_base + trainable
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(".ituning_modules.default." in n for n in names)

    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    pixel_values, captions = random_batch()
    model.train()
    for _ in range(3):
        optimizer.zero_grad()
        model(pixel_values=pixel_values, labels=captions).loss.backward()
        optimizer.step()
    assert all(torch.equal(p, frozen_before[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "o_proj" in n and p.requires_grad)


def test_saved_adapter_holds_only_ituning_weights(tmp_path):
    model = get_peft_model(bare_base(), ITuningAdapterConfig(first_layer=1, init="random"))
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "config.json",  # the base's reference (no weights): the Auto classes open the folder through it
    ]
    assert json.loads((tmp_path / "config.json").read_text())["add_ituning_modules"] is False
    weights = tmp_path / "adapter_model.safetensors"
    state = load_file(weights)
    assert state and all(".ituning_modules." in k for k in state)
    assert not any(k.startswith(("base_model.model.vision_model", "vision_model")) for k in state)
    assert not any(re.search(r"\.(c_fc|c_proj|attn|wte|wpe|lm_head)\.", k) for k in state)
    count = sum(v.numel() for v in state.values())
    assert count == 3 * per_module_params()
    header_size = struct.unpack("<Q", weights.read_bytes()[:8])[0]
    assert weights.stat().st_size == 8 + header_size + 4 * count  # fp32: nothing else in the file
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["peft_type"] == "ITUNING" and config["text_hidden_size"] == 32 and config["bottleneck_dim"] == 16


@pytest.mark.slow
def test_adapter_restores_identical_outputs_in_a_fresh_process(tmp_path):
    base = bare_base()
    base.save_pretrained(tmp_path / "base")
    model = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    model.save_pretrained(tmp_path / "adapter")
    pixel_values, captions = random_batch()
    torch.save(
        {"pixel_values": pixel_values, "captions": captions, "logits": logits_of(model, pixel_values, captions)},
        tmp_path / "io.pt",
    )
    script = textwrap.dedent(f"""
        import torch
        import itune_hf
        from itune_hf import ITuningForCaptioning
        from peft import PeftModel
        torch.set_num_threads({torch.get_num_threads()})
        base = ITuningForCaptioning.from_pretrained({str(tmp_path / "base")!r})
        model = PeftModel.from_pretrained(base, {str(tmp_path / "adapter")!r}).eval()
        io = torch.load({str(tmp_path / "io.pt")!r})
        with torch.no_grad():
            logits = model(pixel_values=io["pixel_values"], labels=io["captions"]).logits
        assert torch.equal(logits, io["logits"]), (logits - io["logits"]).abs().max()
        print("identical")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("identical")


def test_disabled_adapter_gives_exactly_the_frozen_base():
    base = bare_base()
    pixel_values, captions = random_batch()
    expected = logits_of(base, pixel_values, captions)
    model = get_peft_model(base, ITuningAdapterConfig(init="random")).eval()
    assert not torch.allclose(logits_of(model, pixel_values, captions), expected)
    with model.disable_adapter():
        assert torch.equal(logits_of(model, pixel_values, captions), expected)
        assert model.base_model.model.image_layers() == []
    assert not torch.allclose(logits_of(model, pixel_values, captions), expected)


def test_several_named_adapters_on_one_base(tmp_path):
    model = get_peft_model(bare_base(), ITuningAdapterConfig(init="random")).eval()
    torch.manual_seed(5)
    model.add_adapter("drop2", ITuningAdapterConfig(init="random", first_layer=2))
    pixel_values, captions = random_batch()
    default_out = logits_of(model, pixel_values, captions)
    captioner = model.base_model.model
    assert captioner.image_layers() == [0, 1, 2, 3]
    model.set_adapter("drop2")
    assert captioner.image_layers() == [2, 3]
    drop2_out = logits_of(model, pixel_values, captions)
    assert not torch.allclose(default_out, drop2_out)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".ituning_modules.drop2." in n
    }
    model.save_pretrained(tmp_path)
    assert (tmp_path / "drop2" / "adapter_model.safetensors").exists()

    restored = PeftModel.from_pretrained(bare_base(), tmp_path).eval()
    restored.load_adapter(tmp_path / "drop2", adapter_name="drop2")
    assert torch.equal(logits_of(restored, pixel_values, captions), default_out)
    restored.set_adapter("drop2")
    assert torch.equal(logits_of(restored, pixel_values, captions), drop2_out)
    # the same files load under another adapter name: the name is not part of the saved keys
    renamed = PeftModel.from_pretrained(bare_base(), tmp_path / "drop2", adapter_name="other").eval()
    assert torch.equal(logits_of(renamed, pixel_values, captions), drop2_out)


def test_merging_is_refused_with_a_clear_error():
    model = get_peft_model(bare_base(), ITuningAdapterConfig())
    with pytest.raises(NotImplementedError, match="cannot be merged"):
        model.merge_and_unload()
    with pytest.raises(NotImplementedError, match="cannot be merged"):
        model.merge_adapter()
    with pytest.raises(NotImplementedError, match="a weighted sum of adapters .* is not defined for them"):
        model.add_weighted_adapter(["default"], [0.5], "half")  # PEFT's call: this message, no AttributeError


def test_adapter_on_a_base_of_another_size_or_architecture_fails_naming_both(tmp_path):
    get_peft_model(bare_base(), ITuningAdapterConfig()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"built for LM gpt2 \(hidden 32.*base model has LM gpt2 \(hidden 48"):
        PeftModel.from_pretrained(bare_base(hidden=48), tmp_path)
    with pytest.raises(ValueError, match=r"LM gpt2 .*LM llama.*text_model_type"):
        PeftModel.from_pretrained(bare_base(text="llama"), tmp_path)


def test_tampered_adapter_files_never_load_partially(tmp_path):
    get_peft_model(bare_base(), ITuningAdapterConfig(bottleneck_dim=8)).save_pretrained(tmp_path)
    config_path = tmp_path / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["bottleneck_dim"] = 16  # the config no longer matches the weights
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"has shape \(8,.*\) in the checkpoint but \(16,.*\) in the model"):
        PeftModel.from_pretrained(bare_base(), tmp_path)
    config["bottleneck_dim"] = 8
    config_path.write_text(json.dumps(config))
    weights = tmp_path / "adapter_model.safetensors"
    state = load_file(weights)
    state.pop(sorted(state)[0])
    save_file(state, weights)
    with pytest.raises(ValueError, match="1 module weights missing"):
        PeftModel.from_pretrained(bare_base(), tmp_path)


def test_adapter_needs_an_ituning_captioning_base():
    from transformers import AutoModelForCausalLM

    from conftest import tiny_text_config

    with pytest.raises(TypeError, match="attaches to an ITuningForCaptioning"):
        get_peft_model(AutoModelForCausalLM.from_config(tiny_text_config()), ITuningAdapterConfig())


def test_layers_below_the_adapter_build_no_autograd_graph():
    model = get_peft_model(bare_base(), ITuningAdapterConfig(first_layer=2, init="random"))
    captioner = model.base_model.model
    captioner.enable_input_require_grads()
    outputs = {}
    for site in captioner.ffn_sites:
        site.layer.register_forward_hook(
            lambda module, args, out, i=site.index: outputs.__setitem__(i, out[0] if isinstance(out, tuple) else out)
        )
    pixel_values, captions = random_batch()
    model.train()
    loss = model(pixel_values=pixel_values, labels=captions).loss
    assert outputs[0].grad_fn is None and outputs[1].grad_fn is None and outputs[2].grad_fn is not None
    loss.backward()


def test_first_layer_narrows_given_target_modules_and_survives_a_reload(tmp_path):
    every_lm_block = r".*language_model\.transformer\.h\.\d+\.mlp$"
    model = get_peft_model(bare_base(), ITuningAdapterConfig(first_layer=2, target_modules=every_lm_block))

    def wrapped(peft_model):
        names = (n for n, _ in peft_model.named_parameters() if ".ituning_modules." in n)
        return sorted({int(re.search(r"\.h\.(\d+)\.mlp", n).group(1)) for n in names})

    assert wrapped(model) == [2, 3]
    model.save_pretrained(tmp_path)
    assert wrapped(PeftModel.from_pretrained(bare_base(), tmp_path)) == [2, 3]
    below = ITuningAdapterConfig(first_layer=3, target_modules=r".*language_model\.transformer\.h\.[01]\.mlp$")
    with pytest.raises(ValueError, match=r"matches no LM feed-forward block at or above first_layer=3"):
        get_peft_model(bare_base(), below)


def test_peft_generation_computes_visual_kv_once():
    model = get_peft_model(bare_base(), ITuningAdapterConfig(init="random", first_layer=3)).eval()
    calls = []
    module = model.base_model.model.language_model.transformer.h[3].mlp.ituning_modules["default"]
    module.k_proj.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    pixel_values, _ = random_batch()
    out = model.generate(pixel_values=pixel_values, num_beams=5, max_new_tokens=4, min_new_tokens=4)
    assert out.shape == (2, 5) and calls == [2]  # once, from the 2 images rather than their 10 beam copies


def test_an_adapter_on_a_model_with_native_modules_is_refused():
    from peft import get_peft_model

    with pytest.raises(ValueError, match="already has native I-Tuning modules.*add_ituning_modules=False"):
        get_peft_model(build_model("itune-tiny-random"), ITuningAdapterConfig(first_layer=1))


def test_inference_mode_loads_are_frozen_and_no_future_warning(tmp_path):
    from peft import PeftModel, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model = get_peft_model(build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig())
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) > 0
    model.save_pretrained(tmp_path)
    base = build_model("itune-tiny-random", add_ituning_modules=False)
    assert sum(p.numel() for p in PeftModel.from_pretrained(base, tmp_path).parameters() if p.requires_grad) == 0
    base = build_model("itune-tiny-random", add_ituning_modules=False)
    trainable = PeftModel.from_pretrained(base, tmp_path, is_trainable=True)
    assert sum(p.numel() for p in trainable.parameters() if p.requires_grad) == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )


def test_random_presets_build_the_same_backbones_and_the_readme_restore_works(tmp_path):
    from peft import PeftModel, get_peft_model

    for preset in ("itune-tiny-random", "xgpt-tiny-random"):
        first, second = build_model(preset), build_model(preset)
        assert torch.equal(next(first.vision_model.parameters()), next(second.vision_model.parameters())), preset
    torch.manual_seed(3)
    model = get_peft_model(
        build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig(first_layer=0, init="random")
    ).eval()
    model.save_pretrained(tmp_path / "my-adapter")
    restored = PeftModel.from_pretrained(
        build_model("itune-tiny-random", add_ituning_modules=False), tmp_path / "my-adapter"
    )
    pixels = torch.randn(2, 3, 32, 32)
    ids = model.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5)
    assert torch.equal(restored.eval().generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    # the adapter names its base (the preset), so AutoPeftModel rebuilds it
    from peft import AutoPeftModel

    recorded = json.loads((tmp_path / "my-adapter" / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == "itune-tiny-random"
    assert "base_model:" not in (tmp_path / "my-adapter" / "README.md").read_text()  # random: no Hub id, not ''
    auto = AutoPeftModel.from_pretrained(tmp_path / "my-adapter", import_allowlist=["itune_hf"]).eval()
    assert torch.equal(auto.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)


def test_an_adapter_on_a_full_checkpoint_loaded_bare_reloads_every_way(tmp_path):
    """The route the package's own refusal recommends: `from_pretrained(full, add_ituning_modules=False)`, then an
    adapter. It reloads natively, with `PeftModel`, and with `AutoPeftModel`, which rebuilds the base bare."""
    from peft import AutoPeftModel, PeftModel, get_peft_model

    from itune_hf import ITuningForCaptioning

    torch.manual_seed(0)
    build_model("itune-tiny-random", init="random").save_pretrained(tmp_path / "full")
    bare = ITuningForCaptioning.from_pretrained(tmp_path / "full", add_ituning_modules=False)
    torch.manual_seed(1)
    adapted = get_peft_model(bare, ITuningAdapterConfig(first_layer=0, init="random")).eval()
    adapted.save_pretrained(tmp_path / "adapter")
    pixels = torch.randn(2, 3, 32, 32)
    ids = adapted.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5)
    native = ITuningForCaptioning.from_pretrained(tmp_path / "adapter")
    assert torch.equal(native.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    again = ITuningForCaptioning.from_pretrained(tmp_path / "full", add_ituning_modules=False)
    with_peft = PeftModel.from_pretrained(again, tmp_path / "adapter").eval()
    assert torch.equal(with_peft.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
    auto = AutoPeftModel.from_pretrained(tmp_path / "adapter", import_allowlist=["itune_hf"]).eval()
    assert torch.equal(auto.generate(pixel_values=pixels, num_beams=1, max_new_tokens=5), ids)
