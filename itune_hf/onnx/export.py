"""Exporting an I-Tuning or XGPT captioner to ONNX for deployment (`itune export --format onnx`).

optimum's exporters describe models by their transformers architecture, and a captioner whose frozen LM carries
I-Tuning modules beside its feed-forward blocks, or XGPT's shared encoder-decoder stack, is none of theirs; the export
therefore goes through `torch.onnx.export(..., dynamo=True)` (torch.export, then ONNX through onnxscript), which takes
these models as they are. Two graphs and the files to run them (`itune_hf.onnx.runtime` reads them; what each family's
graphs compute: `itune_hf.onnx.graphs`):

- the image graph, `vision.onnx` (I-Tuning: the tower's tokens as the LM reads them) or `encoder.onnx` (XGPT: the
  regions encoded into the memory, and the memory's keys and values for each decoder layer), once per image;
- `decoder.onnx`: one decoding step with its KV cache: `input_ids (B, T)`, `attention_mask (B, P + T)`, the image
  graph's outputs, `past_keys` and `past_values` `(layers, B, kv_heads, P, head_dim)` -> `logits (B, vocab)` of the
  last position and `present_keys`/`present_values` `(layers, B, kv_heads, P + T, head_dim)`. The first step passes
  an empty cache (`P = 0`);
- `onnx_config.json` (layers, cache shape, special tokens, the graphs the runtime runs and what they exchange, what
  exported it) and the processor's files.

Two options, for I-Tuning (whose LM is frozen; XGPT is trained whole and exports in fp32), change what the graphs
compute (both recorded in `onnx_config.json`, which the runtime follows):

- `vocabulary=token_ids`, the **vocabulary shortlist** of `itune_hf.inference` (`itune caption --vocabulary`): the
  decoder's LM head is sliced to these tokens at export time and its inputs and logits are in the shortlist's ids
  (`vocabulary` in the config: shortlist id `i` is tokenizer id `vocabulary[i]`; the runtime translates both ways);
- `quantize="int8"`: onnxruntime's dynamic quantisation (`quantize_dynamic`: weights int8 in a 7-bit range per
  output channel, activations per tensor at run time) of the decoder's frozen-LM weight products, LM head included, into
  `decoder.int8.onnx` beside `decoder.onnx`. As `itune caption --int8` does, the I-Tuning modules (small, trained),
  the products of two activations (attention) and the vision tower (run once per image, not per token) stay in
  float. The runtime runs the int8 decoder unless asked for the fp32 one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONFIG_NAME = "onnx_config.json"
DECODER_FILE, DECODER_INT8_FILE = "decoder.onnx", "decoder.int8.onnx"
FORMAT = "itune-onnx"
#: 2: `graphs` (the image graph's file, its inputs and outputs, the decoder's file), `quantize` and `vocabulary`
FORMAT_VERSION = 2
QUANTIZE = ("int8",)
DECODER_OUTPUTS = ("logits", "present_keys", "present_values")
#: torch's dynamo exporter implements its operators at opset 18; a lower opset is a conversion it cannot do
LOWEST_OPSET = 18


def highest_opset() -> int:
    """The highest opset the installed exporter converts graphs to: onnxscript's version converter's, else onnx's."""
    import onnx

    try:
        from onnxscript.version_converter import _version_converter
    except ImportError:
        return onnx.defs.onnx_opset_version()
    return min(getattr(_version_converter, "SUPPORTED_MAX_ONNX_OPSET", 10**6), onnx.defs.onnx_opset_version())


def check_opset(opset: int | None) -> None:
    """Refuse an opset the exporter cannot write (it would write its own and say so only in a warning).

    Args:
        opset: The requested opset, or None for the exporter's default.

    Raises:
        ValueError: for an opset below `LOWEST_OPSET` or above `highest_opset()`.
    """
    if opset is not None and not LOWEST_OPSET <= opset <= highest_opset():
        raise ValueError(
            f"opset {opset}: the exporter writes opsets {LOWEST_OPSET} to {highest_opset()} here (torch's operators "
            f"are at {LOWEST_OPSET}; onnxscript converts up to {highest_opset()}): pass one of those, or leave it out"
        )


def _check_written_opset(directory: Path, files: Iterable[str], opset: int) -> None:
    """Each written graph is at the requested opset; the graphs are removed otherwise (the exporter keeps its own
    opset when a conversion fails, and says so only in a warning)."""
    import onnx

    written = {
        name: next(
            i.version for i in onnx.load(directory / name, load_external_data=False).opset_import if not i.domain
        )
        for name in files
    }
    if any(version != opset for version in written.values()):
        for name in written:
            for path in (directory / name, directory / f"{name}.data"):
                path.unlink(missing_ok=True)
        raise ValueError(
            f"opset {opset}: the exporter could not convert the graphs to it (they came out at opset "
            f"{sorted(set(written.values()))}; removed): pass a lower opset, or leave it out"
        )


#: Generation settings the runtime does not apply (it decodes greedily or by beam search with length penalty 1 and
#: `early_stopping=False`, until the end token or the length), each with the value that changes nothing (the one
#: transformers applies when it is unset, None): a model whose generation config sets one otherwise is refused, as
#: its ONNX captions would differ from its own.
UNAPPLIED_GENERATION_SETTINGS: dict[str, Any] = {
    "do_sample": False, "num_return_sequences": 1, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "length_penalty": 1.0, "early_stopping": False,
    "min_length": 0, "min_new_tokens": None, "bad_words_ids": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None, "sequence_bias": None,
    "num_beam_groups": 1, "diversity_penalty": 0.0, "exponential_decay_length_penalty": None,
    "renormalize_logits": False, "stop_strings": None, "max_time": None, "penalty_alpha": None,
}  # fmt: skip


def unapplied_generation_settings(settings: Any) -> dict[str, Any]:
    """The settings among `UNAPPLIED_GENERATION_SETTINGS` that `settings` (a `GenerationConfig`, or keyword
    arguments of `generate`) sets to a value that changes the captions.

    Args:
        settings: A `GenerationConfig` or a dict of `generate` keyword arguments.
    """
    given = settings if isinstance(settings, dict) else {name: getattr(settings, name, None) for name in
                                                         UNAPPLIED_GENERATION_SETTINGS}  # fmt: skip
    return {
        name: value
        for name, value in given.items()
        if name in UNAPPLIED_GENERATION_SETTINGS and value is not None and value != UNAPPLIED_GENERATION_SETTINGS[name]
    }


def check_exportable(model: Any, *, quantize: str | None = None, vocabulary: bool = False) -> None:
    """Refuse, saying why and what to use instead, a captioner or an option the ONNX export does not cover.

    Args:
        model: A loaded captioner.
        quantize: The `quantize` option to be used.
        vocabulary: Whether a vocabulary shortlist is to be used.

    Raises:
        ValueError: for a model of a family without ONNX graphs; an XGPT model that reads boxes or precomputed
            regions; int8 or a shortlist for a model whose LM is not frozen; a generation config with a setting the
            runtime does not apply (`UNAPPLIED_GENERATION_SETTINGS`).
    """
    from ..models import families, family_of

    family = family_of(model)
    if not family.exports_onnx:
        exported = " and ".join(f.title for f in families().values() if f.exports_onnx)
        raise ValueError(
            f"ONNX export covers {exported} captioners; {family.title} ({type(model).__name__}) is not exported yet: "
            "caption it with the torch runtime (itune caption --model DIR)"
        )
    if getattr(model.config, "visual_source", "grid") != "grid":  # XGPT's boxes or precomputed regions
        raise ValueError(
            f"ONNX export covers XGPT models that read their images on a grid (visual_source='grid'); this one reads "
            f"{model.config.visual_source!r} (boxes or region features given with each image, which itune caption "
            "--runtime onnx cannot pass): caption it with the torch runtime (itune caption --model DIR)"
        )
    unapplied = unapplied_generation_settings(model.generation_config)
    if unapplied:
        given = ", ".join(f"{name}={value!r}" for name, value in unapplied.items())
        raise ValueError(
            f"its generation_config.json sets {given}, which the ONNX runtime does not apply (it decodes greedily or "
            "by beam search, length penalty 1, num_beams and max_new_tokens only), so its captions would differ from "
            "the model's: reset them to transformers' defaults in generation_config.json, or caption with the torch "
            "runtime"
        )
    if not family.quantizes_frozen_lm and (quantize or vocabulary):  # a family without a frozen LM
        raise ValueError(
            f"--quantize and --vocabulary act on I-Tuning's frozen LM; {family.title} is trained whole and exports in "
            "fp32 only: export without them"
        )


def export_onnx(
    model: Any,
    processor: Any,
    output_dir: str | os.PathLike,
    *,
    opset: int | None = None,
    quantize: str | None = None,
    vocabulary: Iterable[int] | None = None,
) -> Path:
    """Write the image graph, `decoder.onnx`, `onnx_config.json` and the processor's files of a captioner.

    Args:
        model: A loaded `ITuningForCaptioning` (native or with its modules built in) or `XGPTForCaptioning` (reading
            its images on a grid); it is put in fp32 on the CPU in eval mode (in place) before the export, and gets
            the shortlist (in place) when `vocabulary` is given.
        processor: Its processor (saved beside the graphs).
        output_dir: The directory to write (created if needed).
        opset: ONNX opset (default: the exporter's), from `LOWEST_OPSET` to `highest_opset()`; every graph written
            is checked to be at it.
        quantize: `"int8"`: also write `decoder.int8.onnx` (see the module docstring), which the runtime then runs
            (I-Tuning only).
        vocabulary: Token ids the captions may use (a shortlist, e.g. `itune_hf.inference.caption_vocabulary`): the
            decoder's LM head is restricted to them (I-Tuning only). Default: the whole vocabulary.

    Returns:
        The directory.

    Raises:
        ValueError: for what `check_exportable` refuses, an unknown `quantize`, an opset `check_opset` refuses or
            the exporter could not convert to, or a vocabulary the shortlist refuses (empty, outside the LM's,
            without the model's special tokens).
    """
    from ..inference import optimize_for_inference

    check_exportable(model, quantize=quantize, vocabulary=vocabulary is not None)
    check_opset(opset)
    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(f"quantize={quantize!r}: choose one of {', '.join(QUANTIZE)} (or None for fp32 only)")
    model = model.float().cpu().eval()
    if vocabulary is not None:
        optimize_for_inference(model, vocabulary=vocabulary)  # the shortlist; fp32, so otherwise bit-exact
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    remove_previous_export(directory)
    layout, graphs = _export_graphs(model, processor, directory, opset)
    if opset is not None:
        _check_written_opset(directory, (graphs["image"], graphs["decoder"]), opset)
    if quantize == "int8":
        quantize_decoder(directory / DECODER_FILE, directory / DECODER_INT8_FILE)
        graphs["decoder"] = DECODER_INT8_FILE
    shortlist = getattr(model, "generation_translator", None)
    _write_config(model, directory, layout, graphs=graphs, quantize=quantize,
                  vocabulary=None if shortlist is None else shortlist.full_ids.tolist())  # fmt: skip
    processor.save_pretrained(directory)
    return directory


def remove_previous_export(directory: Path) -> list[str]:
    """Remove the config and graphs of an earlier export into `directory` (the config first: a graph of it left beside
    a new export's would be run, or read as the new one's); returns the names removed.

    Args:
        directory: The export's directory.
    """
    from ..utils.files import read_json
    from .graphs import ENCODER_FILE, VISION_FILE

    config = directory / CONFIG_NAME
    if not config.is_file():
        return []
    try:
        graphs = read_json(config, "the earlier ONNX export's config").get("graphs", {})
    except Exception:  # a damaged config: the known names still go
        graphs = {}
    named = [graphs.get(key) for key in ("image", "decoder")] if isinstance(graphs, dict) else []
    names = {DECODER_FILE, DECODER_INT8_FILE, VISION_FILE, ENCODER_FILE, *(n for n in named if isinstance(n, str))}
    config.unlink()
    removed = [CONFIG_NAME]
    for name in sorted(names):
        if Path(name).name != name:  # a config naming a file elsewhere: nothing outside the directory goes
            continue
        for path in (directory / name, directory / f"{name}.data"):
            if path.is_file():
                path.unlink()
                removed.append(path.name)
    return removed


def _start_token(model: nn.Module) -> int:
    """The decoder start token as the decoder reads it (its shortlist id under a shortlist)."""
    start = model.config.decoder_start_token_id
    shortlist = getattr(model, "generation_translator", None)
    if shortlist is None:
        return start
    return int(shortlist.to_short(torch.tensor([start]), "decoder_start_token_id")[0])


def _export_graphs(model: nn.Module, processor: Any, directory: Path, opset: int | None) -> tuple[dict, dict]:
    """Write the image graph and `decoder.onnx`; returns the cache's layout and the graphs, as the config has them."""
    from torch.export import Dim

    from .graphs import graphs_for

    graphs = graphs_for(model)
    image = _sample_pixels(processor, batch=2)
    options = {"dynamo": True, "optimize": True, "verbose": False, **({"opset_version": opset} if opset else {})}
    batch = Dim("batch")
    torch.onnx.export(
        graphs.image(model).eval(), (image,), str(directory / graphs.image_file), input_names=["pixel_values"],
        output_names=list(graphs.image_outputs), dynamic_shapes={"pixel_values": {0: batch}}, **options,
    )  # fmt: skip
    with torch.no_grad():
        encoded = graphs.image(model).eval()(image)
    encoded = encoded if isinstance(encoded, tuple) else (encoded,)
    start = _start_token(model)
    num_layers, kv_heads, head_dim = graphs.cache_shape(model, encoded, start)
    sample = _decoder_sample(encoded, num_layers, kv_heads, head_dim, start)
    cache_axes = {1: batch, 3: Dim("past")}
    shapes = {
        "input_ids": {0: batch, 1: Dim("new")}, "attention_mask": {0: batch, 1: Dim("total")},
        **{name: {0: batch} for name in graphs.image_outputs}, "past_keys": cache_axes, "past_values": cache_axes,
    }  # fmt: skip
    torch.onnx.export(
        graphs.decoder(model, num_layers).eval(), sample, str(directory / DECODER_FILE), input_names=list(shapes),
        output_names=list(DECODER_OUTPUTS), dynamic_shapes=shapes, **options,
    )  # fmt: skip
    layout = {"num_layers": num_layers, "kv_heads": kv_heads, "head_dim": head_dim}
    files = {"image": graphs.image_file, "image_inputs": ["pixel_values"], "image_outputs": list(graphs.image_outputs),
             "decoder": DECODER_FILE}  # fmt: skip
    return layout, files


def _write_config(model: nn.Module, directory: Path, layout: dict[str, int], **options: Any) -> None:
    """`onnx_config.json`: the cache's layout, the special tokens (tokenizer ids), the graphs to run, the options."""
    from ..models import family_of
    from ..utils.files import atomic_write_json
    from ..utils.versions import __version__

    generation = model.generation_config
    atomic_write_json(
        directory / CONFIG_NAME,
        {
            "format": FORMAT, "format_version": FORMAT_VERSION, "family": family_of(model).name, **layout,
            "decoder_start_token_id": model.config.decoder_start_token_id,
            "eos_token_id": generation.eos_token_id, "pad_token_id": generation.pad_token_id,
            "num_beams": generation.num_beams,
            # XGPT sets max_length (prompt included): the runtime takes the prompt's tokens off it
            "max_new_tokens": generation.max_new_tokens,
            "max_length": None if generation.max_new_tokens else generation.max_length,
            "max_positions": _positions(getattr(model.config, "text_config", model.config)), **options,
            "exported_from": str(getattr(model, "name_or_path", "") or ""),
            "exported_with": {"itune_hf": __version__, "torch": torch.__version__},
        },
        indent=1,
    )  # fmt: skip


def quantize_decoder(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Write the int8 version of an exported `decoder.onnx` (onnxruntime's dynamic quantisation; see the module
    docstring for what is quantised).

    Dynamic quantisation covers a `MatMul` over a weight; GPT-2's `Conv1D` layers export as `Gemm` and a tied LM
    head as a `MatMul` over the transposed embedding, so these are first rewritten as such a `MatMul`
    (`_weight_products`), and quantised as an `nn.Linear`'s is.

    Args:
        source: The fp32 decoder graph.
        target: Where the int8 graph goes (its weights beside it, in `<name>.data`).

    Returns:
        `target`.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source))
    _weight_products(graph)
    weights = {init.name for init in graph.graph.initializer}
    nodes = [node.name for node in graph.graph.node if node.op_type == "MatMul" and node.input[1] in weights
             and not _in_ituning_module(node)]  # fmt: skip
    # reduce_range: 7-bit weights. x86 CPUs without VNNI (AVX2 only) multiply uint8 activations by int8 weights in
    # pairs summed into int16 (VPMADDUBSW), which saturates at full range and turns a decoder's captions into nonsense;
    # 7-bit weights stay clear of it (benchmarks/RESULTS.md, "int8 and the shortlist in ONNX"). A graph may run on any
    # CPU, so it is quantised for the one without VNNI.
    quantize_dynamic(
        graph, str(target), op_types_to_quantize=["MatMul"], nodes_to_quantize=nodes, per_channel=True,
        reduce_range=True, weight_type=QuantType.QInt8, use_external_data_format=True,
    )  # fmt: skip
    mode = Path(source).stat().st_mode & 0o777  # onnx writes external data owner-only (0600): as the fp32 graph's
    for path in (Path(target), Path(f"{target}.data")):
        if path.is_file():
            path.chmod(mode)
    return Path(target)


def _in_ituning_module(node) -> bool:
    """Whether a node computes inside an I-Tuning module (the exporter records each node's module path)."""
    scopes = next((prop.value for prop in node.metadata_props if prop.key == "pkg.torch.onnx.name_scopes"), "")
    return ".ituning." in scopes


def _weight_products(graph) -> None:
    """Make each product of an activation and a weight a `MatMul` whose second input is the weight itself, in place:
    `Gemm(A, W[, C])` (alpha = beta = 1, neither input transposed) becomes `MatMul(A, W)` (+ `Add(C)`), and
    `MatMul(A, Transpose(W))` (a tied LM head: the input embedding, transposed) reads a transposed copy of `W`."""
    from onnx import numpy_helper

    weights = {init.name: init for init in graph.graph.initializer}
    made = {output: node for node in graph.graph.node for output in node.output}
    nodes = []
    for node in graph.graph.node:
        source = made.get(node.input[1]) if node.op_type == "MatMul" else None
        if source is not None and source.op_type == "Transpose" and source.input[0] in weights:
            transposed = numpy_helper.to_array(weights[source.input[0]]).T.copy()
            graph.graph.initializer.append(numpy_helper.from_array(transposed, f"{source.input[0]}_transposed"))
            node.input[1] = f"{source.input[0]}_transposed"
        nodes.extend(_gemm_nodes(node, weights) if node.op_type == "Gemm" else [node])
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)


def _gemm_nodes(node, weights) -> list:
    """A plain `Gemm` over a weight as `MatMul` (+ `Add`); any other `Gemm` as it is."""
    from onnx import helper

    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    defaults = (("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", 0))
    if not all(attributes.get(name, value) == value for name, value in defaults) or node.input[1] not in weights:
        return [node]
    biased = len(node.input) > 2 and node.input[2]
    product = f"{node.output[0]}_matmul" if biased else node.output[0]
    matmul = helper.make_node("MatMul", node.input[:2], [product], name=f"{node.name}_matmul")
    matmul.metadata_props.extend(node.metadata_props)
    if not biased:
        return [matmul]
    return [matmul, helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_add")]


def _positions(text_config) -> int | None:
    """How many positions the LM has (None: unbounded, e.g. rotary positions without a recorded limit)."""
    positions = getattr(text_config, "n_positions", None) or getattr(text_config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) else None


def _sample_pixels(processor: Any, batch: int) -> torch.Tensor:
    """`batch` grey images through the processor (their size is the processor's; batch > 1 keeps the axis free)."""
    from PIL import Image

    images = [Image.new("RGB", (64, 64), (128 + 20 * i, 128, 128)) for i in range(batch)]
    return processor(images=images, return_tensors="pt")["pixel_values"]


def _decoder_sample(encoded: tuple, num_layers: int, kv_heads: int, head_dim: int, start: int) -> tuple:
    """Inputs of one decoding step for the export: 2 new tokens after a cache of 3 (sizes above 1, so that no axis
    is specialised), reading the image graph's outputs `encoded`."""
    batch, new, past = encoded[0].shape[0], 2, 3
    ids = torch.full((batch, new), start, dtype=torch.long)
    mask = torch.ones(batch, past + new, dtype=torch.long)
    cache = torch.zeros(num_layers, batch, kv_heads, past, head_dim, dtype=torch.float32)
    return ids, mask, *encoded, cache, cache.clone()


__all__ = ["CONFIG_NAME", "DECODER_FILE", "DECODER_INT8_FILE", "FORMAT", "QUANTIZE",
           "check_exportable", "export_onnx", "quantize_decoder"]  # fmt: skip
