"""The I-Tuning module and the captioning model: equations, loss, frozen backbones, generation, save/load."""

from __future__ import annotations

import functools
from collections import Counter
from unittest import mock

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_outputs import BaseModelOutput

from itune_hf import ITuningConfig, ITuningForCaptioning, ITuningModule, build_model
from itune_hf.models.ituning.modeling_ituning import VisionContext, find_ffn_sites, shift_tokens_right
from itune_hf.models.registry import enable_activation_checkpointing

from conftest import BOS, EOS, random_batch, tiny_config, tiny_model


def decoder_inputs(captions: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.full_like(captions[:, :1], BOS), captions[:, :-1]], dim=1)


# ----------------------------------------------------------------------------------------------- the module
@pytest.mark.parametrize("num_heads", [1, 2])
def test_module_computes_the_paper_equations(num_heads):
    torch.manual_seed(0)
    module = ITuningModule(
        hidden_size=8,
        vision_hidden_size=6,
        bottleneck_dim=4,
        num_heads=num_heads,
        scale=2.5,
        attention_scale=1.0,
        init="random",
    )
    x, v = torch.randn(2, 3, 8), torch.randn(2, 5, 6)
    q = x @ module.q_proj.weight.T + module.q_proj.bias  # eq. (1)
    k = v @ module.k_proj.weight.T + module.k_proj.bias  # eq. (2)
    vv = v @ module.v_proj.weight.T + module.v_proj.bias  # eq. (3)
    heads = []
    for h in range(num_heads):
        cols = slice(h * 4 // num_heads, (h + 1) * 4 // num_heads)
        s = torch.softmax(q[..., cols] @ k[..., cols].transpose(1, 2), dim=-1)  # eq. (4), no 1/sqrt(d)
        heads.append(s @ vv[..., cols])
    expected = 2.5 * (torch.cat(heads, -1) @ module.o_proj.weight.T + module.o_proj.bias)  # eq. (5)
    torch.testing.assert_close(module(x, v), expected)


@pytest.mark.parametrize(("num_heads", "multiple"), [(1, 1), (4, 1), (1, 8), (4, 8)])
def test_regrouped_attention_equals_projecting_every_visual_token(num_heads, multiple):
    """Training takes `(Q W_k) V^T` and `(S V) W_v^T` where that is cheaper; value and gradients are eq. (1-5)'s, also
    with the visual tokens padded to a multiple of 8 (30 -> 32, the padding masked)."""
    torch.manual_seed(0)
    module = ITuningModule(hidden_size=16, vision_hidden_size=24, bottleneck_dim=8, num_heads=num_heads, init="random")
    x, v = torch.randn(3, 4, 16, requires_grad=True), torch.randn(3, 30, 24)

    def output_and_grads(regroup: bool):
        module.zero_grad()
        x.grad = None
        with (
            mock.patch.object(ITuningModule, "_regroup_pays", return_value=regroup),
            mock.patch.object(ITuningModule, "regrouped_token_multiple", multiple),
        ):
            out = module(x, v)
        out.square().sum().backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters()}
        return out, x.grad.clone(), grads

    out_r, grad_x_r, grads_r = output_and_grads(True)
    out_p, grad_x_p, grads_p = output_and_grads(False)
    torch.testing.assert_close(out_r, out_p)
    torch.testing.assert_close(grad_x_r, grad_x_p)
    for name in grads_p:  # b_k shifts every score of a query alike: its gradient is zero on both paths (to rounding)
        torch.testing.assert_close(grads_r[name], grads_p[name], msg=name, atol=1e-5, rtol=1e-4)


def test_regrouping_is_chosen_for_training_shapes_and_never_under_no_grad():
    paper = ITuningModule(hidden_size=768, vision_hidden_size=768, bottleneck_dim=384)  # GPT-2 base, CLIP ViT-B/16
    assert paper._regroup_pays(queries=20, visual=197)  # a caption's 20 tokens against 197 visual tokens
    assert not paper._regroup_pays(queries=2000, visual=197)  # many queries per image: projecting is cheaper
    with torch.no_grad():  # generation: the keys/values are projected once per image and cached
        assert not paper._regroup_pays(queries=20, visual=197)
    assert not paper.eval()._regroup_pays(queries=20, visual=197)  # eval mode (ONNX export traces with autograd on)


def test_module_parameter_count_matches_paper_formula():
    d, r, dv = 48, 24, 20
    module = ITuningModule(hidden_size=d, vision_hidden_size=dv, bottleneck_dim=r)
    assert sum(p.numel() for p in module.parameters()) == (d * r + r) + 2 * (dv * r + r) + (r * d + d)


def test_default_attention_scale_is_inverse_sqrt_head_dim_and_zero_init_outputs_zero():
    module = ITuningModule(hidden_size=8, vision_hidden_size=6, bottleneck_dim=16, num_heads=4)
    assert module.attention_scale == pytest.approx(0.5)
    assert torch.count_nonzero(module(torch.randn(1, 2, 8), torch.randn(1, 3, 6))) == 0


def test_module_rejects_mismatched_batches():
    module = ITuningModule(hidden_size=8, vision_hidden_size=6, bottleneck_dim=4)
    with pytest.raises(ValueError, match="3 text sequences but 2 images"):
        module(torch.randn(3, 2, 8), torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="6 text sequences but 2 images x 2 sequences per image"):
        module(torch.randn(6, 2, 8), torch.randn(2, 5, 6), repeats=2)


@pytest.mark.parametrize("num_heads", [1, 2])
def test_sequences_sharing_an_image_equal_attending_to_copies_of_it(num_heads):
    """Beam search: the beams of an image attend to one set of keys/values, exactly as to per-beam copies."""
    module = ITuningModule(hidden_size=8, vision_hidden_size=6, bottleneck_dim=4, num_heads=num_heads, init="random")
    x, v = torch.randn(6, 3, 8, requires_grad=True), torch.randn(2, 5, 6)
    shared = module(x, v, repeats=3)
    (grad_shared,) = torch.autograd.grad(shared.square().sum(), x)
    copies = module(x, v.repeat_interleave(3, dim=0))
    (grad_copies,) = torch.autograd.grad(copies.square().sum(), x)
    torch.testing.assert_close(shared, copies)
    torch.testing.assert_close(grad_shared, grad_copies)
    # Rows 0-2 see image 0 and rows 3-5 image 1 (generate's repeat_interleave order), not images 0, 1, 0, ...
    assert not torch.allclose(shared, module(x, v.repeat(3, 1, 1)))


# ----------------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bottleneck_dim": 10, "num_heads": 4}, "not divisible by num_heads=4"),
        ({"first_layer": 4}, "leaves no layer"),
        ({"init": "xavier"}, "init must be one of"),
        ({"scale": 0.0}, "lambda"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_config_rejects_bad_settings_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**kwargs)


def test_config_defaults_follow_the_paper_and_the_lm():
    config = tiny_config()
    assert config.resolved_bottleneck_dim == config.text_config.hidden_size // 2
    assert config.num_heads == 1
    assert config.decoder_start_token_id == BOS and config.pad_token_id == EOS  # GPT-2: no pad token, EOS used
    assert config.ituning_layers == [0, 1, 2, 3]
    assert tiny_config(first_layer=2).ituning_layers == [2, 3]
    assert tiny_config(add_ituning_modules=False).ituning_layers == []


# ----------------------------------------------------------------------------------------------- loss
def test_loss_is_the_caption_cross_entropy_without_double_shift():
    model = tiny_model(init="random")
    pixel_values, captions = random_batch()
    labels = captions.clone()
    labels[1, -3:] = -100  # padding of the second caption
    out = model(pixel_values=pixel_values, decoder_input_ids=decoder_inputs(captions), labels=labels)
    log_probs = out.logits.log_softmax(-1)
    terms = [
        -log_probs[b, t, labels[b, t]]
        for b in range(labels.shape[0])
        for t in range(labels.shape[1])
        if labels[b, t] != -100
    ]
    torch.testing.assert_close(out.loss, torch.stack(terms).mean())
    shifted_again = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].reshape(-1, out.logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    assert not torch.allclose(out.loss, shifted_again)


def test_labels_alone_build_the_decoder_inputs_and_padding_is_masked():
    model = tiny_model(init="random")
    pixel_values, captions = random_batch()
    labels = captions.clone()
    labels[0, -2:] = -100
    from_labels = model(pixel_values=pixel_values, labels=labels)
    expected_inputs = shift_tokens_right(labels, model.config.pad_token_id, model.config.decoder_start_token_id)
    explicit = model(pixel_values=pixel_values, decoder_input_ids=expected_inputs, labels=labels)
    torch.testing.assert_close(from_labels.loss, explicit.loss)
    garbage = expected_inputs.clone()
    garbage[0, -1] = 42  # a token whose prediction is masked out
    torch.testing.assert_close(
        model(pixel_values=pixel_values, decoder_input_ids=garbage, labels=labels).loss, explicit.loss
    )


def test_cached_vision_states_replace_pixel_values():
    model = tiny_model(init="random")
    pixel_values, captions = random_batch()
    ids = decoder_inputs(captions)
    states = model.encode_images(pixel_values).last_hidden_state
    reference = model(pixel_values=pixel_values, decoder_input_ids=ids).logits
    for cached in (states, BaseModelOutput(last_hidden_state=states), (states,)):
        torch.testing.assert_close(model(encoder_outputs=cached, decoder_input_ids=ids).logits, reference)
    with pytest.raises(ValueError, match=r"shape \(2, 17, 31\).*width 32"):
        model(encoder_outputs=torch.randn(2, 17, 31), decoder_input_ids=ids)
    with pytest.raises(ValueError, match="Pass pixel_values"):
        model(decoder_input_ids=ids)
    with pytest.raises(ValueError, match="2 images but 1 caption"):
        model(pixel_values=pixel_values, decoder_input_ids=ids[:1])


# ----------------------------------------------------------------------------------------------- frozen backbones
@pytest.mark.parametrize(
    ("text", "vision"), [("gpt2", "clip"), ("llama", "clip"), ("gpt2", "siglip"), ("llama", "siglip")]
)
def test_decoder_agnostic_fresh_modules_leave_the_frozen_lm_unchanged(text, vision):
    model = tiny_model(text, vision)
    pixel_values, captions = random_batch()
    ids = decoder_inputs(captions)
    plain_lm = AutoModelForCausalLM.from_config(model.config.text_config).eval()
    plain_lm.load_state_dict(model.language_model.state_dict())
    torch.testing.assert_close(
        model(pixel_values=pixel_values, decoder_input_ids=ids).logits, plain_lm(input_ids=ids).logits
    )


@pytest.mark.parametrize(("text", "vision"), [("gpt2", "clip"), ("llama", "siglip")])
def test_only_ituning_parameters_train(text, vision):
    model = tiny_model(text, vision, init="random").train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("ituning.") for n in trainable)
    pixel_values, captions = random_batch()
    model(pixel_values=pixel_values, labels=captions).loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == trainable


def test_layers_below_the_first_module_build_no_autograd_graph():
    model = tiny_model(first_layer=2, init="random").train()
    model.enable_input_require_grads()  # worst case: the LM input itself requires grad
    outputs = {}
    for site in model.ffn_sites:
        site.layer.register_forward_hook(
            lambda module, args, out, i=site.index: outputs.__setitem__(i, out[0] if isinstance(out, tuple) else out)
        )
    pixel_values, captions = random_batch()
    loss = model(pixel_values=pixel_values, labels=captions).loss
    assert outputs[0].grad_fn is None and outputs[1].grad_fn is None
    assert outputs[2].grad_fn is not None and outputs[3].grad_fn is not None
    loss.backward()
    assert all(p.grad is not None for p in model.ituning.parameters())
    assert torch.is_grad_enabled()  # the no-grad window is closed after the forward pass


@pytest.mark.parametrize("text,reentrant", [("gpt2", None), ("llama", None), ("gpt2", True), ("llama", False)])
def test_gradient_checkpointing_gives_the_same_gradients_even_for_interleaved_micro_batches(text, reentrant):
    """None: the default call; True/False: `Trainer(gradient_checkpointing_kwargs={"use_reentrant": ...})` with the
    usual LoRA recipe's `enable_input_require_grads()`."""
    (pixels_a, captions_a), (pixels_b, captions_b) = random_batch(seed=1), random_batch(batch=3, seed=2)
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(text, first_layer=1, init="random")
        model.train()
        for module in model.language_model.modules():  # dropout off: compare gradients exactly
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        if checkpointing and reentrant is None:
            enable_activation_checkpointing(model)
        elif checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            model.enable_input_require_grads()
        # Two forward passes, then one backward (summed micro-batches): recomputation must use each pass's image.
        loss_a = model(pixel_values=pixels_a, labels=captions_a).loss
        loss_b = model(pixel_values=pixels_b, labels=captions_b).loss
        (loss_a + loss_b).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.ituning.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


# ----------------------------------------------------------------------------------------------- generation
def test_generate_greedy_beam_and_sampling_batched():
    model = tiny_model(init="random")
    pixel_values, _ = random_batch(batch=3)
    greedy = model.generate(pixel_values=pixel_values, num_beams=1, max_new_tokens=5, min_new_tokens=5)
    assert greedy.shape == (3, 6) and (greedy[:, 0] == BOS).all()
    beam = model.generate(pixel_values=pixel_values, max_new_tokens=5)  # default: the paper's beam 5
    assert model.generation_config.num_beams == 5 and beam.shape[0] == 3
    beams = model.generate(pixel_values=pixel_values, num_beams=5, num_return_sequences=5, max_new_tokens=5)
    assert beams.shape[0] == 15
    torch.manual_seed(3)
    sample_a = model.generate(pixel_values=pixel_values, do_sample=True, num_beams=1, max_new_tokens=5)
    torch.manual_seed(3)
    sample_b = model.generate(pixel_values=pixel_values, do_sample=True, num_beams=1, max_new_tokens=5)
    assert torch.equal(sample_a, sample_b)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_from_cached_vision_states_in_every_form_equals_generate_from_pixels(num_beams):
    model = tiny_model(init="random")
    pixel_values, _ = random_batch(batch=2)
    kwargs = dict(num_beams=num_beams, max_new_tokens=5, min_new_tokens=5)
    reference = model.generate(pixel_values=pixel_values, **kwargs)
    states = model.encode_images(pixel_values).last_hidden_state
    shared = BaseModelOutput(last_hidden_state=states)
    for cached in (states, (states,), shared, shared):  # the same object twice: beam search must not grow it
        assert torch.equal(model.generate(encoder_outputs=cached, **kwargs), reference)
    assert shared.last_hidden_state.shape[0] == 2


def test_batched_greedy_generation_equals_one_image_at_a_time():
    model = tiny_model(init="random")
    pixel_values, _ = random_batch(batch=3)
    kwargs = dict(num_beams=1, max_new_tokens=6, min_new_tokens=6)
    batched = model.generate(pixel_values=pixel_values, **kwargs)
    singles = torch.cat([model.generate(pixel_values=pixel_values[i : i + 1], **kwargs) for i in range(3)])
    assert torch.equal(batched, singles)


@pytest.mark.parametrize("num_beams", [1, 5])
def test_generation_is_identical_with_and_without_the_decoder_kv_cache(num_beams):
    model = tiny_model(init="random", text="llama")
    pixel_values, _ = random_batch(batch=2)
    kwargs = dict(num_beams=num_beams, max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
    cached = model.generate(pixel_values=pixel_values, use_cache=True, **kwargs)
    uncached = model.generate(pixel_values=pixel_values, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    for a, b in zip(cached.scores, uncached.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_traced_decode_step_has_no_graph_break_and_gives_the_default_captions():
    """generate()'s static cache with a compiled decode step (its GPU fast path; here traced without inductor, on the
    CPU) traces the whole step in one graph and gives the default path's greedy captions (fp32)."""
    from transformers import CompileConfig

    torch._dynamo.reset()
    model = tiny_model(init="random")
    pixel_values, _ = random_batch(batch=2)
    kwargs = dict(num_beams=1, max_new_tokens=6, min_new_tokens=6)
    traced = CompileConfig(backend="eager", fullgraph=True, mode=None)  # fullgraph: a graph break is an error
    traced._compile_all_devices = True  # transformers compiles the decode step on GPUs only unless told
    expected = model.generate(pixel_values=pixel_values, **kwargs)
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of earlier compiles
    got = model.generate(pixel_values=pixel_values, cache_implementation="static", compile_config=traced, **kwargs)
    assert torch.equal(got, expected)
    # one graph for all 6 steps (no caption mask given: generate() would widen a 2-D one each step, a new shape;
    # itune_hf.inference.decoding drops a mask of ones, tests/test_decoding.py)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_generate_compiles_no_beam_search_step_as_the_fast_path_assumes():
    """The fast decoding path (`itune_hf.inference.decoding`) compiles the forward itself for beam search because
    generate() compiles greedy and sampling steps only; if transformers starts compiling beam search, this fails:
    then compare generate's own compiled path there."""
    from transformers import CompileConfig

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = tiny_model(init="random")
    pixel_values, _ = random_batch(batch=2)
    traced = CompileConfig(backend="eager", fullgraph=True, mode=None)
    traced._compile_all_devices = True
    model.generate(pixel_values=pixel_values, num_beams=2, max_new_tokens=3, min_new_tokens=3,
                   cache_implementation="static", compile_config=traced)  # fmt: skip
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0
    torch._dynamo.reset()


def test_visual_keys_and_values_are_projected_once_per_generate_call():
    model = tiny_model(init="random", first_layer=1)
    counts, batch_sizes = Counter(), Counter()

    def count(module, args, output, key):
        counts[key] += 1
        batch_sizes[(key[1], args[0].shape[0])] += 1

    for index, module in model.ituning.items():
        for proj in ("q_proj", "k_proj", "v_proj"):
            getattr(module, proj).register_forward_hook(functools.partial(count, key=(index, proj)))
    pixel_values, _ = random_batch(batch=2)
    kwargs = dict(num_beams=5, max_new_tokens=6, min_new_tokens=6, output_scores=True, return_dict_in_generate=True)
    once = model.generate(pixel_values=pixel_values, **kwargs)
    for index in model.ituning:
        assert counts[(index, "k_proj")] == 1 and counts[(index, "v_proj")] == 1
        assert counts[(index, "q_proj")] == 6  # one query projection per decoding step
    # ... from the 2 images, not from their 10 beam copies
    assert {size for proj, size in batch_sizes if proj != "q_proj"} == {2}
    assert {size for proj, size in batch_sizes if proj == "q_proj"} == {10}
    assert all(module._kv_memo is None for module in model.ituning.values())  # released after generate
    assert model.vision_context.expansion is None
    # Projecting the beam copies instead gives the same search.
    with mock.patch.object(VisionContext, "require_distinct_states", lambda self, where: (self.states, 1)):
        copies = model.generate(pixel_values=pixel_values, **kwargs)
    assert torch.equal(once.sequences, copies.sequences)
    for a, b in zip(once.scores, copies.scores):
        torch.testing.assert_close(a, b)


def test_cached_visual_keys_never_go_stale():
    model = tiny_model(init="random")
    first, _ = random_batch(batch=2, seed=1)
    second, _ = random_batch(batch=2, seed=2)
    kwargs = dict(num_beams=1, max_new_tokens=5, min_new_tokens=5)
    expected_second = tiny_model(init="random").generate(pixel_values=second, **kwargs)
    model.generate(pixel_values=first, **kwargs)
    assert torch.equal(model.generate(pixel_values=second, **kwargs), expected_second)
    # Under no_grad, same vision-states tensor but changed weights (an optimizer step): recomputed.
    _, captions = random_batch(batch=2)
    states = model.encode_images(first).last_hidden_state
    ids = decoder_inputs(captions)
    with torch.no_grad():
        before = model(encoder_outputs=states, decoder_input_ids=ids).logits
        model.ituning["3"].k_proj.weight.add_(1.0)
        after = model(encoder_outputs=states, decoder_input_ids=ids).logits
        model.clear_vision_cache()
        fresh = model(encoder_outputs=states, decoder_input_ids=ids).logits
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, fresh)


def test_prompted_generation_continues_the_prompt():
    model = tiny_model(init="random")
    pixel_values, _ = random_batch(batch=2)
    prompt = torch.tensor([[BOS, 5, 6], [BOS, 5, 6]])
    out = model.generate(pixel_values=pixel_values, decoder_input_ids=prompt, num_beams=1, max_new_tokens=4)
    assert torch.equal(out[:, :3], prompt)


# ----------------------------------------------------------------------------------------------- architectures
def test_ffn_sites_for_mapped_and_discovered_architectures():
    from transformers import OPTConfig, Starcoder2Config

    gpt2 = tiny_model("gpt2")
    assert [s.path for s in gpt2.ffn_sites] == [f"transformer.h.{i}.mlp" for i in range(4)]
    assert [s.path for s in tiny_model("llama").ffn_sites][0] == "model.layers.0.mlp"
    starcoder = AutoModelForCausalLM.from_config(
        Starcoder2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=50,
        )
    )
    assert [s.path for s in find_ffn_sites(starcoder)] == [f"model.layers.{i}.mlp" for i in range(3)]
    opt = AutoModelForCausalLM.from_config(
        OPTConfig(
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=50,
            word_embed_proj_dim=32,
        )
    )
    with pytest.raises(ValueError, match="feed-forward blocks of LM type 'opt'.*DECODER_FFN_MAPPING"):
        find_ffn_sites(opt)


def test_language_model_called_alone_explains_itself():
    model = tiny_model()
    with pytest.raises(RuntimeError, match="ran without vision states"):
        model.language_model(input_ids=torch.tensor([[BOS, 4]]))


# ----------------------------------------------------------------------------------------------- save / load
def test_full_checkpoint_round_trip_keeps_outputs_and_frozen_backbones(tmp_path):
    model = tiny_model("llama", "siglip", init="random", first_layer=1)
    pixel_values, captions = random_batch()
    ids = decoder_inputs(captions)
    model.save_pretrained(tmp_path)
    loaded = ITuningForCaptioning.from_pretrained(tmp_path).eval()
    assert isinstance(loaded.config, ITuningConfig) and loaded.config.first_layer == 1
    torch.testing.assert_close(
        loaded(pixel_values=pixel_values, decoder_input_ids=ids).logits,
        model(pixel_values=pixel_values, decoder_input_ids=ids).logits,
    )
    assert {n for n, p in loaded.named_parameters() if p.requires_grad} == {
        n for n, p in model.named_parameters() if p.requires_grad
    }
    assert loaded.generation_config.num_beams == 5


def test_tied_gpt2_head_survives_save_and_load(tmp_path):
    model = tiny_model("gpt2", init="random")
    model.save_pretrained(tmp_path)
    loaded = ITuningForCaptioning.from_pretrained(tmp_path)
    lm = loaded.language_model
    assert lm.lm_head.weight.data_ptr() == lm.transformer.wte.weight.data_ptr()
    torch.testing.assert_close(lm.transformer.wte.weight, model.language_model.transformer.wte.weight)


def test_from_vision_text_pretrained_loads_both_backbones(tmp_path):
    from transformers import CLIPConfig, CLIPModel

    from conftest import tiny_text_config, tiny_vision_config

    clip_dir, lm_dir = tmp_path / "clip", tmp_path / "lm"
    torch.manual_seed(0)
    clip = CLIPModel(
        CLIPConfig(
            vision_config=tiny_vision_config().to_dict(),
            text_config={
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "vocab_size": 50,
            },
            projection_dim=16,
        )
    )
    clip.save_pretrained(clip_dir)
    lm = AutoModelForCausalLM.from_config(tiny_text_config())
    lm.save_pretrained(lm_dir)
    model = ITuningForCaptioning.from_vision_text_pretrained(str(clip_dir), str(lm_dir), first_layer=2)
    torch.testing.assert_close(
        model.vision_model.embeddings.patch_embedding.weight, clip.vision_model.embeddings.patch_embedding.weight
    )
    torch.testing.assert_close(model.language_model.lm_head.weight, lm.lm_head.weight)
    assert model.config.vision_config.model_type == "clip_vision_model"
    assert list(model.ituning) == ["2", "3"]
    assert not any(p.requires_grad for p in model.vision_model.parameters())


def test_disable_ituning_gives_the_frozen_backbones_alone():
    model = tiny_model(init="random")
    pixel_values, captions = random_batch()
    ids = decoder_inputs(captions)
    plain_lm = AutoModelForCausalLM.from_config(model.config.text_config).eval()
    plain_lm.load_state_dict(model.language_model.state_dict())
    with_modules = model(pixel_values=pixel_values, decoder_input_ids=ids).logits
    with model.disable_ituning():
        assert model.image_layers() == []
        torch.testing.assert_close(
            model(pixel_values=pixel_values, decoder_input_ids=ids).logits, plain_lm(input_ids=ids).logits
        )
    torch.testing.assert_close(model(pixel_values=pixel_values, decoder_input_ids=ids).logits, with_modules)


def test_generate_without_an_image_says_what_to_pass():
    model = build_model("itune-tiny-random")
    with pytest.raises(ValueError, match="no pixel_values or encoder_outputs.*input_ids"):
        model.generate(input_ids=torch.tensor([[1, 2]]))


def test_a_full_checkpoint_loaded_bare_drops_its_modules_without_a_load_report(tmp_path, capsys, caplog):
    from itune_hf import build_model

    model = build_model("itune-tiny-random", init="random")
    model.save_pretrained(tmp_path)
    bare = ITuningForCaptioning.from_pretrained(tmp_path, add_ituning_modules=False)
    assert len(bare.ituning) == 0
    said = capsys.readouterr().out + capsys.readouterr().err + caplog.text
    assert "UNEXPECTED" not in said and "ituning." not in said
    full = ITuningForCaptioning.from_pretrained(tmp_path)  # the modules still load where they are wanted
    assert all(torch.equal(full.state_dict()[k], v) for k, v in model.state_dict().items() if k.startswith("ituning."))
