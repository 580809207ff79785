"""The decoding path of a captioner: transformers' default, or the fast path for GPUs, chosen by device.

`generate` decodes with a dynamic KV cache: every step runs the model eagerly, and at batch 1 on a GPU the Python and
the launch of hundreds of small kernels cost far more than reading the weights (benchmarks/RESULTS.md, "Where the GPU
step's time goes": 73x the bandwidth floor on an H200, host-bound). The **fast path** removes that overhead:

* a static cache (`cache_implementation="static"`): fixed shapes, so one compiled step serves every step;
* greedy search and sampling: `generate` compiles the decode step itself, with CUDA graphs (its `CompileConfig`,
  inductor's "reduce-overhead" mode) on a GPU;
* beam search: `generate` compiles no beam-search step (transformers 5; `tests/models/test_modeling.py` fails if that
  changes), so the model's forward is compiled here with a full graph, for the decode step (the prefill runs eagerly,
  as in `generate`'s greedy path). Inductor's default mode, no CUDA graphs: each beam reorder gives the cache new
  tensors;
* I-Tuning's visual keys/values are projected once per image, by the eager prefill, and read by the compiled steps
  (`ITuningModule.reuse_in_trace`); re-projecting them at every step would cost several times the LM's own work per
  token at the papers' sizes (GPT-2 large: 13.9 GFLOP per image per step against 1.55 per sequence).

* greedy and sampling calls replay at stable addresses: CUDA graphs read their static inputs (the static cache,
  I-Tuning's visual keys/values) where they were recorded, so a call of the shapes of one of the last `POOLED_SHAPES`
  calls gets that call's static cache back, reset in place (an output that returns it gets a copy), and I-Tuning copies
  its keys/values into buffers kept per shape (`_static_inputs`); `release_fast_decoding` frees them.

Shapes are static at first and become dynamic where a later call changes them (dynamo's automatic dynamic shapes:
another batch size, caption length or prompt length), so a long-lived pipeline compiles a bounded number of graphs.

`decoding="auto"` (the default of `itune caption`, `itune eval` and the `image-to-text` pipeline) takes the fast path
for a model on a CUDA device whose family traces its step in one graph (`FAST_DECODING_FAMILIES`), not quantised and
not offloaded, and the default path everywhere else, so CPU captioning is unchanged. The first call compiles (seconds to
minutes at the papers' sizes): for a handful of images the default path starts sooner. Should compiling fail on a
machine (no Triton, an old driver, dynamo's recompile limit), `"auto"` warns once with the reason and decodes on the
default path from then on; a step that does not trace for given settings (e.g. `output_attentions=True`) decodes
that call on the default path, with a warning. `"fast"` raises instead.

The fast path drops a caption mask that masks nothing (the processors give one with every batch): `generate` widens
a 2-D mask by a column each step, which would give the compiled step a new shape at every token. A batch of prompts of
different lengths (padding in the mask) decodes on the default path under `"auto"` and is refused under `"fast"`.

Traced on the CPU without compiling (the "eager" backend, a full graph), the fast path gives the default path's
captions in fp32, greedy and beam search, for every family in `FAST_DECODING_FAMILIES` (tests/test_decoding.py).
Compiled kernels (inductor) may round differently, in fp32 a little and in bf16 more.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import threading
import warnings
from contextlib import ExitStack, contextmanager
from typing import Any, NamedTuple

import torch

DECODINGS = ("auto", "default", "fast")
BACKEND = "inductor"  #: torch.compile's backend for the fast path (the tests trace with "eager")
#: model types whose decode step traces in one graph under a static cache (tests/test_decoding.py checks each
#: registered family: these trace and give the default captions, the others do not trace)
FAST_DECODING_FAMILIES = ("ituning", "xgpt", "crossattn")
_FAILED_ATTRIBUTE = "_itune_fast_decoding_failed"
_POOL_ATTRIBUTE = "_itune_fast_decoding_caches"
_PATHS_ATTRIBUTE = "_itune_decoded_on"  # {"fast": calls, "default": calls} of fast_generate, as they ran
#: how many call shapes (batch, cache length) the greedy and sampling fast path keeps static caches for
POOLED_SHAPES = 4
_NONE = object()
# One fast-path generate call at a time in a process: beam search swaps the model's forward, and I-Tuning's compiled
# steps read the keys/values their call's prefill left on the modules (an I-Tuning model's vision context is per
# model, so one model never ran two generate calls at once safely, on either path)
_FAST_CALLS = threading.RLock()


def _compile_failures() -> tuple[type[BaseException], ...]:
    """What says that compiling cannot work on this machine or for this model any more (not one call's inputs)."""
    exc = torch._dynamo.exc
    return tuple(getattr(exc, name) for name in ("BackendCompilerFailed", "InvalidBackend", "FailOnRecompileLimitHit")
                 if hasattr(exc, name))  # fmt: skip


def _captioner(model) -> torch.nn.Module:
    """The model that decodes: a `PeftModel`'s base model, else `model`."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def _on_gpu(captioner: torch.nn.Module) -> bool:
    return next(captioner.parameters()).device.type == "cuda"


def _compilable(captioner: torch.nn.Module) -> bool:
    """transformers' own conditions for compiling a decode step: no quantiser that forbids it, no CPU/disk offload;
    and no LM quantised by `--load-in` (bitsandbytes, which transformers never compiles either)."""
    quantizer = getattr(captioner, "hf_quantizer", None)
    if quantizer is not None and not getattr(quantizer, "is_compileable", False):
        return False
    if getattr(getattr(captioner, "language_model", None), "itune_quantization", None) is not None:
        return False
    placed = set((getattr(captioner, "hf_device_map", None) or {}).values())
    return "disk" not in placed and not ("cpu" in placed and len(placed) > 1)


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
        decoding: `"auto"` (the fast path on a CUDA device for a family in `FAST_DECODING_FAMILIES`, neither
            quantised against compiling nor offloaded, unless compiling failed there before; else the default path),
            `"default"` or `"fast"`.

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
    usable = _on_gpu(captioner) and _compilable(captioner) and not getattr(captioner, _FAILED_ATTRIBUTE, None)
    return "fast" if usable else "default"


@functools.cache
def _compiled_forward(model_class: type, backend: str):
    """`model_class.forward` compiled once per class and backend: a full graph (a break is an error)."""
    return torch.compile(model_class.forward, backend=backend, fullgraph=True)


@contextmanager
def compiled_forward(model, backend: str | None = None):
    """`model`'s forward compiled for one `generate` call (beam search's fast path: `generate` compiles no
    beam-search step). The call's first forward, the prefill, runs eagerly, as `generate`'s own compiled greedy path
    runs it: it projects each image's visual keys/values once, which the compiled steps then read. Whatever `forward`
    the instance had before is back afterwards; one swap at a time (a lock), so a concurrent call on the default path
    never runs the compiled forward.

    Args:
        model: A captioner of a family in `FAST_DECODING_FAMILIES`.
        backend: `torch.compile`'s backend (default: `BACKEND`; "eager" traces without compiling, as the tests do).
    """
    compiled = _compiled_forward(type(model), backend or BACKEND)
    with _FAST_CALLS:
        own = vars(model).get("forward")  # an instance attribute (e.g. an accelerate hook), or None
        eager = own if own is not None else functools.partial(type(model).forward, model)
        calls = 0

        def forward(*args, **kwargs):
            nonlocal calls
            calls += 1
            return eager(*args, **kwargs) if calls == 1 else compiled(model, *args, **kwargs)

        forward.__signature__ = inspect.signature(eager)  # generate() checks its arguments against forward's
        with _overriding(model, "forward", forward):
            yield model


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


class _NoPaddingWarning(logging.Filter):
    """Drops transformers' "your input_ids may be padded" warning while the fast path runs: it dropped a caption mask
    of ones (nothing is padded), and the LM, seeing a start token equal to its padding token and no mask, would warn.
    transformers warns once per process, so a later genuine instance of that warning is not shown either."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("We strongly recommend passing in an `attention_mask`")


@contextmanager
def _no_padding_warning():
    logger, dropped = logging.getLogger("transformers.modeling_utils"), _NoPaddingWarning()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def _beams(model, kwargs: dict[str, Any]) -> int:
    """The beams `generate` will run: the keyword, else a passed config's, else the model's (as `generate` fills
    a passed config's unset fields from the model's)."""
    passed = kwargs.get("generation_config")
    return int(kwargs.get("num_beams") or getattr(passed, "num_beams", None)
               or _captioner(model).generation_config.num_beams or 1)  # fmt: skip


class _PoolKey(NamedTuple):
    """What a pooled static cache's tensors are shaped and made by: a call with another key cannot use them."""

    implementation: str | None  # "static", "offloaded_static", ...
    batch: int | None  # sequences: images x beams or returned sequences
    layout: tuple  # the layers' kinds and lengths (the cross-attention cache's: the image's tokens)
    length: int  # the cache length transformers chose (never less than an earlier call's)
    dtype: torch.dtype
    device: torch.device
    inference: bool  # made under torch.inference_mode (its tensors cannot be reset outside it)


def _cache_layout(cache) -> tuple:
    """What a static cache's tensors will be shaped by, besides the batch: its layers' kinds and lengths."""
    parts = [getattr(cache, name) for name in ("self_attention_cache", "cross_attention_cache") if hasattr(cache, name)]
    return tuple((type(layer).__name__, getattr(layer, "max_cache_len", None))
                 for part in parts or [cache] for layer in getattr(part, "layers", ()))  # fmt: skip


def _pooled_cache(captioner: torch.nn.Module, pool: dict, prepare, *args, **kwargs):
    """transformers' new static cache for this call (`prepare`, `_prepare_static_cache`), or the pooled one of an
    earlier call with the same `_PoolKey`, reset in place. Entries no call can match any more (another device or
    dtype, a shorter length than transformers now asks for) are dropped, and all but the last `POOLED_SHAPES`."""
    fresh = prepare(captioner, *args, **kwargs)  # allocates nothing (lazy layers) unless prefill is chunked
    arguments = inspect.signature(prepare).bind(captioner, *args, **kwargs).arguments
    key = _PoolKey(arguments.get("cache_implementation"), arguments.get("batch_size"), _cache_layout(fresh),
                   getattr(captioner, "_previous_max_cache_length", 0), captioner.dtype, captioner.device,
                   torch.is_inference_mode_enabled())  # fmt: skip
    for stale in [k for k in pool if (k.dtype, k.device) != (key.dtype, key.device) or k.length < key.length]:
        del pool[stale]
    cache = pool.pop(key, None)
    if cache is None:
        cache = fresh
    else:
        cache.reset()
    pool[key] = cache
    while len(pool) > POOLED_SHAPES:
        del pool[next(iter(pool))]
    return cache


@contextmanager
def _static_inputs(captioner: torch.nn.Module):
    """Keep what the compiled steps of a greedy or sampling call read at the addresses of the last call of the same
    shapes; yields the pool of static caches.

    CUDA graphs replay reading their static inputs at the addresses they were recorded with (the static cache's
    tensors and I-Tuning's visual keys/values are such inputs: marked static, not copied at each replay). transformers
    builds a new static cache for each call, and the prefill projects new keys/values: wherever those land at new
    addresses, CUDA graphs record the step again (torch 2.13 keeps every recording, and does not count these against
    its re-record limit). Here a call of the shapes of one of the last `POOLED_SHAPES` calls gets that call's cache
    back, reset in place (`_pooled_cache`); an I-Tuning model keeps its keys/values in buffers the same way
    (`ITuningForCaptioning.static_decoding_inputs`). `release_fast_decoding` frees them."""
    prepare = getattr(type(captioner), "_prepare_static_cache", None)
    pool = vars(captioner).setdefault(_POOL_ATTRIBUTE, {})
    with ExitStack() as stack:
        if prepare is not None:
            pooled = functools.partial(_pooled_cache, captioner, pool, prepare)
            stack.enter_context(_overriding(captioner, "_prepare_static_cache", pooled))
        if hasattr(captioner, "static_decoding_inputs"):
            stack.enter_context(_overriding(captioner, "static_decoding_inputs", True))
        yield pool


def _hand_over_a_copy(pool: dict, output) -> None:
    """Put a copy of a pooled cache that `generate` hands back in `output` (`return_dict_in_generate`) in its place:
    a later call resets and overwrites the pooled one, and the caller's must stay as it was (one copy of the cache per
    call, against a new recording of the step)."""
    for name in ("cache", "past_key_values"):
        held = getattr(output, name, None)
        if held is not None and any(held is cache for cache in pool.values()):
            setattr(output, name, copy.deepcopy(held))


@contextmanager
def _overriding(obj, name: str, value):
    """`obj.name` is `value` in the block; afterwards the instance's own attribute again, or none (the class's)."""
    own = vars(obj).get(name, _NONE)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if own is _NONE:
            delattr(obj, name)
        else:
            setattr(obj, name, own)


def release_fast_decoding(model) -> None:
    """Free what the fast path keeps between calls to replay its compiled steps at stable addresses: the static caches
    of the last `POOLED_SHAPES` call shapes and I-Tuning's visual key/value buffers (e.g. before moving the model off
    its GPU: they stay where they were made until a later fast call drops them). Not while the model decodes: like
    `generate`, one call on a model at a time.

    Args:
        model: A captioner (or a `PeftModel` over one) that decoded on the fast path.
    """
    captioner = _captioner(model)
    vars(captioner).pop(_POOL_ATTRIBUTE, None)
    clear = getattr(captioner, "clear_vision_cache", None)
    if callable(clear):
        clear()


def _generate_fast(model, backend: str, kwargs: dict[str, Any]):
    with _FAST_CALLS:
        return _generate_compiled(model, backend, kwargs)


def _generate_compiled(model, backend: str, kwargs: dict[str, Any]):
    from transformers import CompileConfig

    captioner = _captioner(model)
    kwargs = {"cache_implementation": "static", **kwargs}
    if _beams(model, kwargs) > 1:
        with compiled_forward(captioner, backend), _no_padding_warning():
            return model.generate(**{"disable_compile": True, **kwargs})
    mode = "reduce-overhead" if _on_gpu(captioner) and backend == "inductor" else None  # CUDA graphs on a GPU
    config = CompileConfig(backend=backend, fullgraph=True, mode=mode)  # dynamic=None: automatic dynamic shapes
    config._compile_all_devices = True  # generate() compiles on GPUs only unless told; the fast path was chosen
    with _no_padding_warning(), _static_inputs(captioner) as pool:
        output = model.generate(**{"compile_config": config, **kwargs})
    _hand_over_a_copy(pool, output)
    return output


def _fall_back(model, error: BaseException, kwargs: dict[str, Any]):
    """The default path's output after the fast path raised `error` under `"auto"`; a failure to compile (not one
    call's settings) turns the fast path off for the model."""
    captioner = _captioner(model)
    reason = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    if isinstance(error, _compile_failures()):
        setattr(captioner, _FAILED_ATTRIBUTE, reason)
        release_fast_decoding(captioner)
        what = "failed to compile here; captioning on the default path from now on"
    else:
        what = "does not trace with these settings; this call decodes on the default path"
    warnings.warn(f"the fast decoding path {what} ({reason}); decoding='default' skips the attempt", RuntimeWarning,
                  stacklevel=3)  # fmt: skip
    return model.generate(**kwargs)


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
        ValueError: As `resolve_decoding`; or `"fast"` with a caption mask that holds padding.
        torch._dynamo.exc.TorchDynamoException: The fast path failed with `decoding="fast"` (with `"auto"` the
            captions come from the default path, after a warning).
    """
    path = resolve_decoding(model, decoding)
    unpadded = _without_full_masks(kwargs) if path == "fast" else None
    if path == "fast" and unpadded is None:
        if decoding == "fast":
            raise ValueError(
                "decoding='fast': decoder_attention_mask holds padding (prompts of different lengths); generate widens "
                "it every step, a new shape for the compiled step at each token. Use decoding='auto' or 'default', "
                "or prompts of one length"
            )
        path = "default"
    if path == "default":
        _count_path(model, "default")
        return model.generate(**kwargs)
    try:
        output = _generate_fast(model, backend or BACKEND, unpadded)
    except (torch._dynamo.exc.TorchDynamoException, *_compile_failures()) as error:
        if decoding == "fast":
            raise
        _count_path(model, "default")
        return _fall_back(model, error, kwargs)
    _count_path(model, "fast")
    return output


def _count_path(model, path: str) -> None:
    taken = _captioner(model).__dict__.setdefault(_PATHS_ATTRIBUTE, {})
    taken[path] = taken.get(path, 0) + 1


def decoded_on(model) -> dict[str, int]:
    """How many `fast_generate` calls of `model` ran on each path so far (`{"fast": 3, "default": 1}`): `"auto"` takes
    the default path for a batch of padded prompts and after a failure to compile, so the path asked for may not be
    the path taken.

    Args:
        model: A captioner, or a `PeftModel` around one.
    """
    return dict(_captioner(model).__dict__.get(_PATHS_ATTRIBUTE, {}))


__all__ = [
    "DECODINGS",
    "FAST_DECODING_FAMILIES",
    "compiled_forward",
    "decoded_on",
    "fast_decoding_supported",
    "fast_generate",
    "release_fast_decoding",
    "resolve_decoding",
]
