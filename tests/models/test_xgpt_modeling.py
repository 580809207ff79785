"""The XGPT model: its three architectures (paper Table 3), the shared stack, the AoA refiner, regions from a grid,
from boxes or given, no leakage, caching, generation, the loss and a few training steps. Tiny configs, seconds each."""

from __future__ import annotations

import pytest
import torch

from itune_hf.models.registry import enable_activation_checkpointing
from itune_hf.models.xgpt.configuration_xgpt import XGPTConfig
from itune_hf.models.xgpt.modeling_xgpt import (
    OUTPUT_CACHE_FIELD,
    XGPTAttention,
    XGPTEncoderOutput,
    XGPTForCaptioning,
    grid_boxes,
    pool_in_boxes,
)

from conftest import IMAGE_SIZE, tiny_vision_config

VOCAB, BOS, EOS = 100, 0, 1
HIDDEN, LAYERS, REGIONS = 32, 2, 17  # 4 x 4 patches of the tiny CLIP tower + its CLS token
ARCHITECTURES = ("enc", "encdec", "encdec_share")


def xgpt_config(architecture: str = "encdec_share", **kwargs) -> XGPTConfig:
    defaults = dict(
        vision_config=tiny_vision_config().to_dict(),
        architecture=architecture,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=2 * HIDDEN,
        grid_size=None,
        max_position_embeddings=24,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )
    return XGPTConfig(**{**defaults, **kwargs})


def xgpt_model(architecture: str = "encdec_share", seed: int = 0, **kwargs) -> XGPTForCaptioning:
    torch.manual_seed(seed)
    return XGPTForCaptioning(xgpt_config(architecture, **kwargs)).eval()


def batch(size: int = 2, length: int = 6, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    captions = torch.randint(3, VOCAB, (size, length), generator=generator)
    return pixels, torch.cat([torch.full((size, 1), BOS), captions], dim=1)


def fields(config: XGPTConfig) -> dict:
    """A config's values, without what loading records (path, dtype, versions)."""
    metadata = {"_name_or_path", "dtype", "transformers_version", "architectures"}
    values = {k: v for k, v in config.to_dict().items() if k not in metadata}
    if values["vision_config"] is not None:
        values["vision_config"] = {k: v for k, v in values["vision_config"].items() if k not in metadata}
    return values


def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ------------------------------------------------------------------------------------------------------------------
# Shapes and the three architectures
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("aoa", [True, False])
def test_shapes(architecture, aoa):
    model = xgpt_model(architecture, use_aoa_refiner=aoa)
    pixels, ids = batch()
    encoded = model.get_encoder()(pixel_values=pixels)
    assert isinstance(encoded, XGPTEncoderOutput)
    assert encoded.last_hidden_state.shape == (2, REGIONS, HIDDEN)
    assert encoded.memory_mask.tolist() == [[1] * REGIONS] * 2
    assert (encoded.memory_per_layer is not None) == (architecture == "enc")
    if architecture == "enc":
        assert encoded.memory_per_layer.shape == (2, LAYERS, REGIONS, HIDDEN)
    out = model(pixel_values=pixels, decoder_input_ids=ids, output_hidden_states=True)
    assert out.logits.shape == (2, ids.shape[1], VOCAB)
    assert out.encoder_last_hidden_state.shape == (2, REGIONS, HIDDEN)
    assert len(out.decoder_hidden_states) == LAYERS + 1 and len(out.encoder_hidden_states) == LAYERS + 1
    assert (model.model.encoder.refiner is not None) == aoa


def test_the_shared_variant_decodes_with_the_encoder_layers():
    shared = xgpt_model("encdec_share").model
    assert shared.decoder_layers is shared.encoder_layers and shared.decoder.layers is None
    encoder_ids = {id(p) for p in shared.encoder_layers.parameters()}
    assert encoder_ids == {id(p) for p in shared.decoder_layers.parameters()}
    assert not any(name.startswith("decoder.layers") for name in shared.state_dict())
    separate = xgpt_model("encdec").model
    assert not {id(p) for p in separate.encoder_layers.parameters()} & {
        id(p) for p in separate.decoder_layers.parameters()
    }


def test_the_shared_variant_counts_one_stack_plus_embeddings_and_heads():
    shared, separate = xgpt_model("encdec_share", encoder_signal="none"), xgpt_model("encdec")
    decoder_stack = sum(p.numel() for p in separate.model.decoder_layers.parameters())
    encoder_stack = sum(p.numel() for p in separate.model.encoder_layers.parameters())
    assert decoder_stack > encoder_stack  # the separate decoder has its own encoder-decoder attention too
    assert trainable(shared) == trainable(separate) - decoder_stack
    counts = shared.parameter_counts()
    assert counts["layers (encoder and decoder)"] == encoder_stack
    assert sum(counts.values()) - counts["vision tower (frozen)"] == trainable(shared)
    assert set(separate.parameter_counts()) >= {"encoder layers", "decoder layers"}
    with_signal = xgpt_model("encdec_share")  # the default "key_value" signal: 2 vectors per layer
    assert trainable(with_signal) == trainable(shared) + 2 * HIDDEN * LAYERS
    assert with_signal.parameter_counts()["encoder signal"] == 2 * HIDDEN * LAYERS
    assert trainable(xgpt_model("encdec_share", encoder_signal="embedding")) == trainable(shared) + HIDDEN
    assert trainable(xgpt_model("enc")) == trainable(shared)  # UniLM's mask: no signal by default


def test_the_key_value_signal_marks_only_memory_keys_and_values():
    attention = xgpt_model("encdec_share").model.encoder_layers[0].attention
    assert isinstance(attention, XGPTAttention)
    states = torch.randn(1, 3, HIDDEN)
    text_keys, text_values = attention.keys_values(states)
    memory_keys, memory_values = attention.keys_values(states, memory=True)
    signal_keys = attention.memory_key_signal.view(4, 1, HIDDEN // 4)
    assert torch.allclose(memory_keys - text_keys, signal_keys.expand_as(text_keys), atol=1e-6)
    signal_values = attention.memory_value_signal.view(4, 1, HIDDEN // 4)
    assert torch.allclose(memory_values - text_values, signal_values.expand_as(text_values), atol=1e-6)
    assert attention.memory_key_signal.abs().sum() > 0  # initialised like a type embedding, not left at zero


def test_enc_equals_one_pass_over_regions_and_text_with_unilm_mask():
    model = xgpt_model("enc")
    pixels, ids = batch()
    expected = model.model(pixel_values=pixels, decoder_input_ids=ids, use_cache=False).last_hidden_state
    encoder = model.model.encoder
    features, boxes, mask = encoder.regions(pixels, None, None, None, None)
    regions = encoder.refiner(encoder.region_embedding(features, boxes), mask.bool()[:, None, None, :])
    text = model.model.decoder(ids, None, torch.arange(ids.shape[1])[None].expand(2, -1))
    states = torch.cat([regions, text], dim=1)
    n, t = regions.shape[1], ids.shape[1]
    allowed = torch.zeros(n + t, n + t, dtype=torch.bool)
    allowed[:, :n] = True  # regions see regions (bidirectional), text sees every region
    allowed[n:, n:] = torch.ones(t, t, dtype=torch.bool).tril()  # and its own causal prefix
    for layer in encoder.layers:
        states = layer(states, allowed[None, None])
    torch.testing.assert_close(states[:, n:], expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------------------------
# No leakage
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_later_caption_token_does_not_change_earlier_logits(architecture):
    model = xgpt_model(architecture)
    pixels, ids = batch()
    changed = ids.clone()
    changed[:, 4] = (changed[:, 4] + 7) % VOCAB
    with torch.no_grad():
        before = model(pixel_values=pixels, decoder_input_ids=ids).logits
        after = model(pixel_values=pixels, decoder_input_ids=changed).logits
    torch.testing.assert_close(before[:, :4], after[:, :4])
    assert not torch.allclose(before[:, 4:], after[:, 4:])


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_encoder_output_does_not_depend_on_the_caption(architecture):
    model = xgpt_model(architecture)
    pixels, ids = batch()
    with torch.no_grad():
        first = model(pixel_values=pixels, decoder_input_ids=ids, output_hidden_states=True)
        second = model(pixel_values=pixels, decoder_input_ids=ids.flip(1), output_hidden_states=True)
    assert torch.equal(first.encoder_last_hidden_state, second.encoder_last_hidden_state)
    assert all(torch.equal(a, b) for a, b in zip(first.encoder_hidden_states, second.encoder_hidden_states))


def test_padding_regions_are_ignored():
    model = xgpt_model(visual_source="boxes")
    pixels, ids = batch()
    boxes = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]).expand(2, 3, 4).clone()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    with torch.no_grad():
        before = model(pixel_values=pixels, region_boxes=boxes, region_mask=mask, decoder_input_ids=ids).logits
        boxes[0, 2] = torch.tensor([0.25, 0.25, 0.75, 0.5])
        after = model(pixel_values=pixels, region_boxes=boxes, region_mask=mask, decoder_input_ids=ids).logits
    torch.testing.assert_close(before, after)


# ------------------------------------------------------------------------------------------------------------------
# Regions: grid, boxes, given
# ------------------------------------------------------------------------------------------------------------------
def test_pooling_in_boxes_is_the_area_weighted_mean():
    patches = torch.arange(16.0).reshape(1, 4, 4, 1)  # value = 4 * row + col
    boxes = torch.tensor(
        [[[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.25, 0.25], [0.0, 0.0, 0.375, 0.25], [0.6, 0.6, 0.6, 0.6]]]
    )
    pooled = pool_in_boxes(patches, boxes)[0, :, 0]
    # whole image; the first patch; one patch and a half (weights 2:1); a point inside patch (2, 2)
    torch.testing.assert_close(pooled, torch.tensor([7.5, 0.0, 1.0 / 3.0, 10.0]))
    grid = pool_in_boxes(patches, grid_boxes(2, 2)[None])[0, :, 0]
    torch.testing.assert_close(grid, torch.tensor([2.5, 4.5, 10.5, 12.5]))


def test_grid_regions_with_cls_and_without():
    pixels, ids = batch()
    pooled = xgpt_model(grid_size=2).get_encoder()(pixel_values=pixels)
    assert pooled.last_hidden_state.shape == (2, 1 + 4, HIDDEN)
    no_cls = xgpt_model(use_cls_region=False).get_encoder()(pixel_values=pixels)
    assert no_cls.last_hidden_state.shape == (2, 16, HIDDEN)
    model = xgpt_model()
    features, boxes, mask = model.model.encoder.regions(pixels, None, None, None, None)
    assert features.shape == (2, REGIONS, tiny_vision_config().hidden_size)
    assert boxes[0, 0].tolist() == [0.0, 0.0, 1.0, 1.0]  # the CLS token: the whole image
    assert boxes[0, 1].tolist() == [0.0, 0.0, 0.25, 0.25] and boxes[0, -1].tolist() == [0.75, 0.75, 1.0, 1.0]


def test_cached_vision_states_give_the_same_captions_as_pixels():
    model = xgpt_model()
    pixels, _ = batch()
    states = model.vision_model(pixel_values=pixels).last_hidden_state
    expected = model.generate(pixel_values=pixels, max_length=8)
    assert torch.equal(model.generate(vision_hidden_states=states, max_length=8), expected)
    from transformers import GenerationConfig

    flags = {"output_attentions": True, "return_dict_in_generate": True, "max_new_tokens": 2}
    keywords = model.generate(vision_hidden_states=states, **flags)
    configured = model.generate(vision_hidden_states=states, generation_config=GenerationConfig(**flags))
    assert keywords.encoder_attentions is not None  # the encoder's attentions, asked for either way
    assert len(configured.encoder_attentions) == len(keywords.encoder_attentions)


def test_precomputed_region_features():
    model = xgpt_model(visual_source="regions", vision_config=None, region_feature_size=12)
    assert model.vision_model is None and model.config.region_feature_size == 12
    features, boxes = torch.randn(2, 5, 12), torch.rand(2, 5, 4).sort(dim=-1).values[..., [0, 1, 2, 3]]
    boxes = torch.cat([boxes[..., :2], boxes[..., :2] + 0.1], dim=-1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    _, ids = batch()
    out = model(region_features=features, region_boxes=boxes, region_mask=mask, labels=ids)
    assert out.logits.shape == (2, ids.shape[1], VOCAB) and torch.isfinite(out.loss)
    generated = model.generate(region_features=features, region_boxes=boxes, region_mask=mask, max_length=6)
    assert generated.shape[0] == 2
    with pytest.raises(ValueError, match="expected \\(batch, regions, 12\\)"):
        model(region_features=torch.randn(2, 5, 7), region_boxes=boxes, decoder_input_ids=ids)
    with pytest.raises(ValueError, match="has no vision tower"):
        model(pixel_values=batch()[0], decoder_input_ids=ids)
    assert XGPTConfig(visual_source="regions").region_feature_size == 2048  # bottom-up-attention features


def test_the_region_feature_norm_makes_the_memory_blind_to_each_regions_offset_and_scale(tmp_path):
    """`region_feature_norm` layer-normalises each region's feature before the projection (for post-ReLU towers, whose
    cells share a large positive component): shifting and scaling a region's feature then changes nothing, without it
    everything; the setting survives saving."""
    features, boxes = torch.rand(2, 5, 12) * 5, torch.tensor([0.1, 0.1, 0.6, 0.6]).expand(2, 5, 4)
    moved = 3.0 * features + torch.rand(2, 5, 1) * 10  # per region: another scale and offset
    regions = dict(visual_source="regions", vision_config=None, region_feature_size=12)
    for norm in (True, False):
        model = xgpt_model(**regions, region_feature_norm=norm)
        embed = model.model.encoder.region_embedding.project
        same = torch.allclose(embed(features, boxes), embed(moved, boxes), atol=1e-4)
        assert same == norm
    model = xgpt_model(**regions, region_feature_norm=True)
    model.save_pretrained(tmp_path)
    loaded = XGPTForCaptioning.from_pretrained(tmp_path)
    assert loaded.config.region_feature_norm and loaded.model.encoder.region_embedding.feature_norm is not None
    assert xgpt_config().region_feature_norm is False  # off by default: the paper projects the features as they are


def test_the_visual_source_refuses_the_wrong_inputs():
    pixels, ids = batch()
    with pytest.raises(ValueError, match="pass region_boxes"):
        xgpt_model(visual_source="boxes")(pixel_values=pixels, decoder_input_ids=ids)
    with pytest.raises(ValueError, match="expected \\(2, regions, 4\\)"):
        xgpt_model(visual_source="boxes")(pixel_values=pixels, region_boxes=torch.rand(3, 4), decoder_input_ids=ids)
    with pytest.raises(ValueError, match="takes no region_boxes"):
        xgpt_model()(pixel_values=pixels, region_boxes=torch.rand(2, 3, 4), decoder_input_ids=ids)
    with pytest.raises(ValueError, match="not region_features"):
        xgpt_model()(region_features=torch.rand(2, 3, 32), region_boxes=torch.rand(2, 3, 4), decoder_input_ids=ids)
    with pytest.raises(ValueError, match="expected \\(batch, tokens, 32\\)"):
        xgpt_model()(vision_hidden_states=torch.rand(2, 17, 48), decoder_input_ids=ids)
    with pytest.raises(ValueError, match="at least one region"):
        xgpt_model(visual_source="boxes")(
            pixel_values=pixels, region_boxes=torch.rand(2, 1, 4), region_mask=torch.tensor([[1], [0]]),
            decoder_input_ids=ids,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"architecture": "unet"}, "architecture must be one of"),
        ({"architecture": "encdec", "encoder_signal": "key_value"}, "separate encoder-decoder attention"),
        ({"encoder_signal": "loud"}, "encoder_signal must be one of"),
        ({"visual_source": "pixels"}, "visual_source must be one of"),
        ({"hidden_size": 30}, "not divisible by num_attention_heads"),
        ({"region_feature_size": 64}, "differs from the width 32"),
        ({"grid_size": 0}, "grid_size must be"),
        ({"visual_source": "regions"}, "drop vision_config"),
    ],
)
def test_config_checks_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        xgpt_config(**kwargs)


# ------------------------------------------------------------------------------------------------------------------
# Loss, cache and generation
# ------------------------------------------------------------------------------------------------------------------
def test_labels_give_the_mean_caption_loss():
    model = xgpt_model()
    pixels, ids = batch()
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), EOS)], dim=1)
    labels[1, -2:] = -100
    out = model(pixel_values=pixels, labels=labels)
    logits = model(pixel_values=pixels, decoder_input_ids=ids).logits
    keep = labels != -100
    expected = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_cached_decoding_equals_the_full_pass(architecture):
    model = xgpt_model(architecture)
    pixels, ids = batch()
    with torch.no_grad():
        full = model(pixel_values=pixels, decoder_input_ids=ids).logits
        encoded = model.get_encoder()(pixel_values=pixels)
        step = model(encoder_outputs=encoded, decoder_input_ids=ids[:, :3], use_cache=True)
        steps = [step.logits]
        for position in range(3, ids.shape[1]):
            step = model(
                encoder_outputs=encoded, decoder_input_ids=ids[:, position : position + 1],
                cache=step[OUTPUT_CACHE_FIELD], use_cache=True,
            )  # fmt: skip
            steps.append(step.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_beam_1_is_greedy_search(architecture):
    model = xgpt_model(architecture)
    pixels, _ = batch()
    generated = model.generate(pixel_values=pixels, num_beams=1, max_length=7)
    ids = torch.full((2, 1), BOS)
    with torch.no_grad():
        for _ in range(6):
            next_ids = model(pixel_values=pixels, decoder_input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_ids], dim=1)
    finished = (ids[:, 1:] == EOS).cumsum(1) > (ids[:, 1:] == EOS).int()  # after EOS, generate pads
    ids[:, 1:][finished] = EOS
    assert torch.equal(generated, ids[:, : generated.shape[1]])


def test_the_encoder_runs_once_per_generate_call_and_beams_share_its_output():
    model = xgpt_model()
    pixels, _ = batch()
    calls, memories = [], []
    model.get_encoder().register_forward_hook(lambda module, args, output: calls.append(output))
    model.model.encoder_layers[0].register_forward_pre_hook(
        lambda module, args: memories.append(args[2]) if len(args) > 2 else None
    )
    generated = model.generate(pixel_values=pixels, num_beams=3, num_return_sequences=3, max_length=6)
    assert len(calls) == 1 and generated.shape[0] == 6
    assert memories and all(m.shape[0] == 6 for m in memories)  # each image's memory, repeated for its 3 beams
    torch.testing.assert_close(memories[0][:3], calls[0].last_hidden_state[0].expand(3, -1, -1))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_generate_from_encoder_outputs(architecture):
    model = xgpt_model(architecture)
    pixels, _ = batch()
    expected = model.generate(pixel_values=pixels, num_beams=2, max_length=8)
    encoded = model.get_encoder()(pixel_values=pixels)
    for _ in range(2):  # the caller's object is not expanded in place: it can be reused
        assert torch.equal(model.generate(encoder_outputs=encoded, num_beams=2, max_length=8), expected)
    assert encoded.last_hidden_state.shape[0] == 2
    if architecture == "enc":
        with pytest.raises(ValueError, match="memory_per_layer"):
            model.generate(encoder_outputs=encoded.last_hidden_state, max_length=8)
    else:
        assert torch.equal(model.generate(encoder_outputs=encoded.last_hidden_state, max_length=8), expected)


def test_generation_is_batched_and_defaults_to_the_papers_beam_2_within_60_tokens():
    model = xgpt_model(max_position_embeddings=60)
    assert model.generation_config.num_beams == 2 and model.generation_config.max_length == 60
    pixels, _ = batch(size=3)
    default = model.generate(pixel_values=pixels)
    assert default.shape[1] <= 60
    assert torch.equal(default, model.generate(pixel_values=pixels, num_beams=2, max_length=60))
    for kwargs in ({"num_beams": 1}, {"num_beams": 3}):
        together = model.generate(pixel_values=pixels, max_length=9, **kwargs)
        alone = [model.generate(pixel_values=pixels[i : i + 1], max_length=9, **kwargs)[0] for i in range(3)]
        for row, single in zip(together, alone):
            assert torch.equal(row[: single.shape[0]], single)
    torch.manual_seed(3)
    sampled = model.generate(pixel_values=pixels, do_sample=True, num_beams=1, max_length=9, num_return_sequences=2)
    torch.manual_seed(3)
    again = model.generate(pixel_values=pixels, do_sample=True, num_beams=1, max_length=9, num_return_sequences=2)
    assert sampled.shape[0] == 6 and torch.equal(sampled, again)


def test_a_caption_beyond_the_position_limit_is_refused():
    model = xgpt_model()
    pixels, _ = batch()
    with pytest.raises(ValueError, match="max_position_embeddings=24"):
        model(pixel_values=pixels, decoder_input_ids=torch.ones(2, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="would reach 25 caption tokens.*the model has 24 positions"):
        model.generate(pixel_values=pixels, max_new_tokens=24)


def test_max_new_tokens_replaces_the_default_max_length_quietly(capfd):
    model = xgpt_model()
    pixels, _ = batch()
    assert model.generate(pixel_values=pixels, max_new_tokens=4, num_beams=1).shape == (2, 5)
    assert model.generate(pixel_values=pixels, max_length=4, num_beams=1).shape == (2, 4)
    assert "seem to have been set" not in capfd.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("aoa", [True, False])
def test_training_steps_lower_the_loss_and_leave_the_vision_tower_alone(architecture, aoa):
    model = xgpt_model(architecture, use_aoa_refiner=aoa).train()
    assert not model.vision_model.training  # a frozen feature extractor stays in eval mode
    tower = {name: p.clone() for name, p in model.vision_model.named_parameters()}
    learns = {name for name, p in model.named_parameters() if p.requires_grad}
    assert learns == {name for name, _ in model.named_parameters() if not name.startswith("model.encoder.vision_model")}
    pixels, ids = batch()
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), EOS)], dim=1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(6):
        loss = model(pixel_values=pixels, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(torch.equal(p, tower[name]) for name, p in model.vision_model.named_parameters())


def test_gradient_checkpointing_gives_the_same_gradients():
    pixels, ids = batch()
    grads = []
    for checkpointing in (False, True):
        model = xgpt_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
        if checkpointing:
            enable_activation_checkpointing(model)
        model(pixel_values=pixels, labels=ids).loss.backward()
        grads.append(model.model.encoder_layers[0].fc1.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_save_and_load_round_trip(tmp_path):
    model = xgpt_model("encdec_share", encoder_signal="embedding")
    pixels, ids = batch()
    model.save_pretrained(tmp_path)
    loaded = XGPTForCaptioning.from_pretrained(tmp_path).eval()
    assert fields(loaded.config) == fields(model.config)
    assert loaded.config.settings == model.config.settings and loaded.config.resolved_encoder_signal == "embedding"
    assert loaded.lm_head.weight is loaded.model.decoder.embed_tokens.weight
    assert not any(p.requires_grad for p in loaded.vision_model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(pixel_values=pixels, decoder_input_ids=ids).logits,
            model(pixel_values=pixels, decoder_input_ids=ids).logits,
        )
    assert loaded.generation_config.num_beams == 2


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_traced_decode_step_has_no_graph_break_and_gives_the_default_captions(architecture):
    """generate()'s static cache with a compiled decode step (its GPU fast path; here traced without inductor, on the
    CPU): the step reads the cache's token count as a tensor and attends over its whole buffer, so it traces in one
    graph, and gives the default path's greedy captions (fp32)."""
    from transformers import CompileConfig

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of earlier compiles
    model = xgpt_model(architecture)
    pixel_values, _ = batch(2)
    kwargs = dict(num_beams=1, max_new_tokens=6, min_new_tokens=6)
    traced = CompileConfig(backend="eager", fullgraph=True, mode=None)  # fullgraph: a graph break is an error
    traced._compile_all_devices = True  # transformers compiles the decode step on GPUs only unless told
    expected = model.generate(pixel_values=pixel_values, **kwargs)
    assert torch.equal(model.generate(pixel_values=pixel_values, cache_implementation="static", **kwargs), expected)
    got = model.generate(pixel_values=pixel_values, cache_implementation="static", compile_config=traced, **kwargs)
    assert torch.equal(got, expected)
    # one graph for all 6 steps (no caption mask given: generate() would widen a 2-D one each step, a new shape;
    # itune_hf.inference.decoding drops a mask of ones, tests/test_decoding.py)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_a_decoder_attention_mask_of_the_wrong_width_is_refused_naming_it():
    model = xgpt_model()
    pixel_values, captions = batch(2)
    with pytest.raises(ValueError, match=r"decoder_attention_mask has shape \(2, 3\).*caption tokens 7"):
        model(pixel_values=pixel_values, decoder_input_ids=captions, decoder_attention_mask=torch.ones(2, 3))


def test_beam_search_over_a_static_cache_gives_the_default_paths_captions():
    """Beam search reorders a static cache in place and attends over its whole buffer (not compiled: generate
    compiles greedy and sampling steps only)."""
    model = xgpt_model()
    pixel_values, _ = batch(3)
    kwargs = dict(num_beams=3, num_return_sequences=2, max_new_tokens=5, min_new_tokens=5)
    expected = model.generate(pixel_values=pixel_values, **kwargs)
    got = model.generate(pixel_values=pixel_values, cache_implementation="static", **kwargs)
    assert torch.equal(got, expected)


def test_a_left_padded_prompt_over_a_static_cache_gives_the_default_paths_scores():
    """The 2-D mask generate() passes is padded to the static buffer's width: its padding stays padding."""
    model = xgpt_model()
    pixel_values, _ = batch(2)
    prompts = torch.tensor([[EOS, BOS, 5], [BOS, 7, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])

    def scores(**kwargs):
        decoding = dict(num_beams=1, max_new_tokens=4, min_new_tokens=4, output_scores=True)
        out = model.generate(
            pixel_values=pixel_values, decoder_input_ids=prompts, return_dict_in_generate=True, **decoding, **kwargs
        )
        return torch.stack(out.scores)

    expected = scores(decoder_attention_mask=mask)
    torch.testing.assert_close(scores(decoder_attention_mask=mask, cache_implementation="static"), expected)
    # without its mask the padded row reads the padding token as a caption token: the mask is what is tested
    unmasked = scores(decoder_attention_mask=torch.ones_like(mask))
    assert not torch.allclose(unmasked[:, 0], expected[:, 0]) and torch.allclose(unmasked[:, 1], expected[:, 1])
