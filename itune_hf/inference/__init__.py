"""Faster captioning: opt-in CPU settings (`optimize_for_inference`: int8, bf16 where native, a vocabulary
shortlist) in `optimize.py`, and the decoding path chosen by device (`fast_generate`: a static cache and a compiled
decode step on GPUs) in `decoding.py`."""

from .decoding import (
    DECODINGS,
    FAST_DECODING_FAMILIES,
    compiled_forward,
    fast_decoding_supported,
    fast_generate,
    release_fast_decoding,
    resolve_decoding,
)
from .optimize import (
    PRECISIONS,
    Int8Linear,
    VocabularyShortlist,
    caption_vocabulary,
    native_bf16,
    optimize_for_inference,
)

__all__ = [
    "DECODINGS",
    "FAST_DECODING_FAMILIES",
    "PRECISIONS",
    "Int8Linear",
    "VocabularyShortlist",
    "caption_vocabulary",
    "compiled_forward",
    "fast_decoding_supported",
    "fast_generate",
    "native_bf16",
    "optimize_for_inference",
    "release_fast_decoding",
    "resolve_decoding",
]
