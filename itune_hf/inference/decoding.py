"""The decoding path of a captioner: transformers' default, or the fast path for GPUs, chosen by device.

`generate` decodes with a dynamic KV cache: every step runs the model eagerly, and at batch 1 on a GPU the Python and
the launch of hundreds of small kernels cost far more than reading the weights (benchmarks/RESULTS.md, "Where the GPU
step's time goes": 73x the bandwidth floor on an H200, host-bound). The **fast path** removes that overhead:

* a static cache (`cache_implementation="static"`): fixed shapes, so one compiled step serves every step;
* greedy search and sampling: `generate` compiles the decode step itself, with CUDA graphs (its `CompileConfig`,
  inductor's "reduce-overhead" mode) on a GPU;
* beam search: `generate` compiles no beam-search step (transformers 5; `tests/models/test_modeling.py` fails if that
  changes), so the model's forward is compiled here, with a full graph and static shapes: two graphs, the prefill and
  the decode step. Inductor's default mode, no CUDA graphs: each beam reorder gives the cache new tensors;
* the visual keys/values are projected once per image on both paths (I-Tuning's `VisionContext`).

`decoding="auto"` (the default of `itune caption` and of the `image-to-text` pipeline) takes the fast path for a
model on a CUDA device whose family traces its step in one graph (`FAST_DECODING_FAMILIES`), and the default path
everywhere else: on the CPU `torch.compile` gave no speed-up (docs/performance.md), so CPU captioning is unchanged.
Should compiling fail on a machine (no Triton, an old driver), `"auto"` warns once with the reason and decodes on
the default path from then on; `"fast"` raises instead. The first call compiles (seconds to a minute); later calls
with the same batch size and caption length reuse the graphs.

In fp32 the fast path gives the default path's captions (tested on the CPU with a traced step, every family in
`FAST_DECODING_FAMILIES`, greedy and beam search); in bf16 compiled kernels may round differently. The fast path
drops a caption mask that masks nothing: `generate` widens a 2-D mask each step, which would give the compiled step
a new shape at every token. A batch of prompts of different lengths (padding in the mask) decodes on the default path
under `"auto"`; under `"fast"` it recompiles the step for each new width.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import contextmanager
from typing import Any

import torch

DECODINGS = ("auto", "default", "fast")
BACKEND = "inductor"  #: torch.compile's backend for the fast path (the tests trace with "eager")
#: model types whose decode step traces in one graph under a static cache (tests/test_decoding.py checks each
#: registered family: these trace and give the default captions, the others do not trace)
FAST_DECODING_FAMILIES = ("ituning", "xgpt", "crossattn")
_FAILED_ATTRIBUTE = "_itune_fast_decoding_failed"


def _captioner(model) -> torch.nn.Module:
    """The model that decodes: a `PeftModel`'s base model, else `model`."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def _on_gpu(captioner: torch.nn.Module) -> bool:
    return next(captioner.parameters()).device.type == "cuda"


def fast_decoding_supported(model) -> bool:
    """Whether `model`'s family traces its decode step in one graph (`FAST_DECODING_FAMILIES`).

    Args:
        model: A captioner, or a `PeftModel` over one (a torch module: not an onnxruntime captioner).
    """
    captioner = _captioner(model)
    config = getattr(captioner, "config", None)
    return isinstance(captioner, torch.nn.Module) and getattr(config, "model_type", None) in FAST_DECODING_FAMILIES


def resolve_decoding(model, decoding: str = "auto") -> str:
    """The path `model` decodes on: `"fast"` or `"default"`.

    Args:
        model: A captioner (or a `PeftModel` over one), on the device it runs on.
        decoding: `"auto"` (the fast path on a CUDA device for a family in `FAST_DECODING_FAMILIES`, unless it
            failed to compile there before; else the default path), `"default"` or `"fast"`.

    Raises:
        ValueError: An unknown `decoding`, or `"fast"` for a family whose step does not trace in one graph.
    """
    if decoding not in DECODINGS:
        raise ValueError(f"decoding={decoding!r} is not one of {', '.join(DECODINGS)}")
    if decoding == "default":
        return "default"
    captioner = _captioner(model)
    if not fast_decoding_supported(model):
        if decoding == "fast":
            model_type = getattr(getattr(captioner, "config", None), "model_type", type(captioner).__name__)
            raise ValueError(
                f"decoding='fast': a {model_type} captioner's decode step does not trace in one graph (the fast path "
                f"covers {', '.join(FAST_DECODING_FAMILIES)}); use decoding='default'"
            )
        return "default"
    if decoding == "fast":
        return "fast"
    return "fast" if _on_gpu(captioner) and not getattr(captioner, _FAILED_ATTRIBUTE, None) else "default"


@functools.cache
def _compiled_forward(model_class: type, backend: str):
    """`model_class.forward` compiled once per class and backend: full graph (a break is an error), static shapes."""
    return torch.compile(model_class.forward, backend=backend, fullgraph=True, dynamic=False)


@contextmanager
def compiled_forward(model, backend: str = BACKEND):
    """`model`'s forward compiled for the duration (beam search's fast path: `generate` compiles no beam-search
    step); the eager forward is back afterwards.

    Args:
        model: A captioner of a family in `FAST_DECODING_FAMILIES`.
        backend: `torch.compile`'s backend ("eager" traces without compiling, as the tests do).
    """
    model.forward = functools.partial(_compiled_forward(type(model), backend), model)
    try:
        yield model
    finally:
        del model.forward  # the instance attribute: the class's forward again


def _without_full_masks(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """`kwargs` without a caption mask that masks nothing (the processors give one with every batch); None when a
    mask holds padding (prompts of different lengths). `generate` widens a given 2-D mask by one column each step, a
    new shape for the compiled step each time; without it the model masks its static cache itself."""
    mask = kwargs.get("decoder_attention_mask")
    if not isinstance(mask, torch.Tensor):
        return dict(kwargs)
    if not bool(mask.all()):
        return None
    return {key: value for key, value in kwargs.items() if key != "decoder_attention_mask"}


def _beams(model, kwargs: dict[str, Any]) -> int:
    config = kwargs.get("generation_config") or _captioner(model).generation_config
    return int(kwargs.get("num_beams") or getattr(config, "num_beams", 1) or 1)


def _generate_fast(model, backend: str, kwargs: dict[str, Any]):
    from transformers import CompileConfig

    captioner = _captioner(model)
    kwargs = {"cache_implementation": "static", **kwargs}
    if _beams(model, kwargs) > 1:
        with compiled_forward(captioner, backend):
            return model.generate(**{"disable_compile": True, **kwargs})
    mode = "reduce-overhead" if _on_gpu(captioner) and backend == "inductor" else None  # CUDA graphs on a GPU
    config = CompileConfig(backend=backend, fullgraph=True, mode=mode)
    config._compile_all_devices = True  # generate() compiles on GPUs only unless told; "fast" was asked for
    return model.generate(**{"compile_config": config, **kwargs})


def fast_generate(model, decoding: str = "auto", *, backend: str | None = None, **kwargs):
    """`model.generate(**kwargs)` on the decoding path `decoding` resolves to (`resolve_decoding`).

    Args:
        model: A captioner (or a `PeftModel` over one), on the device it runs on.
        decoding: `"auto"`, `"default"` or `"fast"` (see the module's docstring).
        backend: `torch.compile`'s backend for the fast path (default: `BACKEND`, inductor).
        **kwargs: `generate`'s arguments (inputs, `num_beams`, `max_new_tokens`, ...); a `cache_implementation` or
            `compile_config` given here wins over the fast path's.

    Returns:
        What `model.generate` returns.

    Raises:
        ValueError: As `resolve_decoding`.
        torch._dynamo.exc.TorchDynamoException: Compiling failed with `decoding="fast"` (with `"auto"` the
            captions come from the default path, after one warning).
    """
    path = resolve_decoding(model, decoding)
    if path == "fast":
        unpadded = _without_full_masks(kwargs)
        if unpadded is None and decoding == "auto":
            path = "default"  # padded prompts: the mask's width would change the compiled step's shapes every step
    if path == "default":
        return model.generate(**kwargs)
    try:
        return _generate_fast(model, backend or BACKEND, kwargs if unpadded is None else unpadded)
    except torch._dynamo.exc.TorchDynamoException as error:
        if decoding == "fast":
            raise
        setattr(_captioner(model), _FAILED_ATTRIBUTE, f"{type(error).__name__}: {str(error).splitlines()[0]}")
        warnings.warn(
            f"the fast decoding path failed to compile here ({getattr(_captioner(model), _FAILED_ATTRIBUTE)}); "
            "captioning on the default path from now on (decoding='default' skips the attempt)",
            RuntimeWarning,
            stacklevel=2,
        )
        return model.generate(**kwargs)


__all__ = [
    "DECODINGS",
    "FAST_DECODING_FAMILIES",
    "compiled_forward",
    "fast_decoding_supported",
    "fast_generate",
    "resolve_decoding",
]
