"""The baseline families, ClipCap (MLP and transformer mapper) and cross-attention fine-tuning: what
trains (counted by the formulas of their papers), that the backbones stay frozen, that they learn, save and load,
and that `itune train` / `itune eval` / the pipeline run them like the other families."""

from __future__ import annotations

import json

import pytest
import torch

from itune_hf import cli
from itune_hf.data import make_synthetic
from itune_hf.hub import save_captioner
from itune_hf.models import family_of, get_family
from itune_hf.models.loading import load_captioner
from itune_hf.presets import build_model, build_processor, get_preset

from conftest import run_where_itune_hf_is_not_installed, write_photo

BASELINES = ("clipcap-mlp-tiny-random", "clipcap-transformer-tiny-random", "crossattn-tiny-random")
CAPTIONS = ["a red cube on the left", "two blue balls", "a green ring above a cube", "a small yellow star"]


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def mlp_mapper(image: int, width: int, prefix: int) -> int:
    hidden = prefix * width // 2  # ClipCap's code: Linear(image, hidden) -> tanh -> Linear(hidden, prefix * width)
    return image * hidden + hidden + hidden * prefix * width + prefix * width


def transformer_mapper(image: int, width: int, prefix: int, clip_length: int, layers: int) -> int:
    # per layer: 2 LayerNorms, bias-free Q and KV, output projection with bias, MLP of ratio 2
    per_layer = 4 * width + 3 * width * width + width * width + width + 4 * width * width + 3 * width
    return image * clip_length * width + clip_length * width + prefix * width + layers * per_layer


def cross_attention(width: int, layers: int) -> int:
    return layers * (4 * width * width + 6 * width)  # GPT-2: q, kv, output projections + ln_cross_attn


def meta_trainable(preset: str) -> int:
    config = get_preset(preset).config()
    with torch.device("meta"):
        return trainable(get_preset(preset).family.load("model_class")(config))


def test_trainable_parameters_follow_the_formulas():
    assert trainable(build_model(BASELINES[0])) == mlp_mapper(32, 32, 10)
    assert trainable(build_model(BASELINES[1])) == transformer_mapper(32, 32, 10, 10, 2)
    assert trainable(build_model(BASELINES[2])) == cross_attention(32, 3)
    # Paper size (CLIP ViT-B/16 + GPT-2 base): ClipCap reports 43M for its transformer mapper.
    assert meta_trainable("clipcap-transformer-gpt2") == transformer_mapper(768, 768, 10, 10, 8) == 43_711_488
    assert meta_trainable("clipcap-mlp-gpt2") == mlp_mapper(768, 768, 10)
    assert meta_trainable("crossattn-gpt2") == cross_attention(768, 12)
    # Widths differ on the demo backbones: the vision-to-LM projection trains too.
    assert meta_trainable("crossattn-demo") == cross_attention(768, 12) + 128 * 768 + 768


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline-images")
    colors = [(200, 30, 30), (30, 30, 200), (30, 200, 30), (220, 220, 40)]
    return [str(write_photo(root / f"{i}.png", color=c)) for i, c in enumerate(colors)]


@pytest.mark.parametrize("preset", BASELINES)
def test_only_the_baseline_parts_learn_and_the_loss_falls(preset, images):
    torch.manual_seed(0)
    model, processor = build_model(preset), build_processor(preset)
    batch = processor(images=images, captions=CAPTIONS)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    learning = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert not any(n.startswith(("vision_model.", "encoder.")) for n in learning)  # the vision tower is frozen
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.eval()  # no dropout: the loss before and after is comparable
    losses = []
    for _ in range(8):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # A tiny random frozen LM keeps its logits near uniform whatever its input: the loss can only fall a little.
    assert losses[-1] < losses[0] - 0.02
    for name, parameter in model.named_parameters():
        if name in frozen:
            assert parameter.grad is None and torch.equal(parameter, frozen[name]), name
    assert all(not torch.equal(dict(model.named_parameters())[n], v) for n, v in learning.items())


@pytest.mark.parametrize("preset", BASELINES[:2])
def test_clipcap_decodes_the_same_with_and_without_the_cache_and_from_cached_states(preset, images):
    model, processor = build_model(preset).eval(), build_processor(preset)
    inputs = processor(images=images[:2])
    cached = model.generate(**inputs, num_beams=1, max_new_tokens=6, use_cache=True)
    uncached = model.generate(**inputs, num_beams=1, max_new_tokens=6, use_cache=False)
    assert torch.equal(cached, uncached)
    states = model.vision_model(pixel_values=inputs["pixel_values"]).last_hidden_state
    with_states = {k: v for k, v in inputs.items() if k != "pixel_values"}
    assert torch.equal(model.generate(**with_states, encoder_outputs=states, num_beams=1, max_new_tokens=6), cached)
    pooled = model.vision_model(pixel_values=inputs["pixel_values"]).pooler_output
    assert torch.allclose(model.image_embedding(states), pooled)  # CLIP's pooled CLS embedding, from any source


@pytest.mark.parametrize("preset", BASELINES)
def test_a_saved_baseline_loads_through_the_auto_classes_and_the_pipeline(preset, images, tmp_path):
    from transformers import pipeline

    torch.manual_seed(1)
    model, processor = build_model(preset).eval(), build_processor(preset)
    with torch.no_grad():  # move the trained part away from its init, so that a load that skipped it would show
        for parameter in (p for p in model.parameters() if p.requires_grad):
            parameter.add_(0.05 * torch.randn_like(parameter))
    expected = processor.batch_decode(model.generate(**processor(images=images[:2]), num_beams=2, max_new_tokens=6))
    save_captioner(model, tmp_path / "saved", processor=processor)
    # the remote code a baseline carries: its own files and the processor's, never I-Tuning's model file
    assert "modeling_ituning.py" not in {path.name for path in (tmp_path / "saved").iterdir()}
    loaded, loaded_processor = load_captioner(tmp_path / "saved")
    assert family_of(loaded).name == get_preset(preset).family_name and type(loaded) is type(model)
    assert trainable(loaded) == trainable(model)  # the backbones are frozen again after loading
    ids = loaded.generate(**loaded_processor(images=images[:2]), num_beams=2, max_new_tokens=6)
    assert loaded_processor.batch_decode(ids) == expected
    captioner = pipeline("image-to-text", model=str(tmp_path / "saved"))
    assert captioner(images[0], num_beams=2, max_new_tokens=6)[0]["generated_text"] == expected[0]


@pytest.mark.slow
def test_a_saved_crossattn_model_loads_as_remote_code_without_itune_hf(tmp_path):
    torch.manual_seed(2)
    model, processor = build_model("crossattn-tiny-random").eval(), build_processor("crossattn-tiny-random")
    pixels = torch.rand(1, 3, 32, 32)
    expected = model.generate(pixel_values=pixels, num_beams=2, max_new_tokens=4).tolist()
    save_captioner(model, tmp_path / "saved", processor=processor)
    torch.save(pixels, tmp_path / "pixels.pt")
    call = f"model.generate(pixel_values=__import__('torch').load({str(tmp_path / 'pixels.pt')!r}), num_beams=2, "
    module, ids = run_where_itune_hf_is_not_installed(tmp_path / "saved", call + "max_new_tokens=4)", tmp_path)
    assert module.endswith("modeling_crossattn") and ids == expected


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("baseline-world") / "data", num_images=24, seed=5, image_size=32)


@pytest.mark.slow
def test_itune_train_and_eval_run_a_baseline_preset(world, tmp_path, capsys):
    preset, out = "clipcap-mlp-tiny-random", tmp_path / "run"
    train = ["train", "--preset", preset, "--data", world, "--output-dir", out, "--max-steps", 4]
    train += ["--batch-size", 4, "--report-to", "none", "--eval-max-images", 2, "--eval-every", 4]
    train += ["--eval-max-new-tokens", 4, "--learning-rate", "1e-3"]
    assert cli.main(list(map(str, train))) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["trainable_parameters"] == trainable(build_model(preset))
    card = (out / "README.md").read_text()
    assert get_family(get_preset(preset).family_name).title in card and f"{summary['trainable_parameters']:,}" in card
    evaluate = ["eval", "--model", out, "--data", world, "--split", "test", "--num-beams", 2, "--max-new-tokens", 4]
    assert cli.main(list(map(str, [*evaluate, "--max-images", 2, "--output-dir", tmp_path / "eval"]))) == 0
    results = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert "CIDEr" in json.dumps(results)


def test_a_baseline_run_refuses_options_of_other_families(world, tmp_path, capsys):
    train = ["train", "--preset", "clipcap-mlp-tiny-random", "--data", world, "--output-dir", tmp_path / "x"]
    assert cli.main([*map(str, train), "--num-heads", "2", "--report-to", "none"]) == 2
    assert "--num-heads" in capsys.readouterr().err


def test_the_crossattn_config_needs_an_lm_with_cross_attention():
    from transformers import AutoConfig

    from itune_hf.models.crossattn import CrossAttnConfig

    vision = get_preset("crossattn-tiny-random").vision.to_config()
    llama = AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    with pytest.raises(ValueError, match="'llama' has no cross-attention"):
        CrossAttnConfig.from_vision_text_configs(vision, llama)


def test_clipcap_refuses_decoder_position_ids_it_would_not_use(images):
    model, processor = build_model(BASELINES[0]).eval(), build_processor(BASELINES[0])
    inputs = processor(images=images, captions=CAPTIONS)
    positions = torch.arange(inputs["decoder_input_ids"].shape[1]).expand_as(inputs["decoder_input_ids"])
    with pytest.raises(ValueError, match="decoder_position_ids: ClipCap numbers the caption's positions"):
        model(**inputs, decoder_position_ids=positions)


def test_clipcap_trains_with_gradient_checkpointing_through_its_frozen_lm(images):
    from itune_hf.training import TrainingConfig
    from itune_hf.training.model import build_training_model

    gradients = []
    for checkpointing in (False, True):  # the mapper's gradients pass back through the frozen LM's activations
        torch.manual_seed(0)
        config = TrainingConfig(output_dir="x", preset=BASELINES[0], gradient_checkpointing=checkpointing)
        model = build_training_model(config).model.train()
        lm = model.language_model
        assert any(getattr(module, "gradient_checkpointing", False) for module in lm.modules()) is checkpointing
        model(**build_processor(BASELINES[0])(images=images, captions=CAPTIONS)).loss.backward()
        gradients.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert gradients[0].keys() == gradients[1].keys()
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)


@pytest.mark.parametrize("reentrant", [False, True])
def test_clipcap_takes_trainers_gradient_checkpointing_call_with_the_same_gradients(images, reentrant):
    gradients = []
    for checkpointing in (False, True):  # Trainer(gradient_checkpointing=True) calls this on the model itself
        torch.manual_seed(0)
        model = build_model(BASELINES[0])
        model.freeze_backbones()
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model(**build_processor(BASELINES[0])(images=images, captions=CAPTIONS)).loss.backward()
        gradients.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert gradients[0].keys() == gradients[1].keys() and gradients[0]
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)


@pytest.mark.parametrize("name", BASELINES)
def test_the_loss_is_fp32_in_a_bf16_model_in_every_baseline(images, name):
    torch.manual_seed(0)
    model = build_model(name).to(torch.bfloat16)
    model.freeze_backbones()
    inputs = build_processor(name)(images=images, captions=CAPTIONS)
    inputs["pixel_values"] = inputs["pixel_values"].to(torch.bfloat16)
    output = model(**inputs)
    assert output.logits.dtype == torch.bfloat16
    assert output.loss.dtype == torch.float32
    logits = output.logits.float()
    expected = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), inputs["labels"].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(output.loss, expected)


@pytest.mark.parametrize("reentrant", [False, True])
def test_cross_attention_checkpointing_gives_the_same_gradients_without_enable_input_require_grads(images, reentrant):
    gradients = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model("crossattn-tiny-random")
        model.freeze_backbones()
        model.train()
        for module in model.modules():  # dropout off: compare gradients exactly
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model(**build_processor("crossattn-tiny-random")(images=images, captions=CAPTIONS)).loss.backward()
        gradients.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert all(gradient is not None for gradient in gradients[1].values()) and gradients[0]
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)
