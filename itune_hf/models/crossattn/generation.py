# Generated from itune_hf/models/_shared/generation.py by `make fix-copies` (tools/fix_copies.py):
# edit that file, not this copy. Remote code imports only the files beside the model file, so each family
# carries one.
"""The KV cache under both of its names, the caption length a caller asks for, and positions under left padding.

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


def callers_length(kwargs: dict) -> dict:
    """`generate`'s keyword arguments with a caller's `max_length` winning over the saved default `max_new_tokens`.

    Every family's `generation_config` saves `max_new_tokens` (30) as its default length, and `generate` prefers
    `max_new_tokens` over `max_length` (with a warning). A `max_length` given without `max_new_tokens` (a pipeline's
    `max_length`, `Seq2SeqTrainer`'s `generation_max_length`) is the caller's choice: it wins, silently.

    Args:
        kwargs: The keyword arguments of a `generate` call (changed in place).
    """
    if kwargs.get("max_length") is not None and "max_new_tokens" not in kwargs:
        kwargs["max_new_tokens"] = None
    return kwargs


def padded_positions(mask, new: int):
    """The position ids of the last `new` tokens of left-padded rows: counted from each row's first real token, so
    that a row's positions (and so its caption) do not depend on the other rows of its batch.

    Args:
        mask: `(B, past + new)` attention mask, 0 on padding.
        new: How many tokens this step feeds.
    """
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -new:]


__all__ = ["OUTPUT_CACHE_FIELD", "callers_length", "cache_argument_of", "one_cache", "output_cache", "padded_positions"]
