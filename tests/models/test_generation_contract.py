"""Generation on the installed transformers, for every family and both LM layouts (GPT-2 handles an
`EncoderDecoderCache` itself, Llama does not: transformers 5.24's rename of `past_key_values` to `cache` broke only the
latter), and the private `GenerationMixin` methods the models still override; `Seq2SeqTrainer`'s `generation_max_length`
caps what is generated.

Each private hook is checked for the signature and the behaviour the override relies on; a failure names the method
and says what to do. ARCHITECTURE.md ("Private hooks") says why each has no public replacement.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import transformers
from packaging import version
from transformers import GenerationMixin
from transformers.modeling_outputs import Seq2SeqLMOutput

from itune_hf import ITuningForCaptioning, XGPTForCaptioning
from itune_hf.models._shared.generation import CACHE_RENAMED_IN, OLD_CACHE_NAME_REMOVED_IN
from itune_hf.models.clipcap.configuration_clipcap import ClipCapConfig
from itune_hf.models.clipcap.modeling_clipcap import ClipCapForCaptioning
from itune_hf.models.crossattn.modeling_crossattn import CrossAttnForCaptioning
from itune_hf.presets import build_model

from conftest import BOS, EOS, IMAGE_SIZE, tiny_model, tiny_processor, tiny_text_config, tiny_vision_config

NEW_TOKENS = 5


def clipcap_llama() -> ClipCapForCaptioning:
    torch.manual_seed(0)
    config = ClipCapConfig(
        vision_config=tiny_vision_config().to_dict(), text_config=tiny_text_config("llama").to_dict(), prefix_length=3
    )
    return ClipCapForCaptioning(config).eval()


def preset(name: str):
    def build():
        torch.manual_seed(0)
        return build_model(name).eval()

    return build


#: name -> a tiny model of each family; I-Tuning and ClipCap over a GPT-2 and a Llama LM.
MODELS = {
    "ituning-gpt2": lambda: tiny_model("gpt2"),
    "ituning-llama": lambda: tiny_model("llama"),
    "xgpt": preset("xgpt-tiny-random"),
    "clipcap-gpt2": preset("clipcap-mlp-tiny-random"),
    "clipcap-llama": clipcap_llama,
    "crossattn-gpt2": preset("crossattn-tiny-random"),
}


def pixels(batch: int = 3, model=None, seed: int = 1) -> torch.Tensor:
    """Random images of the size `model`'s vision tower takes (default: the tiny configs')."""
    size = IMAGE_SIZE if model is None else model.config.vision_config.image_size
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def generate(model, images: torch.Tensor, **kwargs) -> torch.Tensor:
    kwargs = {"max_new_tokens": NEW_TOKENS, "num_beams": 1, **kwargs}
    if isinstance(model, XGPTForCaptioning):
        kwargs.pop("max_new_tokens")
        kwargs["max_length"] = NEW_TOKENS + 1
    return model.generate(pixel_values=images, **kwargs)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def test_greedy_with_the_cache_equals_greedy_without_it_and_batches_equal_single_images(model):
    images = pixels(3, model)
    cached = generate(model, images, use_cache=True)
    assert torch.equal(cached, generate(model, images, use_cache=False))
    for row in range(3):
        alone = generate(model, images[row : row + 1])
        assert torch.equal(alone[0], cached[row, : alone.shape[1]]), f"image {row} captioned alone differs"


def test_generate_takes_the_encoders_own_output_as_encoder_outputs(model):
    images = pixels(2, model)
    with torch.no_grad():
        encoded = model.get_encoder()(pixel_values=images)  # a tower's output may carry pooler_output
    kwargs = {"max_new_tokens": NEW_TOKENS, "num_beams": 1}
    if isinstance(model, XGPTForCaptioning):
        kwargs = {"max_length": NEW_TOKENS + 1, "num_beams": 1}
    assert torch.equal(model.generate(encoder_outputs=encoded, **kwargs), generate(model, images))


def test_beam_search_and_sampling_return_the_asked_sequences(model):
    images = pixels(2, model)
    beams = generate(model, images, num_beams=3, num_return_sequences=2)
    assert beams.shape[0] == 4
    torch.manual_seed(5)
    first = generate(model, images, do_sample=True, top_k=20)
    torch.manual_seed(5)
    assert torch.equal(first, generate(model, images, do_sample=True, top_k=20))


def test_generate_returns_scores_and_attentions_on_request(model):
    images = pixels(2, model)
    out = generate(model, images, return_dict_in_generate=True, output_scores=True, output_attentions=True)
    assert len(out.scores) == out.sequences.shape[1] - 1
    assert out.decoder_attentions is not None and len(out.decoder_attentions) == len(out.scores)
    # ClipCap's prefix is in the LM's input: no cross-attention. The cross-attention family's GPT-2 under sdpa returns
    # no attention probabilities (transformers says so; `attn_implementation="eager"` does).
    if isinstance(model, (ITuningForCaptioning, XGPTForCaptioning)):
        assert out.cross_attentions is not None and out.cross_attentions[0][0].shape[0] == 2


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_static_cache_gives_the_dynamic_caches_tokens_and_scores(model, num_beams):
    """`cache_implementation="static"` (a preallocated cache, what compiled GPU decoding uses): the same tokens and
    scores as the dynamic cache, with a left-padded prompt too (ClipCap's cache also holds its prefix)."""
    images = pixels(2, model)
    prompt = torch.tensor([[BOS, 7, 9], [EOS, BOS, 5]])  # the second row left-padded
    prompted = {"decoder_input_ids": prompt, "decoder_attention_mask": torch.tensor([[1, 1, 1], [0, 1, 1]])}
    for inputs in ({}, prompted):
        kwargs = {"num_beams": num_beams, "return_dict_in_generate": True, "output_scores": True, **inputs}
        dynamic = generate(model, images, **kwargs)
        static = generate(model, images, cache_implementation="static", **kwargs)
        assert torch.equal(static.sequences, dynamic.sequences), f"static {static.sequences} != {dynamic.sequences}"
        for step, (a, b) in enumerate(zip(static.scores, dynamic.scores)):
            torch.testing.assert_close(a, b, msg=f"step {step}: the scores differ")


def test_the_forward_pass_takes_the_cache_under_both_names_and_returns_it_under_transformers_name():
    model = tiny_model("llama")
    images, ids = pixels(2), torch.full((2, 1), BOS)
    first = model(pixel_values=images, decoder_input_ids=ids, use_cache=True)
    field = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
    assert field in first.keys()
    step = torch.full((2, 1), EOS + 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        by_old = model(pixel_values=images, decoder_input_ids=step, past_key_values=first[field], use_cache=True)
    second = model(pixel_values=images, decoder_input_ids=ids, use_cache=True)
    by_new = model(pixel_values=images, decoder_input_ids=step, cache=second[field], use_cache=True)
    torch.testing.assert_close(by_old.logits, by_new.logits)
    with pytest.raises(ValueError, match="Pass the cache once"):
        model(pixel_values=images, decoder_input_ids=ids, cache=first[field], past_key_values=first[field])
    # The old name is deprecated where transformers itself passes the new one, and silent where it passes the old
    deprecated = [w for w in caught if issubclass(w.category, FutureWarning) and "past_key_values" in str(w.message)]
    renamed = version.parse(transformers.__version__) >= version.parse(CACHE_RENAMED_IN)
    assert len(deprecated) == int(renamed), [str(w.message) for w in caught]
    if renamed:
        message = str(deprecated[0].message)
        assert deprecated[0].filename == __file__  # the caller's line, past torch's Module.__call__
        assert (
            "ITuningForCaptioning.forward" in message and OLD_CACHE_NAME_REMOVED_IN in message and "`cache`" in message
        )


def test_generate_never_warns_about_the_cache_name_transformers_passes(model):
    # generate() passes the cache under the installed transformers' own name: no deprecation reaches the user
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate(model, pixels(2, model), num_beams=2)
    assert not [w for w in caught if "past_key_values" in str(w.message) or "`cache`" in str(w.message)]


# ------------------------------------------------------------------------------------------------------------------
#: method -> (the leading parameters the override relies on, the classes overriding it, why)
PRIVATE_HOOKS = {
    "_prepare_special_tokens": (
        ["self", "generation_config", "kwargs_has_attention_mask"],
        (ITuningForCaptioning, XGPTForCaptioning, ClipCapForCaptioning, CrossAttnForCaptioning),
        "passes kwargs_has_attention_mask=None: the main input is an image, never padded",
    ),
    "_expand_inputs_for_generation": (
        ["self", "expand_size", "is_encoder_decoder", "input_ids"],
        (ITuningForCaptioning,),
        "records each image's vision states before the beam expansion (keys/values projected once per image)",
    ),
    "_prepare_static_cache": (
        ["self", "cache_implementation", "batch_size", "max_cache_len"],
        (ClipCapForCaptioning,),
        "sizes the static cache for the prefix embeddings the LM's cache holds before the caption",
    ),
    "_prepare_generated_length": (
        ["self", "generation_config", "has_default_max_length"],
        (XGPTForCaptioning,),
        "makes the saved max_length a default that max_new_tokens replaces, and refuses lengths past the positions",
    ),
}


def hook_message(name: str, problem: str) -> str:
    classes = ", ".join(c.__name__ for c in PRIVATE_HOOKS[name][1])
    return (
        f"transformers changed GenerationMixin.{name}: {problem}. {classes} override it ({PRIVATE_HOOKS[name][2]}): "
        "adapt the override (ARCHITECTURE.md, 'Private hooks') before widening the transformers range in setup.cfg"
    )


@pytest.mark.parametrize("name", sorted(PRIVATE_HOOKS))
def test_each_overridden_private_hook_keeps_its_signature(name):
    method = getattr(GenerationMixin, name, None)
    assert method is not None, hook_message(name, "it no longer exists")
    parameters = list(inspect.signature(method).parameters)
    expected = PRIVATE_HOOKS[name][0]
    assert parameters[: len(expected)] == expected, hook_message(name, f"its parameters are now {parameters}")
    for owner in PRIVATE_HOOKS[name][1]:
        assert name in overridden_by_the_package(owner), f"{owner.__name__} no longer overrides {name}: remove it"


def overridden_by_the_package(owner: type) -> set[str]:
    """The attributes `owner` or one of its own bases (a class of the package, e.g. the shared generation mixin)
    defines."""
    return {name for klass in owner.__mro__ if klass.__module__.startswith("itune_hf.") for name in vars(klass)}


def private_overrides() -> set[str]:
    """Every private GenerationMixin method some family overrides."""
    return {
        attribute
        for owner in (ITuningForCaptioning, XGPTForCaptioning, ClipCapForCaptioning, CrossAttnForCaptioning)
        for attribute in overridden_by_the_package(owner)
        if attribute.startswith("_") and not attribute.startswith("__") and hasattr(GenerationMixin, attribute)
    }


def test_every_private_generation_method_the_models_override_is_listed_and_tested():
    unlisted = private_overrides() - set(PRIVATE_HOOKS)
    assert not unlisted, f"private GenerationMixin methods overridden but not listed in PRIVATE_HOOKS: {unlisted}"


class Spy:
    """Records the calls of a GenerationMixin method while generate() runs."""

    def __init__(self, monkeypatch, name: str):
        self.calls, original = [], getattr(GenerationMixin, name)

        def spy(model, *args, **kwargs):
            self.calls.append((args, kwargs))
            return original(model, *args, **kwargs)

        monkeypatch.setattr(GenerationMixin, name, spy)


def test_generate_still_calls_the_hooks_the_way_the_overrides_expect(monkeypatch):
    special = Spy(monkeypatch, "_prepare_special_tokens")
    expand = Spy(monkeypatch, "_expand_inputs_for_generation")
    model = tiny_model("llama")
    model.generate(pixel_values=pixels(2), num_beams=3, max_new_tokens=3)
    assert special.calls, hook_message("_prepare_special_tokens", "generate() no longer calls it")
    args, kwargs = special.calls[0]
    assert len(args) >= 2 and args[1] is None, hook_message(
        "_prepare_special_tokens", f"the override no longer receives kwargs_has_attention_mask second: {args}, {kwargs}"
    )
    assert expand.calls, hook_message("_expand_inputs_for_generation", "generate() no longer calls it")
    (args, kwargs) = expand.calls[0]
    expand_size = kwargs.get("expand_size", args[0] if args else None)
    assert expand_size == 3 and "encoder_outputs" in kwargs, hook_message(
        "_expand_inputs_for_generation", f"called with {args} and {sorted(kwargs)}, not expand_size=beams + states"
    )


def test_generate_still_prepares_the_length_through_the_xgpt_override(monkeypatch):
    length = Spy(monkeypatch, "_prepare_generated_length")
    model = build_model("xgpt-tiny-random").eval()
    images = pixels(1, model)
    out = model.generate(pixel_values=images, num_beams=1, max_new_tokens=3)
    assert length.calls, hook_message("_prepare_generated_length", "generate() no longer calls it")
    assert out.shape[1] <= 4, hook_message("_prepare_generated_length", f"max_new_tokens=3 gave {out.shape[1]} ids")
    with pytest.raises(ValueError, match="positions"):
        model.generate(pixel_values=images, num_beams=1, max_new_tokens=model.config.max_position_embeddings + 1)


@pytest.mark.filterwarnings("ignore:Unfeasible length constraints")
def test_seq2seq_trainer_generation_max_length_limits_what_is_generated(captioner_dirs, tmp_path):
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from itune_hf import ITuningForCaptioning

    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"])  # its saved generation config: 30 new tokens
    assert model.generation_config.max_new_tokens == 30
    args = Seq2SeqTrainingArguments(
        tmp_path, predict_with_generate=True, generation_max_length=8, generation_num_beams=1,
        per_device_eval_batch_size=2, report_to=[], use_cpu=True,
    )  # fmt: skip
    processor = tiny_processor()
    trainer = Seq2SeqTrainer(model=model, args=args, processing_class=processor)
    images = [{"pixel_values": torch.randn(3, 32, 32)} for _ in range(2)]
    predictions = trainer.predict(images, min_new_tokens=20).predictions  # would run to 30 tokens unless capped
    pad = processor.tokenizer.pad_token_id
    assert (predictions[:, 1:8] != pad).all() and (predictions[:, 8:] == pad).all()
