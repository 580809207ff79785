# Generated from itune_hf/models/_shared/text_inputs.py by `make fix-copies` (tools/fix_copies.py):
# edit that file, not this copy. Remote code imports only the files beside the model file, so each family
# carries one.
"""The tokenizer arguments a captioning processor takes: it lays out the decoder sequences itself (left-padded
prompts, right-padded training captions), so `padding`, `truncation` and `max_length` shape that layout and the
tokenizer's other arguments are refused by name."""

from __future__ import annotations

from collections.abc import Sequence

TextInput = str | Sequence[str] | None

#: Tokenizer arguments the processor takes (pipelines pass `padding=True` with batched prompts). The processor lays
#: out the decoder sequences itself (left-padded prompts, right-padded training captions), so these shape that layout.
TEXT_KWARGS = ("padding", "truncation", "max_length")
#: Other tokenizer arguments: refused by name, instead of reaching the image processor.
UNSUPPORTED_TEXT_KWARGS = (
    "pad_to_multiple_of", "padding_side", "add_special_tokens", "return_attention_mask", "return_token_type_ids",
    "return_overflowing_tokens", "return_special_tokens_mask", "return_offsets_mapping", "return_length", "stride",
    "is_split_into_words", "verbose",
)  # fmt: skip


#: `limit` when `truncation=False` is given: nothing is cut, not even a training caption beyond `max_caption_length`
NO_LIMIT = 2**62


def pop_text_kwargs(kwargs: dict) -> tuple[int | None, int | None]:
    """Take the tokenizer arguments out of `kwargs`: `(pad_to, limit)` token counts (None: longest / the default,
    which cuts training captions at the processor's `max_caption_length` and prompts nowhere).

    `padding=True|"longest"|False|"do_not_pad"` pad to the longest row (tensors need equal rows);
    `padding="max_length"` pads to `max_length`; `max_length` caps every sequence there unless `truncation=False`
    (as transformers' tokenizers do, which truncate when given `max_length` alone); `truncation=False` cuts nothing
    (`NO_LIMIT`).
    """
    for name in UNSUPPORTED_TEXT_KWARGS:
        if name in kwargs:
            raise ValueError(
                f"{name}={kwargs[name]!r}: the processor lays out decoder sequences itself and takes only "
                f"{', '.join(TEXT_KWARGS)} of the tokenizer's arguments"
            )
    padding, truncation = kwargs.pop("padding", None), kwargs.pop("truncation", None)
    max_length = kwargs.pop("max_length", None)
    if padding not in (None, True, False, "longest", "do_not_pad", "max_length"):
        raise ValueError(f"padding={padding!r}: expected True, False, 'longest', 'max_length' or 'do_not_pad'")
    if (padding == "max_length" or truncation not in (None, False, "do_not_truncate")) and max_length is None:
        raise ValueError(f"padding={padding!r}, truncation={truncation!r} need max_length=")
    pad_to = max_length if padding == "max_length" else None
    if truncation in (False, "do_not_truncate"):
        return pad_to, NO_LIMIT
    return pad_to, max_length


__all__ = ["NO_LIMIT", "TEXT_KWARGS", "UNSUPPORTED_TEXT_KWARGS", "TextInput", "pop_text_kwargs"]
