"""Faster captioning on CPU: opt-in inference settings for a loaded `ITuningForCaptioning` (the GPU decoding path is
`decoding.py`'s).

`optimize_for_inference(model, int8=..., precision=...)` changes the model in place for `generate()` (and so for
`itune caption`, `itune eval` and the pipeline). Nothing here runs unless asked: a model that was not passed
through it computes exactly as loaded.

* Always (bit-exact): the LM head gets a contiguous input. transformers slices the last position of the hidden
  states for the logits (`hidden[:, -1:, :]`, a strided view); `torch.matmul` then expands the `vocab x width`
  head weight once per sequence (a batched matrix product over 80 copies at beam 5, batch 16), many times slower
  than the same product on a contiguous input, in bf16 most of all (benchmarks/RESULTS.md, "Faster captioning on
  CPU").
* `int8=True`: every linear layer of the frozen LM, its LM head included, becomes an `Int8Linear`: weights int8
  per output channel, activations quantised per token at run time, products in int8 (`torch._int_mm`). Per-token
  activation scales matter: Llama-family LMs put a massive activation on the first position, and per-tensor
  activation scales (`torch.ao.quantization.quantize_dynamic`) then flatten every other token, which changes far
  more captions than per-token scales do (benchmarks/RESULTS.md). The I-Tuning modules (small, trained) and the
  vision tower stay in float; GPT-2's `Conv1D` layers are quantised like `nn.Linear`. CPU only.
* `precision="bf16"`: the vision tower and the LM in bfloat16 (the I-Tuning modules, and a shortlisted LM head, stay
  float32). Only where the hardware computes bf16 natively (AVX512-BF16 or AMX on CPU): elsewhere it is emulated and
  several times slower than fp32, so it is refused. `precision="auto"` picks bf16 where native and fp32 elsewhere.

* `vocabulary=token_ids`: a **vocabulary shortlist**. The LM head computes logits for these tokens only, and
  generation works in the shortlist's own ids (translated back before `generate` returns, so decoding is
  unchanged). Beam search's own work per step is vocabulary-wide in transformers (a float32 copy of the logits,
  `log_softmax`, adding the beam scores, `topk` over beams x vocabulary: four passes over 80 x 49,152 values at beam
  5, batch 16, a large share of a captioning call: benchmarks/RESULTS.md), and so is the head's product; a captioner
  trained on a caption set uses a small part of its LM's vocabulary. `caption_vocabulary(processor, captions)`
  collects the tokens of the training captions (plus BOS, EOS, padding and the caption prefix). Greedy captions are
  unchanged unless the model would have chosen a token outside the shortlist; beam scores are normalised over the
  shortlist, which can reorder near-tied beams. Generation settings that name token ids beyond BOS/EOS/padding/start
  (`bad_words_ids`, `suppress_tokens`, forced tokens, ...) are refused rather than silently misread.

The result is for inference only: do not train it or save it (save the original checkpoint instead).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ..models.ituning.modeling_ituning import ITuningForCaptioning
from ..models.quantization import frozen_linear_layers
from ..utils.runtime import native_bf16

PRECISIONS = ("fp32", "bf16", "auto")


class Int8Linear(nn.Module):
    """A frozen linear layer in int8: weights quantised per output channel, inputs per token at run time.

    `y = (round(x / s_x) @ round(W / s_w)^T) * s_x * s_w + b`, with symmetric scales `s_x` (one per row of `x`) and
    `s_w` (one per output feature), the product in int8 with int32 accumulation.

    Args:
        weight: `(out_features, in_features)` float weight.
        bias: `(out_features,)` float bias or `None`.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        quantised = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight_int8", quantised.t().contiguous())  # (in, out): what torch._int_mm takes
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_float(cls, layer: nn.Module) -> Int8Linear:
        """Quantise an `nn.Linear` or a transformers `Conv1D` (GPT-2's linear layers, weight stored transposed).

        Args:
            layer: The float layer.
        """
        weight = layer.weight.t() if isinstance(layer, Conv1D) else layer.weight
        return cls(weight, layer.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        quantised = torch.round(rows / scale).to(torch.int8)
        output = torch._int_mm(quantised, self.weight_int8).float() * (scale * self.weight_scale)
        if self.bias is not None:
            output = output + self.bias
        return output.reshape(*hidden_states.shape[:-1], self.out_features).to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _quantise_language_model(model: ITuningForCaptioning) -> int:
    """Replace the frozen LM's linear layers with `Int8Linear`; returns how many were replaced."""
    layers = frozen_linear_layers(model.language_model, include_head=True)
    for parent, name in layers:
        setattr(parent, name, Int8Linear.from_float(getattr(parent, name)))
    return len(layers)


def _contiguous_head_input(model: ITuningForCaptioning) -> None:
    head = model.language_model.get_output_embeddings()
    if head is None or getattr(head, "_itune_contiguous_input", False):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    head._itune_contiguous_input = True


def _float32_head(model: ITuningForCaptioning) -> None:
    """Keep a shortlisted LM head in float32 under bf16: it is small, and the logits decide between near-tied tokens
    (more beam captions stay as in fp32 than with the head in bf16: benchmarks/RESULTS.md)."""
    head = model.language_model.get_output_embeddings().float()
    head.register_forward_pre_hook(lambda module, args: (args[0].float(), *args[1:]))


def _resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and not native_bf16(device):
        raise ValueError(
            f"precision='bf16' was asked for, but {device.type} here has no native bf16 (on CPU: AVX512-BF16 or AMX); "
            "emulated bf16 is several times slower than fp32. Use precision='fp32', or 'auto' to use bf16 only "
            "where it is native"
        )
    return precision


#: generate() settings holding token ids that a shortlist translates (the rest are refused while one is active)
SPECIAL_TOKEN_SETTINGS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
TOKEN_LIST_SETTINGS = ("bad_words_ids", "force_words_ids", "suppress_tokens", "begin_suppress_tokens",
                       "forced_bos_token_id", "forced_eos_token_id", "sequence_bias", "forced_decoder_ids")  # fmt: skip


class VocabularyShortlist:
    """The tokens a shortlisted captioner can generate, and the translation between their ids and the tokenizer's.

    Shortlist id `i` is tokenizer id `full_ids[i]` (sorted ascending, so the order of tokens is kept).

    Args:
        token_ids: Tokenizer ids to keep (duplicates are fine).
        vocab_size: The LM's vocabulary size (every id must be below it).
    """

    def __init__(self, token_ids: Iterable[int], vocab_size: int) -> None:
        ids = sorted({int(i) for i in token_ids})
        if not ids:
            raise ValueError("vocabulary: the shortlist is empty; pass the token ids of your training captions")
        outside = [i for i in ids if not 0 <= i < vocab_size]
        if outside:
            raise ValueError(
                f"vocabulary: token ids {outside[:10]} are outside the LM's vocabulary (0..{vocab_size - 1})"
            )
        self.full_ids = torch.tensor(ids, dtype=torch.long)
        self.short_ids = torch.full((vocab_size,), -1, dtype=torch.long)
        self.short_ids[self.full_ids] = torch.arange(len(ids))

    def __len__(self) -> int:
        return len(self.full_ids)

    def to_short(self, ids: torch.Tensor, what: str) -> torch.Tensor:
        """Tokenizer ids -> shortlist ids; a `ValueError` naming `what` and the missing tokens if any is absent."""
        short = self.short_ids.to(ids.device)[ids]
        if (short < 0).any():
            missing = sorted(set(ids[short < 0].tolist()))
            raise ValueError(
                f"{what}: token ids {missing[:10]} are not in the vocabulary shortlist ({len(self)} tokens); build "
                "the shortlist from captions that contain them (caption_vocabulary), or caption without one"
            )
        return short

    def to_full(self, ids: torch.Tensor) -> torch.Tensor:
        """Shortlist ids -> tokenizer ids."""
        return self.full_ids.to(ids.device)[ids]

    def _translate_setting(self, name: str, value: Any) -> Any:
        """A special-token setting in shortlist ids. An id beyond the vocabulary (an EOS no step can produce, as
        benchmarks use to fix the length) stays beyond it."""
        if value is None:
            return None
        ids = torch.as_tensor(value, dtype=torch.long)
        beyond = ids >= len(self.short_ids)
        short = self.to_short(ids.masked_fill(beyond, int(self.full_ids[0])), name)
        return short.masked_scatter(beyond, ids[beyond] - len(self.short_ids) + len(self)).tolist()

    def special_tokens(
        self, generation_config, what: str = "", given: dict[str, Any] | None = None, fallback=None
    ) -> dict[str, Any]:
        """The BOS/EOS/pad/start settings of `generation_config` (or `given`, which wins; `fallback`, a config, for
        those it leaves unset, as `generate` fills a passed config from the model's) in shortlist ids; a
        `ValueError` (naming `what` and the setting) for one the shortlist lacks."""
        given = given or {}
        translated = {}
        for name in SPECIAL_TOKEN_SETTINGS:
            value = given.get(name, getattr(generation_config, name, None))
            if value is None and fallback is not None:
                value = getattr(fallback, name, None)
            if value is not None:
                translated[name] = self._translate_setting(f"{what} {name}".strip(), value)
        return translated

    def generation_kwargs(self, kwargs: dict[str, Any], generation_config) -> dict[str, Any]:
        """`generate()`'s arguments in shortlist ids: the prompt (`decoder_input_ids`), the special-token settings
        (given or from the model's `generation_config`), refusing token-list settings it cannot translate."""
        config = kwargs.get("generation_config") or generation_config
        named = [n for n in TOKEN_LIST_SETTINGS if kwargs.get(n) is not None or getattr(config, n, None) is not None]
        if named:
            raise ValueError(
                f"generate() with a vocabulary shortlist cannot translate {', '.join(named)} (token ids of the full "
                "vocabulary); caption without the shortlist to use them"
            )
        # given as arguments, they win over any generation config
        kwargs = {**kwargs, **self.special_tokens(config, given=kwargs, fallback=generation_config)}
        if kwargs.get("decoder_input_ids") is not None:
            kwargs["decoder_input_ids"] = self.to_short(kwargs["decoder_input_ids"], "decoder_input_ids (the prompt)")
        return kwargs

    def generation_output(self, output):
        """`generate()`'s result with its sequences in tokenizer ids again (scores stay over the shortlist)."""
        if isinstance(output, torch.Tensor):
            return self.to_full(output)
        output["sequences"] = self.to_full(output["sequences"])
        return output


class ShortlistEmbedding(nn.Module):
    """The LM's input embedding read through a shortlist: shortlist ids in, the full embedding's vectors out."""

    def __init__(self, embedding: nn.Module, full_ids: torch.Tensor) -> None:
        super().__init__()
        self.embedding = embedding
        self.register_buffer("full_ids", full_ids.clone(), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.full_ids[input_ids])


def caption_vocabulary(processor, captions: Sequence[str], *, batch_size: int = 512) -> list[int]:
    """The token ids of `captions` as the processor encodes them for training (caption prefix, EOS included), plus
    BOS, EOS and padding: a vocabulary shortlist for `optimize_for_inference(model, vocabulary=...)`.

    Args:
        processor: The captioner's `ITuningProcessor`.
        captions: The training captions (never the test references: the shortlist would then leak them).
        batch_size: Captions per processor call.
    """
    if not captions:
        raise ValueError("caption_vocabulary: no captions given; pass the captions the model was trained on")
    ids = {processor.bos_token_id, processor.eos_token_id, processor.pad_token_id}
    for start in range(0, len(captions), batch_size):
        batch = processor(captions=list(captions[start : start + batch_size]), return_tensors="pt")
        for key in ("decoder_input_ids", "labels"):
            ids.update(batch[key][batch[key] >= 0].unique().tolist())
    return sorted(ids)


def _apply_shortlist(model: ITuningForCaptioning, token_ids: Iterable[int]) -> VocabularyShortlist:
    """Slice the LM head to the shortlist, read the input embedding through it, translate the special-token ids."""
    language_model = model.language_model
    head = language_model.get_output_embeddings()
    shortlist = VocabularyShortlist(token_ids, head.weight.shape[0])
    shortlist.special_tokens(model.generation_config, "the model's")  # refuse a shortlist without them, up front
    sliced = nn.Linear(head.in_features, len(shortlist), bias=head.bias is not None, dtype=head.weight.dtype,
                       device=head.weight.device)  # fmt: skip
    with torch.no_grad():
        sliced.weight.copy_(head.weight[shortlist.full_ids.to(head.weight.device)])
        if head.bias is not None:
            sliced.bias.copy_(head.bias[shortlist.full_ids.to(head.bias.device)])
    language_model.set_output_embeddings(sliced.requires_grad_(False))
    embedding = language_model.get_input_embeddings()
    language_model.set_input_embeddings(ShortlistEmbedding(embedding, shortlist.full_ids.to(embedding.weight.device)))
    model.generation_translator = shortlist  # the model's public hook: generate() in shortlist ids
    return shortlist


def optimize_for_inference(
    model: ITuningForCaptioning,
    *,
    int8: bool = False,
    precision: str = "fp32",
    vocabulary: Iterable[int] | None = None,
):
    """Make captioning faster, in place; returns `model` (in eval mode) for chaining.

    With the defaults the outputs are bit-identical to the model's own (only the LM head's input is made
    contiguous). `int8` and `bf16` change the numbers slightly; `benchmarks/RESULTS.md` measures how often the
    captions change and by how much.

    Args:
        model: A loaded `ITuningForCaptioning` (on the device it will run on).
        int8: Quantise the frozen LM's linear layers (LM head included) to int8 with per-token activation scales.
            The I-Tuning modules and the vision tower stay in float. CPU only.
        precision: `"fp32"` (default), `"bf16"` (vision tower and LM in bfloat16, I-Tuning modules in float32;
            refused where bf16 is not native) or `"auto"` (bf16 where native, else fp32).
        vocabulary: Token ids the captions may use (a shortlist, e.g. `caption_vocabulary(processor,
            training_captions)`); the LM head and beam search then work over these only. Default: the whole
            vocabulary.

    Raises:
        ValueError: An unknown precision, bf16 without native support, int8 on a non-CPU device, or a vocabulary
            that is empty, outside the LM's, lacks the model's BOS/EOS/padding, or is applied a second time.
    """
    if not isinstance(model, ITuningForCaptioning):
        raise TypeError(f"optimize_for_inference takes an ITuningForCaptioning, got {type(model).__name__}")
    device = next(model.language_model.parameters()).device
    resolved = _resolve_precision(precision, device)
    if int8 and device.type != "cpu":
        raise ValueError(f"int8=True is for CPU, but the model is on {device}; on a GPU use precision='bf16'")
    if vocabulary is not None and isinstance(model.generation_translator, VocabularyShortlist):
        raise ValueError("vocabulary: this model already has a shortlist; load the model again to use another")
    model.eval()
    if vocabulary is not None:  # before the head's hook and its quantisation, which then apply to the sliced head
        _apply_shortlist(model, vocabulary)
    _contiguous_head_input(model)
    if resolved == "bf16":
        model.vision_model.to(torch.bfloat16)
        model.language_model.to(torch.bfloat16)  # the I-Tuning modules (model.ituning) stay float32
        if vocabulary is not None:
            _float32_head(model)
    if int8:
        _quantise_language_model(model)
    shortlist = model.generation_translator if isinstance(model.generation_translator, VocabularyShortlist) else None
    model._itune_inference = {
        "int8": int8,
        "precision": resolved,
        "vocabulary": None if shortlist is None else len(shortlist),
    }
    return model


__all__ = ["PRECISIONS", "Int8Linear", "VocabularyShortlist", "caption_vocabulary", "native_bf16",
           "optimize_for_inference"]  # fmt: skip
