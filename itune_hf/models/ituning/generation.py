# Generated from itune_hf/models/_shared/generation.py by `make fix-copies` (tools/fix_copies.py):
# edit that file, not this copy. Remote code imports only the files beside the model file, so each family
# carries one.
"""The KV cache under both of its names, the caption length a caller asks for, and positions under left padding.

transformers 5.24 renamed the cache of `forward`, `generate` and the model outputs from `past_key_values` to
`cache` (it takes the old name until 5.40). The models' `forward` takes `cache`, and `past_key_values` through
`renamed_argument` (a versioned deprecation, silent where the installed transformers passes the old name itself);
they return the cache under the field transformers' outputs have, and hand it to a wrapped LM under the keyword that
LM's `forward` declares: a GPT-2 tolerates an `EncoderDecoderCache`, a Llama does not.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings

import transformers
from packaging import version
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


#: The transformers release whose `generate` passes the KV cache to `forward` as `cache` (before: `past_key_values`).
CACHE_RENAMED_IN = "5.24"
#: The release from which the models no longer take `past_key_values` (transformers' own deprecation ends there).
OLD_CACHE_NAME_REMOVED_IN = "5.40"


def renamed_argument(old: str, new: str, *, renamed_in: str, removed_in: str):
    """Decorate a `forward` whose keyword `new` was called `old` before transformers `renamed_in`: a value passed as
    `old` arrives as `new`. Silently while the installed transformers is older than `renamed_in` (its own `generate`
    passes `old` then); from `renamed_in` on only a caller's code passes it, and is told once per call site with a
    `FutureWarning` that names the release removing it.

    Args:
        old: The former name (`"past_key_values"`).
        new: The name `forward` declares (`"cache"`).
        renamed_in: The transformers release that renamed it.
        removed_in: The release from which `old` is refused.

    Raises:
        ValueError: from the decorated function, when both names are given.
    """
    silent = version.parse(transformers.__version__) < version.parse(renamed_in)

    def decorate(function):
        @functools.wraps(function)
        def taking_the_old_name(*args, **kwargs):
            if old in kwargs:
                value = kwargs.pop(old)
                if value is not None and kwargs.get(new) is not None:
                    raise ValueError(f"Pass the cache once: as {new} or as {old} (its name before {renamed_in})")
                if value is not None and not silent:
                    warnings.warn(
                        f"`{old}` of {function.__qualname__} is deprecated since transformers {renamed_in} and will be "
                        f"removed in {removed_in}: pass `{new}`",
                        FutureWarning,
                        stacklevel=_callers_level(),
                    )
                kwargs[new] = kwargs.get(new) if value is None else value
            return function(*args, **kwargs)

        return taking_the_old_name

    return decorate


def _callers_level() -> int:
    """The `stacklevel` of the caller's own line: past this module's wrapper and torch's `Module.__call__`."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torch.nn.modules"):
        level, frame = level + 1, frame.f_back
    return level


#: `@accepts_old_cache_name` on a model's `forward(..., cache=None, ...)`: `past_key_values` taken too.
accepts_old_cache_name = renamed_argument(
    "past_key_values", "cache", renamed_in=CACHE_RENAMED_IN, removed_in=OLD_CACHE_NAME_REMOVED_IN
)


def callers_length(kwargs: dict) -> dict:
    """`generate`'s keyword arguments with a caller's `max_length` winning over the saved default `max_new_tokens`.

    Every family's `generation_config` saves `max_new_tokens` (30) as its default length, and `generate` prefers
    `max_new_tokens` over `max_length` (with a warning). A `max_length` given without `max_new_tokens` (a pipeline's
    `max_length`, `Seq2SeqTrainer`'s `generation_max_length`, a passed `generation_config`'s) is the caller's choice:
    it wins, silently.

    Args:
        kwargs: The keyword arguments of a `generate` call (changed in place).
    """
    passed = kwargs.get("generation_config")
    if passed is not None and passed.max_length is not None and passed.max_new_tokens is None:
        # as keywords: `generate` fills a passed config's unset max_new_tokens from the model's, and warns when
        # a config comes with keywords
        settings = {key: value for key, value in kwargs.pop("generation_config").to_diff_dict().items()
                    if key != "transformers_version" and key not in kwargs}  # fmt: skip
        kwargs.update(settings)
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


__all__ = [
    "CACHE_RENAMED_IN", "OLD_CACHE_NAME_REMOVED_IN", "OUTPUT_CACHE_FIELD", "accepts_old_cache_name",
    "cache_argument_of", "callers_length", "output_cache", "padded_positions", "renamed_argument",
]  # fmt: skip
