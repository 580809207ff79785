"""`itune_hf.inference.decoding`: the fast decoding path (static cache, compiled decode step), chosen by device for
`itune caption` and the `image-to-text` pipeline. On the CPU the step is traced with the "eager" backend and a full
graph (a graph break is an error), which checks what inductor would compile on a GPU without compiling it."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from itune_hf.cli import main
from itune_hf.inference import decoding
from itune_hf.inference.decoding import FAST_DECODING_FAMILIES, fast_generate, resolve_decoding
from itune_hf.presets import build_model

from conftest import write_photo

#: a tiny preset of every registered family
FAMILY_PRESETS = {
    "ituning": "itune-tiny-random",
    "xgpt": "xgpt-tiny-random",
    "crossattn": "crossattn-tiny-random",
    "clipcap": "clipcap-mlp-tiny-random",
}


@pytest.fixture
def traced(monkeypatch):
    """The fast path traced without compiling, with dynamo's graph counts fresh."""
    monkeypatch.setattr(decoding, "BACKEND", "eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of earlier compiles
    yield torch._dynamo.utils.counters["stats"]
    torch._dynamo.reset()


def tiny(preset: str, seed: int = 0):
    """A tiny captioner and what its processor gives for two images of `seed` (pixels, the start token, a mask of
    ones). I-Tuning's modules are initialised at random: at their default (zero output projection) they add nothing,
    and no caption could tell which visual keys/values a step read."""
    from PIL import Image

    from itune_hf.presets import build_processor

    torch.manual_seed(0)
    model = build_model(preset, **({"init": "random"} if preset.startswith("itune") else {})).eval()
    pixels = np.random.default_rng(seed).integers(0, 256, size=(2, 36, 40, 3), dtype=np.uint8)
    images = [Image.fromarray(array) for array in pixels]
    return model, dict(build_processor(preset)(images=images, return_tensors="pt"))


def test_every_registered_family_is_either_on_the_fast_path_or_known_not_to_trace():
    from itune_hf.models import families

    assert {family.model_type for family in families().values()} == set(FAMILY_PRESETS)
    assert set(FAST_DECODING_FAMILIES) < set(FAMILY_PRESETS)


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("family", FAST_DECODING_FAMILIES)
def test_the_fast_path_gives_the_default_captions_in_one_graph_per_shape(traced, family, num_beams):
    """fp32: the captions of the default path (dynamic cache, eager), greedy and beam search. The prefill runs
    eagerly and one compiled graph serves every later step (greedy: generate() compiles it; beam search: the forward
    compiled by the package)."""
    model, inputs = tiny(FAMILY_PRESETS[family])
    assert inputs["decoder_attention_mask"].all()  # dropped by the fast path: generate would widen it each step
    kwargs = dict(**inputs, num_beams=num_beams, max_new_tokens=6, min_new_tokens=6)
    expected = fast_generate(model, "default", **kwargs)
    assert traced["unique_graphs"] == 0
    got = fast_generate(model, "fast", **kwargs)
    assert torch.equal(got, expected)
    assert traced["unique_graphs"] == 1
    assert "forward" not in vars(model)  # the eager forward is back
    again = fast_generate(model, "fast", **kwargs)  # the same shapes: the graph is reused
    assert torch.equal(again, expected) and traced["unique_graphs"] == 1


def test_a_family_outside_the_fast_path_does_not_trace_in_one_graph_and_fast_is_refused_for_it(traced):
    model, inputs = tiny(FAMILY_PRESETS["clipcap"])
    with pytest.raises(ValueError, match="clipcap captioner's decode step does not trace in one graph"):
        fast_generate(model, "fast", **inputs, num_beams=1, max_new_tokens=3)
    assert resolve_decoding(model, "auto") == "default"
    with pytest.raises(torch._dynamo.exc.Unsupported):  # why it is outside: a data-dependent branch
        with decoding.compiled_forward(model, "eager"):
            model.generate(pixel_values=inputs["pixel_values"], num_beams=2, max_new_tokens=3,
                           cache_implementation="static")  # fmt: skip


def test_a_padded_prompt_batch_decodes_on_the_default_path_under_auto(traced, monkeypatch):
    """generate() widens the caption mask every step: a mask with padding would give the compiled step a new shape
    at each token, so "auto" leaves such a batch on the default path (a mask of ones is dropped instead)."""
    model, inputs = tiny(FAMILY_PRESETS["ituning"])
    monkeypatch.setattr(decoding, "_on_gpu", lambda captioner: True)
    bos = inputs["decoder_input_ids"][0, 0]
    prompts = torch.tensor([[bos, bos, 40, 41], [bos, bos, bos, 42]])  # the second row left-padded by one
    padded = dict(pixel_values=inputs["pixel_values"], decoder_input_ids=prompts,
                  decoder_attention_mask=torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]))  # fmt: skip
    expected = model.generate(**padded, num_beams=1, max_new_tokens=4)
    assert torch.equal(fast_generate(model, "auto", **padded, num_beams=1, max_new_tokens=4), expected)
    assert traced["unique_graphs"] == 0
    assert decoding.decoded_on(model) == {"default": 1}  # what itune eval reports, not the path asked for
    fast_generate(model, "auto", pixel_values=inputs["pixel_values"], num_beams=1, max_new_tokens=4)
    assert decoding.decoded_on(model) == {"default": 1, "fast": 1} and traced["unique_graphs"] > 0


def test_itune_caption_and_eval_offer_the_decodings_the_package_has():
    from itune_hf.commands import _models

    assert _models.DECODINGS == decoding.DECODINGS  # a copy there, so that parsing arguments imports no torch


def test_auto_is_the_default_path_on_the_cpu_and_the_fast_path_on_a_gpu(monkeypatch):
    model, _ = tiny(FAMILY_PRESETS["ituning"])
    assert resolve_decoding(model, "auto") == "default" and resolve_decoding(model, "fast") == "fast"
    monkeypatch.setattr(decoding, "_on_gpu", lambda captioner: True)
    assert resolve_decoding(model, "auto") == "fast" and resolve_decoding(model, "default") == "default"
    with pytest.raises(ValueError, match="decoding='quick' is not one of auto, default, fast"):
        resolve_decoding(model, "quick")


def test_auto_falls_back_for_good_when_compiling_fails_and_for_one_call_when_a_step_does_not_trace(monkeypatch):
    model, inputs = tiny(FAMILY_PRESETS["ituning"])
    kwargs = dict(**inputs, num_beams=2, max_new_tokens=4)
    expected = model.generate(**kwargs)
    raised = []

    def failing(model, backend, kwargs):
        raise raised[-1]

    monkeypatch.setattr(decoding, "_on_gpu", lambda captioner: True)
    monkeypatch.setattr(decoding, "_generate_fast", failing)
    raised.append(torch._dynamo.exc.Unsupported("a graph break\nmore"))  # these settings only: tried again next call
    with pytest.raises(torch._dynamo.exc.Unsupported):
        fast_generate(model, "fast", **kwargs)
    with pytest.warns(RuntimeWarning, match=r"does not trace with these settings; this call .*\(Unsupported: a graph"):
        assert torch.equal(fast_generate(model, "auto", **kwargs), expected)
    assert resolve_decoding(model, "auto") == "fast"
    raised.append(torch._dynamo.exc.FailOnRecompileLimitHit("recompile limit hit"))  # not an exception of dynamo's
    with pytest.warns(RuntimeWarning, match=r"failed to compile here; .* from now on \(FailOnRecompileLimitHit"):
        assert torch.equal(fast_generate(model, "auto", **kwargs), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: later calls go straight to the default path
        assert torch.equal(fast_generate(model, "auto", **kwargs), expected)
    assert resolve_decoding(model, "auto") == "default" and resolve_decoding(model, "fast") == "fast"


def test_on_a_gpu_greedy_asks_generate_for_cuda_graphs_and_beam_search_runs_the_compiled_forward(monkeypatch):
    """The GPU branch, which no CPU test compiles: what reaches generate()."""
    model, inputs = tiny(FAMILY_PRESETS["ituning"])
    seen = []

    def generate(**kwargs):
        seen.append({**kwargs, "forward": vars(model).get("forward")})
        return torch.zeros(1, 1, dtype=torch.long)

    monkeypatch.setattr(decoding, "_on_gpu", lambda captioner: True)
    model.generate = generate
    fast_generate(model, "auto", **inputs, num_beams=1)
    greedy = seen[-1]
    config = greedy["compile_config"]
    assert (config.backend, config.mode, config.fullgraph) == ("inductor", "reduce-overhead", True)
    assert config.dynamic is None  # automatic dynamic shapes
    assert config._compile_all_devices and greedy["cache_implementation"] == "static" and greedy["forward"] is None
    assert "decoder_attention_mask" not in greedy  # ones: dropped
    fast_generate(model, "auto", **inputs)  # the model's own 5 beams
    beam = seen[-1]
    assert beam["forward"] is not None  # the compiled forward, swapped in for the call
    assert beam["disable_compile"] and beam["cache_implementation"] == "static" and "compile_config" not in beam
    assert "forward" not in vars(model)


def test_the_beams_of_a_call_are_those_generate_runs_whichever_way_they_are_given():
    from transformers import GenerationConfig

    model, _ = tiny(FAMILY_PRESETS["ituning"])
    model.generation_config.num_beams = 5
    assert decoding._beams(model, {"generation_config": GenerationConfig(max_new_tokens=5)}) == 5  # filled in
    assert decoding._beams(model, {"generation_config": GenerationConfig(num_beams=2)}) == 2
    assert decoding._beams(model, {"num_beams": 1, "generation_config": GenerationConfig(num_beams=2)}) == 1


def test_auto_stays_on_the_default_path_for_a_language_model_quantised_by_load_in(monkeypatch):
    from itune_hf.models.quantization import quantize_frozen_lm

    pytest.importorskip("bitsandbytes")
    model, _ = tiny(FAMILY_PRESETS["ituning"])
    monkeypatch.setattr(decoding, "_on_gpu", lambda captioner: True)
    assert resolve_decoding(model, "auto") == "fast"
    quantize_frozen_lm(model, "8bit")  # itune caption --load-in 8bit; transformers never compiles bitsandbytes
    assert resolve_decoding(model, "auto") == "default"


def test_auto_stays_on_the_default_path_for_an_offloaded_model_and_fast_refuses_padded_prompts(monkeypatch):
    model, inputs = tiny(FAMILY_PRESETS["ituning"])
    monkeypatch.setattr(decoding, "_on_gpu", lambda captioner: True)
    model.hf_device_map = {"vision_model": 0, "language_model": "cpu"}  # transformers does not compile these either
    assert resolve_decoding(model, "auto") == "default"
    model.hf_device_map = {"": 0}
    assert resolve_decoding(model, "auto") == "fast"
    padded = {**inputs, "decoder_attention_mask": torch.tensor([[1], [0]])}
    with pytest.raises(ValueError, match="decoder_attention_mask holds padding"):
        fast_generate(model, "fast", **padded)


def test_the_compiled_forward_gives_back_an_instance_forward_it_found(traced):
    model, _ = tiny(FAMILY_PRESETS["ituning"])
    hook = model.forward  # e.g. what accelerate's hooks put on the instance
    model.forward = hook
    with decoding.compiled_forward(model, "eager"):
        assert model.forward is not hook
    assert model.forward is hook


def test_new_batch_sizes_and_lengths_compile_a_bounded_number_of_graphs_with_the_default_captions(traced):
    """Automatic dynamic shapes: a long-lived pipeline sees many batch sizes and lengths; the compiled step must not
    hit dynamo's recompile limit (an error under a full graph) and must keep the default captions."""
    model, _ = tiny(FAMILY_PRESETS["ituning"])
    size = model.config.vision_config.image_size
    for num_beams in (1, 2):
        for batch, new_tokens in ((1, 3), (2, 5), (3, 3), (4, 5), (5, 4)):  # more shapes than the recompile limit
            pixel_values = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
            kwargs = dict(pixel_values=pixel_values, num_beams=num_beams, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens)  # fmt: skip
            assert torch.equal(fast_generate(model, "fast", **kwargs), model.generate(**kwargs))
    assert traced["unique_graphs"] <= 8


def test_the_pipeline_takes_the_fast_path_on_a_gpu_by_default_with_the_same_captions(traced, monkeypatch, tmp_path):
    from transformers import pipeline

    from itune_hf.presets import build_processor

    model, _ = tiny(FAMILY_PRESETS["ituning"])
    captioner = pipeline("image-to-text", model=model, processor=build_processor("itune-tiny-random"))
    images = [str(write_photo(tmp_path / f"{i}.png", color=(60 * i, 90, 30))) for i in range(2)]
    expected = captioner(images, num_beams=2, max_new_tokens=5)
    assert traced["unique_graphs"] == 0  # auto on the CPU: the default path
    monkeypatch.setattr(decoding, "_on_gpu", lambda captioner: True)
    assert captioner(images, num_beams=2, max_new_tokens=5) == expected
    assert traced["unique_graphs"] == 1
    assert captioner(images, num_beams=2, max_new_tokens=5, decoding="default") == expected
    with pytest.raises(ValueError, match="decoding='slow' is not one of auto, default, fast"):
        captioner(images, decoding="slow")
    preset = FAMILY_PRESETS["clipcap"]  # a family the fast path does not serve: refused when the pipeline is made
    with pytest.raises(ValueError, match="decoding='fast': a clipcap captioner's decode step does not trace"):
        pipeline("image-to-text", model=build_model(preset), processor=build_processor(preset), decoding="fast")


def test_itune_caption_decoding_flag(traced, captioner_dirs, tmp_path, capsys):
    images = [str(write_photo(tmp_path / f"{i}.png", color=(30, 60 * i, 90))) for i in range(3)]
    common = ["--model", str(captioner_dirs["full"]), "--num-beams", "1", "--max-new-tokens", "4", "--json"]
    captions = {}
    for path in ("default", "fast"):
        capsys.readouterr()
        assert main(["caption", *images, *common, "--batch-size", "2", "--decoding", path]) == 0
        captions[path] = [json.loads(line)["caption"] for line in capsys.readouterr().out.splitlines()]
    assert captions["fast"] == captions["default"] and len(captions["fast"]) == 3
    assert traced["unique_graphs"] == 2  # greedy: one graph per batch size (2, then the last image alone)
    capsys.readouterr()
    assert main(["caption", *images, "--model", "exported", "--runtime", "onnx", "--decoding", "fast"]) == 2
    assert capsys.readouterr().err.strip() == (
        "itune caption: error: --decoding fast compiles torch's decode step; drop it with --runtime onnx"
    )


def test_itune_eval_decoding_flag(traced, captioner_dirs, world, tmp_path, capsys):
    """`itune eval --decoding fast` writes the captions and scores of `--decoding default` (greedy and beam search),
    compiling one graph per batch shape; `fast` for a family whose step does not trace is refused before any work."""
    common = ["eval", "--model", str(captioner_dirs["full"]), "--data", str(world), "--split", "train",
              "--max-new-tokens", "4", "--metrics", "BLEU,CIDEr", "--batch-size", "4"]  # fmt: skip
    for beams in ("1", "2"):
        written = {}
        for path in ("default", "fast"):
            out = tmp_path / f"{path}-{beams}"
            graphs = traced["unique_graphs"]
            assert main([*common, "--num-beams", beams, "--decoding", path, "--output-dir", str(out)]) == 0
            assert (traced["unique_graphs"] > graphs) == (path == "fast")  # the default path compiles nothing
            written[path] = [(out / name).read_text() for name in ("captions.jsonl", "results.json")]
            written[path].append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
            report = json.loads((out / "metrics.json").read_text())
            assert (report["decoding"], report["decoded_on"]) == (path, path)
        assert written["fast"] == written["default"] and written["fast"][0].count("\n") > 4
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_processor

    preset = FAMILY_PRESETS["clipcap"]
    save_captioner(build_model(preset), tmp_path / "clipcap", processor=build_processor(preset))
    out = tmp_path / "refused"
    refused = ["--model", str(tmp_path / "clipcap"), "--decoding", "fast", "--output-dir", str(out)]
    assert main([*common, *refused]) == 2
    assert "--decoding fast: decoding='fast': a clipcap captioner's decode step" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_peft_model_decodes_on_the_fast_path_with_its_default_captions(traced, num_beams):
    """An I-Tuning adapter through PEFT (`get_peft_model`): the fast path compiles its base model's step."""
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig

    _, inputs = tiny(FAMILY_PRESETS["ituning"])
    base = build_model(FAMILY_PRESETS["ituning"], add_ituning_modules=False)
    torch.manual_seed(2)
    model = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    kwargs = dict(**inputs, num_beams=num_beams, max_new_tokens=5, min_new_tokens=5)
    expected = model.generate(**kwargs)
    assert torch.equal(fast_generate(model, "fast", **kwargs), expected)
    assert traced["unique_graphs"] == 1


@pytest.mark.parametrize("num_beams", [1, 3])
def test_the_compiled_step_reads_the_visual_keys_and_values_the_prefill_projected(monkeypatch, num_beams):
    """Re-projecting each image's visual tokens at every step would cost several times the LM's own work per token
    at the papers' sizes: the compiled step's graph holds no visual key/value projection, and with the memo
    withheld (`reuse_in_trace` off) it would."""
    from itune_hf.models.ituning.modeling_ituning import ITuningModule

    graphs = []

    def recording(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    monkeypatch.setattr(decoding, "BACKEND", recording)
    model, inputs = tiny(FAMILY_PRESETS["ituning"])
    kwargs = dict(**inputs, num_beams=num_beams, max_new_tokens=4, min_new_tokens=4)
    expected = model.generate(**kwargs)
    assert torch.equal(fast_generate(model, "fast", **kwargs), expected)
    (graph,) = graphs
    projections = [node.name for node in graph.graph.nodes if "k_proj" in node.name or "v_proj" in node.name]
    assert projections == []
    assert any("q_proj" in node.name for node in graph.graph.nodes)  # the modules are in the graph
    torch._dynamo.reset()
    monkeypatch.setattr(ITuningModule, "reuse_in_trace", False, raising=False)
    graphs.clear()
    original = ITuningModule.__setattr__

    def withheld(self, name, value):  # generate() cannot switch the reuse on: every step projects again
        original(self, name, False if name == "reuse_in_trace" else value)

    monkeypatch.setattr(ITuningModule, "__setattr__", withheld)
    assert torch.equal(fast_generate(model, "fast", **kwargs), expected)
    assert any("k_proj" in node.name for node in graphs[0].graph.nodes)
    torch._dynamo.reset()


def test_dropping_the_mask_of_ones_raises_no_padding_warning_which_the_lm_would_give(traced):
    """The LM warns "input_ids may be padded" when its input starts with its padding token and has no mask; the fast
    path dropped a mask of ones, so nothing is padded and that warning is a false alarm there (not elsewhere)."""
    import logging

    model, inputs = tiny(FAMILY_PRESETS["ituning"])
    assert inputs["decoder_input_ids"][0, 0] == model.language_model.config.pad_token_id
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)  # whatever the suite's verbosity
    try:
        logging.Logger.warning_once.cache_clear()  # transformers warns once per process
        fast_generate(model, "fast", **inputs, num_beams=1, max_new_tokens=3)
        assert not [record for record in records if "may be padded" in record.getMessage()]
        without_mask = {key: value for key, value in inputs.items() if key != "decoder_attention_mask"}
        logging.Logger.warning_once.cache_clear()  # the filtered call took the once
        model.generate(**without_mask, num_beams=1, max_new_tokens=3)  # the control: the LM's warning, unfiltered
        assert [record for record in records if "may be padded" in record.getMessage()]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize("settings", [{"num_beams": 1}, {"num_beams": 3}, {"num_beams": 3, "num_return_sequences": 2}])
def test_a_second_call_on_other_images_of_the_same_shapes_reads_its_own_visual_keys_and_values(traced, settings):
    """The compiled step reads the keys/values the call's own prefill projected: after images A, images B of the
    same shapes (the same graph, no recompile) get B's scores and captions, not A's. Scores, not only tokens: a tiny
    random captioner often writes the same tokens for any image, but its scores always depend on the image."""
    model, first = tiny(FAMILY_PRESETS["ituning"])
    _, second = tiny(FAMILY_PRESETS["ituning"], seed=1)
    kwargs = dict(**settings, max_new_tokens=6, min_new_tokens=6, output_scores=True, return_dict_in_generate=True)
    expected = [model.generate(**inputs, **kwargs) for inputs in (first, second)]
    assert not torch.allclose(expected[0].scores[-1], expected[1].scores[-1], rtol=1e-3, atol=1e-4)
    got = [fast_generate(model, "fast", **inputs, **kwargs) for inputs in (first, second)]
    for fast, default in zip(got, expected):
        assert torch.equal(fast.sequences, default.sequences)
        for step_fast, step_default in zip(fast.scores, default.scores, strict=True):
            torch.testing.assert_close(step_fast, step_default, rtol=1e-4, atol=1e-5)
    assert traced["unique_graphs"] == 1


def static_inputs_backend():
    """A torch.compile backend that runs the graph as traced, and the list where it keeps, for every step it runs, the
    tensors the graph marks as static inputs besides parameters (what CUDA graphs replay at the addresses they were
    recorded with: the static cache, I-Tuning's visual keys/values). Keeping them alive means a new tensor cannot come
    back at an old address by chance. (A function: generate deep-copies its compile config, and an object with it.)"""
    steps: list[list[torch.Tensor]] = []

    def backend(graph_module, example_inputs):
        placeholders = [node for node in graph_module.graph.nodes if node.op == "placeholder"]
        static = [i for i, node in enumerate(placeholders)
                  if node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")]  # fmt: skip

        def run(*args):
            tensors = (args[i] for i in static)
            steps.append([t for t in tensors if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)])
            return graph_module.forward(*args)

        return run

    return backend, steps


def addresses(steps: list[list[torch.Tensor]]) -> set[tuple[int, ...]]:
    return {tuple(tensor.data_ptr() for tensor in step) for step in steps}


GREEDY = dict(num_beams=1, max_new_tokens=5, min_new_tokens=5, output_scores=True, return_dict_in_generate=True)


def assert_fast_greedy_is_default(model, backend, inputs):
    """Greedy decoding of `inputs` on the fast path (compiled by `backend`) gives the default path's tokens and
    scores."""
    fast = fast_generate(model, "fast", backend=backend, **inputs, **GREEDY)
    default = model.generate(**inputs, **GREEDY)
    assert torch.equal(fast.sequences, default.sequences)
    for step_fast, step_default in zip(fast.scores, default.scores, strict=True):
        torch.testing.assert_close(step_fast, step_default, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAST_DECODING_FAMILIES)
def test_greedy_calls_of_one_shape_replay_at_the_first_calls_addresses_each_with_its_own_images(traced, family):
    """CUDA graphs (the greedy fast path on a GPU) read their static inputs at the addresses they were recorded with;
    new tensors at every generate call would record the graph again at every call. Calls on images A, B, A: every
    step of every call sees the same static tensors, and each call gets its own images' scores (the pooled cache is
    reset; the cross-attention cache and the visual keys/values are rewritten)."""
    backend, steps = static_inputs_backend()
    model, first = tiny(FAMILY_PRESETS[family])
    _, second = tiny(FAMILY_PRESETS[family], seed=1)
    for inputs in (first, second, first):
        assert_fast_greedy_is_default(model, backend, inputs)
    assert len(steps) == 3 * 4 and len(steps[0]) > 0
    assert len(addresses(steps)) == 1
    if family == "ituning":  # the modules' key/value buffers are among the static inputs
        buffers = [kv for module in model.ituning.values() for pair in module._kv_static.values() for kv in pair]
        assert buffers and all(any(kv is tensor for tensor in steps[-1]) for kv in buffers)


def test_each_recent_shape_keeps_its_addresses_and_release_frees_them(traced):
    """A caller alternating batch sizes (a server's requests) replays each at its own addresses; `POOLED_SHAPES`
    shapes are kept; `release_fast_decoding` frees the caches and the key/value buffers, and decoding goes on."""
    backend, steps = static_inputs_backend()
    model, pair = tiny(FAMILY_PRESETS["ituning"])
    single = {key: value[:1] for key, value in pair.items()}
    for inputs in (pair, single, pair, single):
        assert_fast_greedy_is_default(model, backend, inputs)
    by_batch = {}
    for step in steps:
        by_batch.setdefault(next(tensor.shape[0] for tensor in step if tensor.dim() == 4), []).append(step)
    assert sorted(by_batch) == [1, 2] and all(len(addresses(steps)) == 1 for steps in by_batch.values())
    assert len(vars(model)[decoding._POOL_ATTRIBUTE]) == 2
    decoding.release_fast_decoding(model)
    assert decoding._POOL_ATTRIBUTE not in vars(model)
    assert all(not module._kv_static for module in model.ituning.values())
    assert_fast_greedy_is_default(model, backend, pair)
    assert not addresses(steps[-4:]) & addresses(by_batch[2])  # new tensors after the release


def test_the_oldest_shape_is_dropped_past_the_pool_size(traced, monkeypatch):
    """With room for one shape, batches of 2, 1, 2: the third call cannot replay at the first call's addresses, and
    the pool and the key/value buffers hold one shape each."""
    from itune_hf.models.ituning.modeling_ituning import ITuningModule

    monkeypatch.setattr(decoding, "POOLED_SHAPES", 1)
    monkeypatch.setattr(ITuningModule, "static_shapes_kept", 1)
    backend, steps = static_inputs_backend()
    model, pair = tiny(FAMILY_PRESETS["ituning"])
    single = {key: value[:1] for key, value in pair.items()}
    for inputs in (pair, single, pair):
        assert_fast_greedy_is_default(model, backend, inputs)
        assert len(vars(model)[decoding._POOL_ATTRIBUTE]) == 1
        assert all(len(module._kv_static) == 1 for module in model.ituning.values())
    assert not addresses(steps[:4]) & addresses(steps[8:])


def test_a_cache_handed_back_to_the_caller_is_not_reset_by_the_next_call(traced):
    """`return_dict_in_generate=True` hands the call's static cache back: a later call of the same shapes must not
    reset and overwrite what the caller holds."""
    backend, _ = static_inputs_backend()
    model, first = tiny(FAMILY_PRESETS["ituning"])
    _, second = tiny(FAMILY_PRESETS["ituning"], seed=1)
    held = fast_generate(model, "fast", backend=backend, **first, **GREEDY).cache.self_attention_cache
    keys = [layer.keys.clone() for layer in held.layers]
    assert any(bool(key.any()) for key in keys)
    assert_fast_greedy_is_default(model, backend, second)
    assert all(torch.equal(layer.keys, key) for layer, key in zip(held.layers, keys, strict=True))


def test_a_call_outside_inference_mode_after_one_inside_it_decodes(traced):
    """Tensors made under `torch.inference_mode` cannot be written outside it: a pooled cache or key/value buffer of
    an inference-mode call is not reused by a `no_grad` call (itune eval's) of the same shapes."""
    backend, _ = static_inputs_backend()
    model, inputs = tiny(FAMILY_PRESETS["ituning"])
    with torch.inference_mode():
        fast_generate(model, "fast", backend=backend, **inputs, **GREEDY)
    with torch.no_grad():
        assert_fast_greedy_is_default(model, backend, inputs)
    assert {key.inference for key in vars(model)[decoding._POOL_ATTRIBUTE]} == {True, False}  # one cache each
