# Generated from itune_hf/models/_shared/generation.py by `make fix-copies` (tools/fix_copies.py):
# edit that file, not this copy. Remote code imports only the files beside the model file, so each family
# carries one.
"""The KV cache under both of its names.

transformers 5.24 renamed the cache of `forward`, `generate` and the model outputs from `past_key_values` to
`cache` (the old name is deprecated until 5.40). The models take both, return the cache under the field
transformers' outputs have, and hand it to a wrapped LM under the keyword that LM's `forward` declares: a GPT-2
tolerates an `EncoderDecoderCache`, a Llama does not.
"""

from __future__ import annotations

import inspect

from torch import nn
from transformers.modeling_outputs import Seq2SeqLMOutput

#: The name of the cache field of transformers' model outputs.
OUTPUT_CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


def cache_argument_of(module: nn.Module) -> str:
    """The keyword under which `module.forward` takes the KV cache: `cache` (transformers >= 5.24) or
    `past_key_values` (before, and remote-code models that keep the old name).

    Args:
        module: A model, e.g. the wrapped causal LM.
    """
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def output_cache(outputs) -> object | None:
    """The KV cache a model returned, under either name (read from the keys, so no deprecation warning).

    Args:
        outputs: A transformers `ModelOutput`.
    """
    for name in ("cache", "past_key_values"):
        if name in outputs.keys():
            return outputs[name]
    return None


def one_cache(cache, past_key_values):
    """The generation cache given to `forward` under either name.

    Args:
        cache: The `cache` argument (transformers >= 5.24 passes it so).
        past_key_values: The `past_key_values` argument.

    Raises:
        ValueError: both were given.
    """
    if cache is not None and past_key_values is not None:
        raise ValueError("Pass the cache once: as cache (transformers >= 5.24) or past_key_values, not both")
    return cache if cache is not None else past_key_values


__all__ = ["OUTPUT_CACHE_FIELD", "cache_argument_of", "one_cache", "output_cache"]
