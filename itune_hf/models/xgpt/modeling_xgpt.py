"""XGPT: cross-modal generative pre-training for image captioning (Xia et al., sections 3-4, appendix A).

Regions (a feature and a 5-d box each) are projected to the hidden size, refined by one AoA layer and encoded by a
Transformer; a decoder generates the caption from that memory. Three architectures (the paper's Table 3, see
`XGPTSettings`):

* ``encdec_share`` (the paper's model): one stack of layers encodes the regions and decodes the caption. Its decoder
  attends to the memory and to the caption prefix in one attention (self-attention and encoder-decoder attention share
  their weights): per layer, keys/values are ``[memory; prefix]``, the prefix under a causal mask, and a learned
  signal marks the memory's keys/values (`encoder_signal`).
* ``encdec``: separate encoder and decoder stacks; decoder layers have a causal self-attention, an encoder-decoder
  attention and a feed-forward block (Vaswani et al.).
* ``enc``: one stack over ``[regions; text]`` with UniLM's sequence-to-sequence mask. Regions never attend to text, so
  the region rows are computed once (the "encoder" pass keeps each layer's input), and text at layer ``l`` attends to
  the regions of layer ``l`` and to its causal prefix: exactly the single masked pass, with a cache.

Regions come from a frozen vision tower's patch tokens (a grid, or mean-pooled inside given boxes; a convolutional
tower's feature-map cells are its patches, and their mean its CLS) or are passed in (`region_features`, e.g.
bottom-up-attention features). Layers are post-LayerNorm (BERT), GELU, dropout 0.1.

This file is copied next to a full checkpoint by ``register_for_auto_class``; it imports only torch, transformers and
its sibling files, so the checkpoint loads with ``trust_remote_code=True`` anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput

from .backbones import as_vision_tokens, load_vision_tower
from .configuration_xgpt import XGPTConfig
from .generation import OUTPUT_CACHE_FIELD, accepts_old_cache_name, callers_length

#: Width of a region's position vector: normalised x1, y1, x2, y2 and the fraction of the image it covers.
POSITION_SIZE = 5
#: Boxes narrower than this (normalised units) are widened to it before pooling, so a point box takes its patch.
MIN_BOX_SIZE = 1e-6


# --------------------------------------------------------------------------------------------------------------
# Boxes and regions
# --------------------------------------------------------------------------------------------------------------
def box_positions(boxes: torch.Tensor) -> torch.Tensor:
    """The 5-d position vectors of boxes: normalised x1, y1, x2, y2 (clipped to [0, 1]) and the area fraction.

    Args:
        boxes: `(..., 4)` normalised x1, y1, x2, y2.
    """
    boxes = boxes.clamp(0.0, 1.0)
    area = (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)
    return torch.cat([boxes, area.unsqueeze(-1)], dim=-1)


def grid_boxes(rows: int, cols: int, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """The `(rows * cols, 4)` normalised boxes of a regular grid over the image, row by row.

    Args:
        rows: Cells from top to bottom.
        cols: Cells from left to right.
        device: Device of the result.
        dtype: Dtype of the result.
    """
    y = torch.arange(rows, device=device, dtype=dtype)
    x = torch.arange(cols, device=device, dtype=dtype)
    y1, x1 = torch.meshgrid(y / rows, x / cols, indexing="ij")
    return torch.stack([x1, y1, x1 + 1.0 / cols, y1 + 1.0 / rows], dim=-1).reshape(rows * cols, 4)


def _cell_overlap(low: torch.Tensor, high: torch.Tensor, cells: int) -> torch.Tensor:
    """`(B, N, cells)` length of the overlap of each interval [low, high] with each of `cells` equal cells of [0, 1]."""
    edges = torch.arange(cells + 1, device=low.device, dtype=low.dtype) / cells
    start = torch.maximum(low.unsqueeze(-1), edges[:-1])
    end = torch.minimum(high.unsqueeze(-1), edges[1:])
    return (end - start).clamp(min=0)


def pool_in_boxes(patch_states: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Mean of a patch feature map over each box: every patch weighs the area it shares with the box (the exact mean
    of the piecewise-constant map over the box, as ROI mean-pooling does on a detector's feature map).

    Args:
        patch_states: `(B, rows, cols, D)` patch tokens in image layout.
        boxes: `(B, N, 4)` normalised x1, y1, x2, y2; boxes smaller than a patch take the patches they touch.

    Returns:
        `(B, N, D)` pooled features.
    """
    rows, cols = patch_states.shape[1:3]
    boxes = boxes.to(patch_states.dtype).clamp(0.0, 1.0)
    x1, y1 = boxes[..., 0].clamp(max=1.0 - MIN_BOX_SIZE), boxes[..., 1].clamp(max=1.0 - MIN_BOX_SIZE)
    x2, y2 = torch.maximum(boxes[..., 2], x1 + MIN_BOX_SIZE), torch.maximum(boxes[..., 3], y1 + MIN_BOX_SIZE)
    weights = _cell_overlap(y1, y2, rows).unsqueeze(-1) * _cell_overlap(x1, x2, cols).unsqueeze(-2)  # (B, N, r, c)
    weights = weights / weights.sum(dim=(-2, -1), keepdim=True)
    return torch.einsum("bnrc,brcd->bnd", weights, patch_states)


def patch_grid(vision_states: torch.Tensor, *, has_cls: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split a vision tower's last hidden state into its CLS token and its patch tokens in image layout.

    Args:
        vision_states: `(B, tokens, D)`: `[CLS] + rows * cols` patches (CLIP) or `rows * cols` patches (SigLIP).
        has_cls: Whether the first token is a CLS token.

    Returns:
        `(cls (B, D) or None, patches (B, rows, cols, D))`.

    Raises:
        ValueError: when the patch tokens do not form a square grid.
    """
    cls = vision_states[:, 0] if has_cls else None
    patches = vision_states[:, 1:] if has_cls else vision_states
    side = math.isqrt(patches.shape[1])
    if side * side != patches.shape[1]:
        raise ValueError(
            f"The vision tower gave {vision_states.shape[1]} tokens ({'CLS + ' if has_cls else ''}"
            f"{patches.shape[1]} patches), which do not form a square grid of patches"
        )
    return cls, patches.reshape(patches.shape[0], side, side, patches.shape[-1])


# --------------------------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------------------------
@dataclass
class XGPTEncoderOutput(BaseModelOutput):
    r"""What the XGPT encoder gives the decoder: the visual memory, computed once per image batch.

    Args:
        last_hidden_state: `(B, N, hidden)` the encoded regions (the memory of `encdec` and `encdec_share`).
        hidden_states: The region states entering each layer and the final ones, when requested.
        attentions: Each layer's self-attention over the memory positions, `(B, heads, N, N)`, when requested.
        memory_mask: `(B, N)` 1 for real regions, 0 for padding.
        memory_per_layer: `(B, layers, N, hidden)` the region states entering each layer (`enc` only: text at layer
            `l` attends to the regions of layer `l`, as in UniLM).
    """

    memory_mask: torch.Tensor | None = None
    memory_per_layer: torch.Tensor | None = None


@dataclass
class XGPTModelOutput(Seq2SeqModelOutput):
    r"""`Seq2SeqModelOutput` plus, with `output_attentions`, how much of its attention each caption position gave the
    memory.

    Args:
        memory_shares: Per decoder layer, `(B, heads, T)`: the share of the attention on the memory (the rest went to
            the caption prefix; `cross_attentions` and `decoder_attentions` are each renormalised to rows of 1). 1
            for `encdec`, whose cross-attention is separate.
    """

    memory_shares: tuple[torch.Tensor, ...] | None = None


@dataclass
class XGPTCaptioningOutput(Seq2SeqLMOutput):
    r"""`Seq2SeqLMOutput` plus `memory_shares`. With `output_attentions=True` (computed unfused, so only when asked;
    `generate(..., output_attentions=True, return_dict_in_generate=True)` gathers them per step, as for
    `VisionEncoderDecoderModel`):

    - `cross_attentions`: one `(B, heads, T, N)` tensor per decoder layer, the attention over the memory's N
      positions (the regions, the CLS region first when the model has it), rows summing to 1;
    - `decoder_attentions`: one `(B, heads, T, past + T)` tensor per decoder layer, over the caption prefix (a static
      cache's: its whole buffer);
    - `encoder_attentions`: one `(B, heads, N, N)` tensor per encoder layer (when the encoder ran).

    Args:
        memory_shares: Per decoder layer, `(B, heads, T)`: the share of the attention on the memory (see
            [`XGPTModelOutput`]).
    """

    memory_shares: tuple[torch.Tensor, ...] | None = None


# --------------------------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------------------------
class XGPTRegionEmbedding(nn.Module):
    """A region's feature concatenated with its 5-d position, linearly projected to the hidden size (paper section
    3), then LayerNorm and dropout (as BERT's and Unified VLP's input embeddings).

    Args:
        config: The model configuration (`region_feature_size`, `hidden_size`, ...).
    """

    def __init__(self, config: XGPTConfig) -> None:
        super().__init__()
        width = config.region_feature_size
        self.feature_norm = nn.LayerNorm(width, eps=config.layer_norm_eps) if config.region_feature_norm else None
        self.projection = nn.Linear(width + POSITION_SIZE, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """`(B, N, hidden)` region embeddings from `(B, N, region_feature_size)` features and `(B, N, 4)` boxes."""
        return self.dropout(self.project(features, boxes))

    def project(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """The projected representation without dropout (TIFG regresses onto it)."""
        dtype = self.projection.weight.dtype
        features = features.to(dtype) if self.feature_norm is None else self.feature_norm(features.to(dtype))
        inputs = torch.cat([features, box_positions(boxes).to(dtype)], dim=-1)
        return self.norm(self.projection(inputs))


class XGPTEncoderText(nn.Module):
    """What the pre-training tasks add to the encoder (paper section 4.3): caption tokens next to the regions (IMLM,
    IDA) or alone (TIFG). Their token and position embeddings are the decoder's (one vocabulary, shared in every
    architecture); this module adds a segment vector telling text from regions, the [MASK] embedding (GPT-2's BPE
    has no mask token) and IDA's attention-driven matching.

    IDA's matching: A_ij = W [x_i^T; x_j^I; x_i^T * x_j^I] (W in R^{3h}), and the word becomes the softmax-weighted sum
    of the regions. Here that sum is *added* to the word's embedding (x_i^T + sum_j softmax_j(A_ij) x_j^I) rather than
    replacing it: replaced, a [MASK] and a word would differ only through the attention weights. The regions are
    the paper's x^I, "the corresponding representations" of section 3 (features and 5-d boxes projected to the
    hidden size), not the AoA-refined x' of appendix A.1, which only enter the encoder.

    Args:
        config: The model configuration (`hidden_size`).
    """

    _no_weight_decay = ("segment", "mask_embedding")  # vectors standing for a token type / a token: not decayed

    def __init__(self, config: XGPTConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        # plain parameters, set by `reset_parameters` from a generator of their own: adding this module leaves the
        # random initialisation of every other weight as it was without it (same seed, same captioning model)
        self.segment = nn.Parameter(torch.zeros(hidden))
        self.mask_embedding = nn.Parameter(torch.zeros(hidden))
        self.alignment_weight = nn.Parameter(torch.zeros(3 * hidden))  # W of A_ij = W [x; y; x * y] + b
        self.alignment_bias = nn.Parameter(torch.zeros(1))

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        """Draw the parameters from a generator seeded by the global seed, without consuming the global RNG."""
        generator = torch.Generator(device="cpu").manual_seed(torch.initial_seed() + 1)
        for parameter in (self.segment, self.mask_embedding, self.alignment_weight):
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
        self.alignment_bias.zero_()

    def align(self, text: torch.Tensor, regions: torch.Tensor, region_mask: torch.Tensor) -> torch.Tensor:
        """IDA's attention-driven image-text matching: each word plus its attention-weighted sum of the regions.

        Args:
            text: `(B, T, hidden)` embedded words.
            regions: `(B, N, hidden)` the regions' representation x^I (section 3: features and boxes projected to
                the hidden size), as the encoder reads them before the AoA refiner (appendix A.1's x').
            region_mask: `(B, N)` 1 for real regions.
        """
        w_text, w_region, w_product = self.alignment_weight.split(text.shape[-1])
        scores = (  # W [x; y; x * y] without materialising the (B, T, N, 3h) concatenation
            (text @ w_text)[:, :, None]
            + (regions @ w_region)[:, None, :]
            + torch.einsum("bth,bnh->btn", text * w_product, regions)
            + self.alignment_bias
        )
        scores = scores.masked_fill(~region_mask.bool()[:, None, :], torch.finfo(scores.dtype).min)
        return text + scores.softmax(dim=-1) @ regions


def _split_heads(states: torch.Tensor, heads: int) -> torch.Tensor:
    # (B, T, hidden) -> (B, heads, T, hidden / heads)
    return states.view(states.shape[0], states.shape[1], heads, -1).transpose(1, 2)


def _merge_heads(states: torch.Tensor) -> torch.Tensor:
    # (B, heads, T, head_dim) -> (B, T, heads * head_dim)
    return states.transpose(1, 2).reshape(states.shape[0], states.shape[2], -1)


class XGPTAoARefiner(nn.Module):
    """The AoA refining layer (appendix A.1): x' = LayerNorm(x + AoA(f_att, W_q x, W_k x, W_v x)) with
    AoA = sigmoid(W1 Q + W2 f + b1) * (W3 Q + W4 f + b2), f the multi-head attention of Q over K, V (no output
    projection: AoA takes its place, as in AoANet). W1..W4 are one `Linear(2h, 2h)` over [f; Q] followed by a GLU.

    Args:
        config: The model configuration (`hidden_size`, `num_attention_heads`, dropouts).
    """

    def __init__(self, config: XGPTConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.aoa = nn.Linear(2 * hidden, 2 * hidden)  # [information (W3, W4, b2); gate (W1, W2, b1)]
        self.norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.attention_dropout = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, regions: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """Refine `(B, N, hidden)` regions; `key_mask` `(B, 1, 1, N)` is False on padding regions."""
        query = self.q_proj(regions)
        attended = F.scaled_dot_product_attention(
            _split_heads(query, self.num_heads),
            _split_heads(self.k_proj(regions), self.num_heads),
            _split_heads(self.v_proj(regions), self.num_heads),
            attn_mask=key_mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
        )
        aoa = F.glu(self.aoa(torch.cat([_merge_heads(attended), query], dim=-1)), dim=-1)
        return self.norm(regions + self.dropout(aoa))


class XGPTAttention(nn.Module):
    """Multi-head attention whose keys/values are given by the caller, so one module serves as self-attention,
    encoder-decoder attention and the shared attention over [memory; caption prefix].

    Args:
        config: The model configuration.
        memory_signal: Learn the `"key_value"` encoder signal: a vector added to the keys and one added to the values
            that come from the encoder memory.
    """

    _no_weight_decay = ("memory_key_signal", "memory_value_signal")  # learned offsets, like biases: not decayed

    def __init__(self, config: XGPTConfig, *, memory_signal: bool = False) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.dropout = config.attention_probs_dropout_prob
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        if memory_signal:
            self.memory_key_signal = nn.Parameter(torch.zeros(hidden))
            self.memory_value_signal = nn.Parameter(torch.zeros(hidden))
        else:
            self.memory_key_signal = self.memory_value_signal = None

    def keys_values(self, states: torch.Tensor, *, memory: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, heads, T, head_dim)` keys and values of `(B, T, hidden)` states; `memory` adds the encoder signal."""
        keys, values = self.k_proj(states), self.v_proj(states)
        if memory and self.memory_key_signal is not None:
            keys, values = keys + self.memory_key_signal, values + self.memory_value_signal
        return _split_heads(keys, self.num_heads), _split_heads(values, self.num_heads)

    def forward(
        self,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
        return_attention: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend `(B, T, hidden)` queries to keys/values; `mask` (broadcastable to `(B, heads, T, K)`) is True
        where attention is allowed. With `return_attention`, the attention runs unfused (only when asked:
        `output_attentions=True`) and its probabilities `(B, heads, T, K)` (fp32, before dropout) come back too."""
        query = _split_heads(self.q_proj(hidden_states), self.num_heads)
        if return_attention:
            attended, probs = self._attend_unfused(query, keys, values, mask)
            return self.o_proj(_merge_heads(attended)), probs
        attended = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.o_proj(_merge_heads(attended))

    def _attend_unfused(self, query, keys, values, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention `scaled_dot_product_attention` computes, step by step, returning its probabilities too."""
        scores = torch.matmul(query.float(), keys.float().transpose(-1, -2)) / math.sqrt(query.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        weights = F.dropout(probs, p=self.dropout, training=self.training).to(values.dtype)
        return torch.matmul(weights, values), probs


def split_shared_attention(probs: torch.Tensor, memory_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split an attention over `[memory; caption prefix]` into its two parts, each renormalised to rows of 1.

    Args:
        probs: `(B, heads, T, memory_length + past + T)` attention probabilities.
        memory_length: How many of the keys are memory positions (they come first).

    Returns:
        `(prefix attention (B, heads, T, past + T), memory attention (B, heads, T, N), memory share (B, heads, T))`.
    """
    memory, prefix = probs[..., :memory_length], probs[..., memory_length:]
    share = memory.sum(dim=-1)
    tiny = torch.finfo(probs.dtype).tiny
    memory = memory / share.clamp(min=tiny).unsqueeze(-1)
    prefix = prefix / prefix.sum(dim=-1, keepdim=True).clamp(min=tiny)
    return prefix, memory, share


class XGPTLayer(GradientCheckpointingLayer):
    """One post-LayerNorm Transformer layer, used as an encoder layer (bidirectional self-attention) or as a decoder
    layer: with `cross_attention`, a causal self-attention then an encoder-decoder attention (`encdec`); without, one
    attention over [memory; caption prefix] (`encdec_share`, `enc`).

    Args:
        config: The model configuration.
        layer_idx: Index of the layer in its stack (its slot in the generation cache).
        cross_attention: Give the layer a separate encoder-decoder attention (`encdec` decoder layers).
        memory_signal: Learn the `"key_value"` encoder signal in the (shared) attention.
    """

    def __init__(self, config: XGPTConfig, layer_idx: int, *, cross_attention: bool, memory_signal: bool) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.layer_idx = layer_idx
        self.attention = XGPTAttention(config, memory_signal=memory_signal)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.cross_attention = XGPTAttention(config) if cross_attention else None
        self.cross_attention_norm = nn.LayerNorm(hidden, eps=eps) if cross_attention else None
        self.fc1 = nn.Linear(hidden, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        memory_states: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Run the layer.

        Args:
            hidden_states: `(B, T, hidden)` regions (encoder) or caption tokens (decoder).
            attention_mask: Boolean, True where attention is allowed: `(B, 1, 1, T)` over regions (encoder), or
                `(B, 1, T, keys)` causal over the caption (decoder; keys: past + T, or a static cache's whole buffer).
            memory_states: `(B, N, hidden)` the memory this layer reads (decoder); None runs the layer as an encoder.
            memory_mask: `(B, 1, 1, N)` boolean, False on padding regions.
            past_key_values: The generation cache: caption keys/values in its self-attention part, the memory's keys
                and values (projected once) in its cross-attention part.
            output_attentions: Also return the attention probabilities (computed unfused, so only when asked).

        Returns:
            The new states; with `output_attentions`, `(states, self_attention, memory_attention, memory_share)`:
            the attention over the layer's own sequence (`(B, heads, T, T)` regions, or `(B, heads, T, keys)` the
            caption prefix), over the memory `(B, heads, T, N)` (None for an encoder layer) and the share of
            the attention that went to the memory `(B, heads, T)`. The shared attention over [memory; prefix] is
            split in two, each part renormalised to sum to 1 (as a separate self- and cross-attention's rows do);
            the share says how the row divided its attention before that (an `encdec` layer's share is 1).
        """
        record = bool(output_attentions)
        keys, values = self.attention.keys_values(hidden_states)
        if memory_states is None:
            attended, probs = self._attend(self.attention, hidden_states, keys, values, attention_mask, record)
            hidden_states = self._feed_forward(self.attention_norm(hidden_states + self.dropout(attended)))
            return (hidden_states, probs, None, None) if record else hidden_states
        if past_key_values is not None:
            # a static cache returns its whole buffer, which the mask covers (`caption_mask`'s key_length)
            keys, values = past_key_values.self_attention_cache.update(keys, values, self.layer_idx)
        if self.cross_attention is None:  # one attention over [memory; caption prefix]
            memory_keys, memory_values = self._memory_keys_values(self.attention, memory_states, past_key_values)
            keys, values = torch.cat([memory_keys, keys], dim=2), torch.cat([memory_values, values], dim=2)
            mask = torch.cat([memory_mask.expand(-1, -1, attention_mask.shape[2], -1), attention_mask], dim=-1)
            attended, probs = self._attend(self.attention, hidden_states, keys, values, mask, record)
            hidden_states = self._feed_forward(self.attention_norm(hidden_states + self.dropout(attended)))
            return (hidden_states, *split_shared_attention(probs, memory_keys.shape[2])) if record else hidden_states
        attended, self_probs = self._attend(self.attention, hidden_states, keys, values, attention_mask, record)
        hidden_states = self.attention_norm(hidden_states + self.dropout(attended))
        memory_keys, memory_values = self._memory_keys_values(self.cross_attention, memory_states, past_key_values)
        attended, memory_probs = self._attend(
            self.cross_attention, hidden_states, memory_keys, memory_values, memory_mask, record
        )
        hidden_states = self._feed_forward(self.cross_attention_norm(hidden_states + self.dropout(attended)))
        if not record:
            return hidden_states
        return hidden_states, self_probs, memory_probs, memory_probs.new_ones(memory_probs.shape[:3])

    @staticmethod
    def _attend(attention: XGPTAttention, states, keys, values, mask, record: bool):
        """`(attended, probabilities or None)`: the fused attention, or the unfused one when `record`."""
        if record:
            return attention(states, keys, values, mask, return_attention=True)
        return attention(states, keys, values, mask), None

    def _feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        update = self.fc2(self.activation(self.fc1(hidden_states)))
        return self.ffn_norm(hidden_states + self.dropout(update))

    def _memory_keys_values(
        self, attention: XGPTAttention, memory_states: torch.Tensor, cache: EncoderDecoderCache | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The memory's keys/values for this layer, projected at the first decoding step and cached after."""
        if cache is not None and cache.is_updated.get(self.layer_idx):
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            return layer.keys, layer.values
        keys, values = attention.keys_values(memory_states, memory=True)
        if cache is not None:
            keys, values = cache.cross_attention_cache.update(keys, values, self.layer_idx)
            cache.is_updated[self.layer_idx] = True
        return keys, values


# --------------------------------------------------------------------------------------------------------------
# Encoder, decoder, model
# --------------------------------------------------------------------------------------------------------------
class XGPTPreTrainedModel(PreTrainedModel):
    """Weight initialisation (BERT's: normal(0, initializer_range), zero biases) and loading glue of the XGPT
    models."""

    config: XGPTConfig
    config_class = XGPTConfig
    base_model_prefix = "model"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["XGPTLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, XGPTAttention) and module.memory_key_signal is not None:
            init.normal_(module.memory_key_signal, mean=0.0, std=std)
            init.normal_(module.memory_value_signal, mean=0.0, std=std)
        elif isinstance(module, XGPTEncoderText):
            module.reset_parameters(std)
        elif isinstance(module, XGPTModel) and module.memory_type_embedding is not None:
            init.normal_(module.memory_type_embedding, mean=0.0, std=std)


class XGPTEncoder(nn.Module):
    """The image side: regions (from the frozen vision tower or given), their embedding, the AoA refining layer and
    the encoder stack (in `encdec_share` and `enc`, the one stack the decoder shares). `generate` runs it once per
    call (`get_encoder()`); its output is the visual memory, expanded for the beams.

    Args:
        config: The model configuration.
        vision_model: A vision tower to use instead of building one from `config.vision_config`.
    """

    main_input_name = "pixel_values"

    def __init__(self, config: XGPTConfig, vision_model: PreTrainedModel | None = None) -> None:
        super().__init__()
        self.config = config
        if vision_model is not None and not config.has_vision_tower:
            raise ValueError("visual_source='regions' reads precomputed region features: it takes no vision_model")
        if config.has_vision_tower and vision_model is None:
            vision_model = AutoModel.from_config(config.vision_config)
        self.vision_model = vision_model
        self.region_embedding = XGPTRegionEmbedding(config)
        self.refiner = XGPTAoARefiner(config) if config.use_aoa_refiner else None
        self.text = XGPTEncoderText(config)
        signal = config.architecture != "encdec" and config.resolved_encoder_signal == "key_value"
        self.layers = nn.ModuleList(
            XGPTLayer(config, index, cross_attention=False, memory_signal=signal)
            for index in range(config.num_hidden_layers)
        )

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        vision_hidden_states: torch.Tensor | None = None,
        region_features: torch.Tensor | None = None,
        region_boxes: torch.Tensor | None = None,
        region_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        text_embeds: torch.Tensor | None = None,
        text_mask: torch.Tensor | None = None,
        align_text: bool = False,
    ) -> XGPTEncoderOutput | tuple:
        """Encode the regions of a batch of images, and for the pre-training tasks caption tokens after them (IMLM,
        IDA: the memory is `[regions; text]`) or instead of them (TIFG: no image input, the memory is the text).

        Args:
            pixel_values: `(B, 3, H, W)` images (`visual_source` `"grid"` or `"boxes"`).
            vision_hidden_states: `(B, tokens, D)` the vision tower's last hidden state instead of `pixel_values`
                (e.g. from a feature cache; a convolutional tower's `(B, D, rows, cols)` feature map is taken too).
            region_features: `(B, N, region_feature_size)` precomputed region features (`visual_source="regions"`).
            region_boxes: `(B, N, 4)` normalised x1, y1, x2, y2 of the regions (`"boxes"` and `"regions"`).
            region_mask: `(B, N)` 1 for real regions, 0 for padding (default: all real).
            output_attentions: Also return each layer's self-attention over the memory positions,
                `(B, heads, N, N)` (computed unfused, so only when asked).
            output_hidden_states: Also return the region states entering each layer.
            return_dict: `False` returns a tuple.
            text_embeds: `(B, T, hidden)` embedded caption tokens (`XGPTModel.embed_encoder_text`), encoded after the
                regions (bidirectionally, like them), or alone when no image input is given.
            text_mask: `(B, T)` 1 for tokens, 0 for padding (default: all tokens).
            align_text: Add IDA's attention-driven matching to the text (needs regions).

        Returns:
            `XGPTEncoderOutput`: the memory, its mask and, for `enc`, the states of every layer.
        """
        has_image = any(x is not None for x in (pixel_values, vision_hidden_states, region_features))
        if text_embeds is not None and not has_image:
            if align_text:
                raise ValueError("align_text matches words with regions: pass the image inputs too")
            states, mask = text_embeds, self._text_mask(text_embeds, text_mask)
        else:
            states, mask, projected = self._region_states(
                pixel_values, vision_hidden_states, region_features, region_boxes, region_mask
            )
            if text_embeds is not None:  # IDA matches the words with the regions' x^I, before refining (section 4.3)
                text = self.text.align(text_embeds, projected, mask) if align_text else text_embeds
                states = torch.cat([states, text], dim=1)
                mask = torch.cat([mask, self._text_mask(text_embeds, text_mask).to(mask.dtype)], dim=1)
        key_mask = mask.bool()[:, None, None, :]
        layer_inputs, attentions = [], []
        for layer in self.layers:
            layer_inputs.append(states)
            if output_attentions:
                states, probs, _, _ = layer(states, key_mask, output_attentions=True)
                attentions.append(probs)
            else:
                states = layer(states, key_mask)
        output = XGPTEncoderOutput(
            last_hidden_state=states,
            hidden_states=(*layer_inputs, states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            memory_mask=mask,
            memory_per_layer=torch.stack(layer_inputs, dim=1) if self.config.architecture == "enc" else None,
        )
        return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()

    # ---------------------------------------------------------------- regions
    def embed_regions(
        self, pixel_values=None, vision_hidden_states=None, region_features=None, region_boxes=None, region_mask=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, N, hidden)` embedded (and AoA-refined) regions and their `(B, N)` mask, the encoder layers' input."""
        states, mask, _ = self._region_states(
            pixel_values, vision_hidden_states, region_features, region_boxes, region_mask
        )
        return states, mask

    def _region_states(
        self, pixel_values, vision_hidden_states, region_features, region_boxes, region_mask
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`embed_regions`' states and mask, and the embedded regions before the AoA refiner (the paper's x^I)."""
        features, boxes, mask = self.regions(
            pixel_values, vision_hidden_states, region_features, region_boxes, region_mask
        )
        projected = self.region_embedding(features, boxes)
        states = projected if self.refiner is None else self.refiner(projected, mask.bool()[:, None, None, :])
        return states, mask, projected

    @torch.no_grad()
    def region_targets(
        self, pixel_values=None, vision_hidden_states=None, region_features=None, region_boxes=None, region_mask=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TIFG's regression target: the regions' projected representation (no dropout, no gradient) and their mask.

        The target carries no gradient: regressed onto a projection that still learns, the loss would fall by
        shrinking the projection (a collapse), not by generating image features.
        """
        features, boxes, mask = self.regions(
            pixel_values, vision_hidden_states, region_features, region_boxes, region_mask
        )
        return self.region_embedding.project(features, boxes).detach(), mask

    @staticmethod
    def _text_mask(text_embeds: torch.Tensor, text_mask: torch.Tensor | None) -> torch.Tensor:
        if text_mask is None:
            return torch.ones(text_embeds.shape[:2], dtype=torch.long, device=text_embeds.device)
        if text_mask.shape != text_embeds.shape[:2]:
            raise ValueError(
                f"encoder_attention_mask has shape {tuple(text_mask.shape)}; expected {tuple(text_embeds.shape[:2])}"
            )
        return text_mask

    def regions(
        self,
        pixel_values: torch.Tensor | None,
        vision_hidden_states: torch.Tensor | None,
        region_features: torch.Tensor | None,
        region_boxes: torch.Tensor | None,
        region_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The regions of a batch as `(features (B, N, F), boxes (B, N, 4), mask (B, N))`, from whichever input the
        model's `visual_source` reads (see `forward`).

        Raises:
            ValueError: when the inputs do not match the visual source; the message says what to pass.
        """
        source = self.config.visual_source
        if source == "regions":
            if pixel_values is not None or vision_hidden_states is not None:
                raise ValueError(
                    "This XGPT model reads precomputed regions (visual_source='regions') and has no vision tower: "
                    "pass region_features and region_boxes instead of images"
                )
            if region_features is None or region_boxes is None:
                raise ValueError(
                    "visual_source='regions': pass region_features (batch, regions, "
                    f"{self.config.region_feature_size}) and region_boxes (batch, regions, 4)"
                )
            return self._checked(region_features, region_boxes, region_mask)
        if region_features is not None:
            raise ValueError(
                f"This XGPT model takes its regions from its vision tower (visual_source={source!r}): pass "
                "pixel_values or vision_hidden_states, not region_features"
            )
        if vision_hidden_states is not None:  # a feature map as the tower gives it, or its cells as tokens
            vision_states = as_vision_tokens(vision_hidden_states)
        else:
            vision_states = self.encode_images(pixel_values)
        if vision_states.dim() != 3 or vision_states.shape[-1] != self.config.region_feature_size:
            raise ValueError(
                f"The vision states have shape {tuple(vision_states.shape)}; expected (batch, tokens, "
                f"{self.config.region_feature_size}), the last hidden state of this model's vision tower"
            )
        cls, patches = self._global_and_patches(vision_states)
        if source == "boxes":
            if region_boxes is None:
                raise ValueError(
                    "visual_source='boxes': pass region_boxes (batch, regions, 4), normalised x1, y1, x2, y2 (the "
                    "processor's boxes=) with the images"
                )
            if region_boxes.dim() != 3 or region_boxes.shape[0] != patches.shape[0] or region_boxes.shape[-1] != 4:
                raise ValueError(
                    f"region_boxes have shape {tuple(region_boxes.shape)}; expected ({patches.shape[0]}, regions, 4): "
                    "one list of normalised x1, y1, x2, y2 per image"
                )
            features, boxes, mask = self._checked(pool_in_boxes(patches, region_boxes), region_boxes, region_mask)
        else:
            if region_boxes is not None or region_mask is not None:
                raise ValueError(
                    "visual_source='grid' pools the patch tokens on a fixed grid and takes no region_boxes or "
                    "region_mask; a model that reads boxes is built with visual_source='boxes'"
                )
            features, boxes = self._grid_regions(patches)
            mask = torch.ones(boxes.shape[:2], dtype=torch.long, device=boxes.device)
        if self.config.use_cls_region:
            features, boxes, mask = self._prepend_cls(cls, features, boxes, mask)
        return features, boxes, mask

    def _global_and_patches(self, vision_states: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The image's global vector (a ViT's CLS token; a convolutional tower's mean cell, as ResNet pools it; None
        for a tower without either, e.g. SigLIP) and the patches `(B, rows, cols, D)`."""
        if self.config.reads_feature_map:
            _, patches = patch_grid(vision_states, has_cls=False)
            return patches.mean(dim=(1, 2)), patches
        tokens = vision_states.shape[1]
        return patch_grid(vision_states, has_cls=math.isqrt(tokens) ** 2 != tokens)

    def encode_images(self, pixel_values: torch.Tensor | None) -> torch.Tensor:
        """The vision tower's last hidden state `(B, tokens, D)` (without autograd while the tower is frozen); a
        convolutional tower's feature map as its cells in row-major order (`as_vision_tokens`).

        Args:
            pixel_values: `(B, 3, H, W)` images as produced by the image processor.
        """
        if pixel_values is None:
            raise ValueError(
                "Pass pixel_values (images through the processor), vision_hidden_states (the vision tower's last "
                "hidden state, e.g. from a feature cache) or encoder_outputs (the XGPT encoder's output)"
            )
        tower = self.vision_model
        trainable = any(p.requires_grad for p in tower.parameters())
        with torch.set_grad_enabled(torch.is_grad_enabled() and trainable):
            dtype = next(tower.parameters()).dtype
            states = tower(pixel_values=check_pixel_values(pixel_values).to(dtype), return_dict=True).last_hidden_state
            return as_vision_tokens(states)

    def _grid_regions(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, rows, cols, width = patches.shape
        size = self.config.grid_size
        if size is None or size == rows == cols:  # one region per patch
            boxes = grid_boxes(rows, cols, device=patches.device, dtype=patches.dtype)
            return patches.reshape(batch, rows * cols, width), boxes.expand(batch, -1, -1)
        boxes = grid_boxes(size, size, device=patches.device, dtype=patches.dtype).expand(batch, -1, -1)
        return pool_in_boxes(patches, boxes), boxes

    def _prepend_cls(self, cls, features, boxes, mask):
        if cls is None:
            raise ValueError(
                "use_cls_region=True, but the vision tower has no CLS token (e.g. SigLIP): set use_cls_region=False"
            )
        whole = boxes.new_tensor([0.0, 0.0, 1.0, 1.0]).expand(boxes.shape[0], 1, 4)
        return (
            torch.cat([cls.unsqueeze(1).to(features.dtype), features], dim=1),
            torch.cat([whole, boxes], dim=1),
            torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1),
        )

    def _checked(self, features, boxes, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = self.config.region_feature_size
        if features.dim() != 3 or features.shape[-1] != width:
            raise ValueError(f"Region features have shape {tuple(features.shape)}; expected (batch, regions, {width})")
        if boxes.shape != (*features.shape[:2], 4):
            raise ValueError(
                f"region_boxes have shape {tuple(boxes.shape)}; expected {(*features.shape[:2], 4)}: one normalised "
                "x1, y1, x2, y2 per region"
            )
        if mask is None:
            mask = torch.ones(features.shape[:2], dtype=torch.long, device=features.device)
        elif mask.shape != features.shape[:2]:
            raise ValueError(f"region_mask has shape {tuple(mask.shape)}; expected {tuple(features.shape[:2])}")
        elif not bool(mask.bool().any(dim=-1).all()):
            raise ValueError("Every image needs at least one region: a row of region_mask is all zeros")
        return features, boxes, mask


class XGPTDecoder(nn.Module):
    """The text side: token and position embeddings (summed, paper section 3, then LayerNorm and dropout as in BERT)
    and, for `encdec` only, the decoder's own layers; the other architectures decode with the encoder's layers.

    Args:
        config: The model configuration.
    """

    def __init__(self, config: XGPTConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = (
            nn.ModuleList(
                XGPTLayer(config, index, cross_attention=True, memory_signal=False)
                for index in range(config.num_hidden_layers)
            )
            if config.architecture == "encdec"
            else None
        )

    def forward(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """`(B, T, hidden)` embeddings of caption tokens (or of given token embeddings) at `position_ids`."""
        embeddings = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self.dropout(self.norm(embeddings + self.embed_positions(position_ids)))


def caption_mask(
    attention_mask: torch.Tensor | None,
    past: int | torch.Tensor,
    length: int,
    batch: int,
    device: torch.device,
    key_length: int | None = None,
) -> torch.Tensor:
    """`(B, 1, length, keys)` boolean mask of the caption's self-attention: causal, without padding keys,
    and every token always sees itself (so a left-padding row never attends to nothing).

    Args:
        attention_mask: `(B, past + length)` 1 for tokens, 0 for padding; None: no padding.
        past: Tokens already in the cache (a static cache counts them in a tensor, which a compiled decode step
            reads without a data-dependent shape).
        length: New tokens.
        batch: Batch size.
        device: Device of the mask.
        key_length: The keys the layers attend over: a static cache's whole buffer (its slots past the newest token
            are masked as future ones); None: `past + length`.
    """
    total = past + length if key_length is None else key_length
    queries = torch.arange(length, device=device)[:, None] + past
    keys = torch.arange(total, device=device)[None, :]
    allowed = (keys <= queries)[None, None].expand(batch, 1, length, total)
    if attention_mask is None:
        return allowed
    # a compiled step cannot read a tensor count without a data-dependent branch: its mask is generate()'s own
    counted = not (isinstance(past, torch.Tensor) and torch.compiler.is_compiling())
    expected = int(past) + length if counted else None
    if attention_mask.shape[0] != batch or (counted and attention_mask.shape[-1] != expected):
        raise ValueError(
            f"decoder_attention_mask has shape {tuple(attention_mask.shape)}; expected (batch {batch}, cached and new "
            f"caption tokens {expected})"
        )
    if attention_mask.shape[-1] < total:  # a static buffer's unused slots: padding
        attention_mask = F.pad(attention_mask, (0, total - attention_mask.shape[-1]))
    return (allowed & attention_mask.bool()[:, None, None, :]) | (keys == queries)


class XGPTModel(XGPTPreTrainedModel):
    """The XGPT Transformer without its LM head: encoder (regions -> memory) and decoder (caption -> hidden states).

    Args:
        config: The model configuration.
        vision_model: A vision tower to use instead of building one from `config.vision_config`.
    """

    _no_weight_decay = ("memory_type_embedding",)  # a type embedding (the memory's segment): not decayed

    def __init__(self, config: XGPTConfig, vision_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        self.encoder = XGPTEncoder(config, vision_model)
        self.decoder = XGPTDecoder(config)
        embedding_signal = config.architecture != "encdec" and config.resolved_encoder_signal == "embedding"
        self.memory_type_embedding = nn.Parameter(torch.zeros(config.hidden_size)) if embedding_signal else None
        self.post_init()

    @property
    def encoder_layers(self) -> nn.ModuleList:
        """The layers that encode the regions."""
        return self.encoder.layers

    @property
    def decoder_layers(self) -> nn.ModuleList:
        """The layers that decode the caption: the encoder's own (`encdec_share`, `enc`) or the decoder's (`encdec`)."""
        return self.decoder.layers if self.decoder.layers is not None else self.encoder.layers

    @property
    def vision_model(self) -> PreTrainedModel | None:
        """The frozen vision tower (None for `visual_source="regions"`)."""
        return self.encoder.vision_model

    def get_encoder(self, modality: str | None = None) -> XGPTEncoder:
        return self.encoder

    def get_decoder(self) -> XGPTDecoder:
        return self.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.decoder.embed_tokens = value

    def embed_encoder_text(self, input_ids: torch.LongTensor, masked: torch.Tensor | None = None) -> torch.Tensor:
        """`(B, T, hidden)` encoder-side embeddings of caption tokens (the pre-training tasks' text input): the
        decoder's token and position embeddings (shared), the [MASK] embedding where `masked`, the text segment.

        Args:
            input_ids: `(B, T)` token ids (positions 0..T-1).
            masked: `(B, T)` True where the token is [MASK] (its id is then ignored).
        """
        decoder = self.decoder
        embeds = decoder.embed_tokens(input_ids)
        if masked is not None:
            embeds = torch.where(masked.bool()[..., None], self.encoder.text.mask_embedding.to(embeds.dtype), embeds)
        limit = self.config.max_position_embeddings
        if input_ids.shape[1] > limit:
            raise ValueError(f"encoder_input_ids have {input_ids.shape[1]} tokens; the model has {limit} positions")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        embeds = embeds + decoder.embed_positions(positions) + self.encoder.text.segment
        return decoder.dropout(decoder.norm(embeds))

    def as_encoder_outputs(self, encoder_outputs) -> XGPTEncoderOutput:
        """A new `XGPTEncoderOutput` from given encoder outputs (an `XGPTEncoderOutput`, a `BaseModelOutput`, a tuple
        whose first element is the memory, or a `(B, N, hidden)` memory tensor), checked against the model.

        Args:
            encoder_outputs: What `get_encoder()(...)` returned, or the memory alone.

        Raises:
            ValueError: on a memory of the wrong width, or a bare memory for `enc` (which needs every layer's regions).
        """
        if isinstance(encoder_outputs, torch.Tensor):
            encoder_outputs = XGPTEncoderOutput(last_hidden_state=encoder_outputs)
        elif isinstance(encoder_outputs, (tuple, list)):  # a tuple drops its None fields: only the first is known
            encoder_outputs = XGPTEncoderOutput(last_hidden_state=encoder_outputs[0])
        encoder_outputs = XGPTEncoderOutput(**encoder_outputs)
        memory = encoder_outputs.last_hidden_state
        if memory is None or memory.dim() != 3 or memory.shape[-1] != self.config.hidden_size:
            shape = None if memory is None else tuple(memory.shape)
            raise ValueError(
                f"encoder_outputs.last_hidden_state has shape {shape}; expected (batch, regions, "
                f"{self.config.hidden_size}), the output of model.get_encoder()"
            )
        if self.config.architecture == "enc" and encoder_outputs.memory_per_layer is None:
            raise ValueError(
                "architecture='enc' decodes from the regions of every layer: pass the XGPTEncoderOutput of "
                "model.get_encoder() as it is (its memory_per_layer), not the last hidden state alone"
            )
        return encoder_outputs

    @accepts_old_cache_name
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        vision_hidden_states: torch.Tensor | None = None,
        region_features: torch.Tensor | None = None,
        region_boxes: torch.Tensor | None = None,
        region_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        encoder_outputs: XGPTEncoderOutput | BaseModelOutput | tuple | torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        encoder_input_ids: torch.LongTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        encoder_masked_tokens: torch.Tensor | None = None,
        align_encoder_text: bool = False,
    ) -> Seq2SeqModelOutput | tuple:
        """Encode the regions (unless `encoder_outputs` are given) and decode the caption.

        Args:
            pixel_values, vision_hidden_states, region_features, region_boxes, region_mask: The image, as
                [`XGPTEncoder.forward`] takes it.
            decoder_input_ids: `(B, T)` caption tokens, BOS first.
            decoder_attention_mask: `(B, past + T)` 1 for tokens, 0 for (left) padding.
            decoder_position_ids: Explicit positions; derived from `decoder_attention_mask` when omitted.
            decoder_inputs_embeds: Token embeddings instead of `decoder_input_ids`.
            encoder_outputs: The encoder's output (the visual memory), e.g. from an earlier call: the image inputs
                are then ignored.
            cache: The generation cache (`EncoderDecoderCache`); created when `use_cache` and absent.
                `past_key_values`, its name before transformers 5.24, is taken too (deprecated from 5.24 on).
            use_cache: Return the cache (default: `config.use_cache`).
            output_attentions: Also return the attention probabilities (see [`XGPTCaptioningOutput`]).
            output_hidden_states: Also return the hidden states entering each layer and the final ones.
            return_dict: `False` returns a tuple.
            encoder_input_ids: `(B, T)` caption tokens for the encoder (the pre-training tasks IMLM, IDA: after the
                regions; TIFG: without image inputs, alone).
            encoder_attention_mask: `(B, T)` 1 for those tokens, 0 for padding.
            encoder_masked_tokens: `(B, T)` True where the encoder token is [MASK].
            align_encoder_text: Add IDA's attention-driven image-text matching to the encoder text.
        """
        if encoder_outputs is None:
            encoder_outputs = self._encode(
                (pixel_values, vision_hidden_states, region_features, region_boxes, region_mask),
                (encoder_input_ids, encoder_attention_mask, encoder_masked_tokens, align_encoder_text),
                output_attentions, output_hidden_states,
            )  # fmt: skip
        encoder_outputs = self.as_encoder_outputs(encoder_outputs)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        states, all_states, attentions = self.decode(
            encoder_outputs,
            decoder_input_ids,
            decoder_inputs_embeds,
            decoder_attention_mask,
            decoder_position_ids,
            cache if use_cache else None,
            bool(output_hidden_states),
            bool(output_attentions),
        )
        decoder_attentions, cross_attentions, memory_shares = attentions or (None, None, None)
        output = XGPTModelOutput(
            last_hidden_state=states,
            **{OUTPUT_CACHE_FIELD: cache if use_cache else None},
            decoder_hidden_states=all_states,
            decoder_attentions=decoder_attentions,
            cross_attentions=cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions if output_attentions else None,
            memory_shares=memory_shares,
        )
        return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()

    def _encode(
        self, image: tuple, text: tuple, output_attentions: bool | None, output_hidden_states: bool | None
    ) -> XGPTEncoderOutput:
        """The encoder on the image inputs (as `forward` takes them) and the optional encoder text (input ids,
        attention mask, masked tokens, whether to align it to the regions)."""
        input_ids, attention_mask, masked_tokens, align = text
        embeds = None if input_ids is None else self.embed_encoder_text(input_ids, masked_tokens)
        return self.encoder(
            *image, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            text_embeds=embeds, text_mask=attention_mask, align_text=align, return_dict=True,
        )  # fmt: skip

    def decode(
        self,
        encoder_outputs: XGPTEncoderOutput,
        input_ids: torch.LongTensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.LongTensor | None,
        cache: EncoderDecoderCache | None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[tuple[torch.Tensor, ...], ...] | None]:
        """Run the decoder over the caption tokens given the memory.

        Returns:
            The final hidden states `(B, T, hidden)`; the states entering each layer plus the final ones when
            `output_hidden_states`; when `output_attentions`, per layer the attention over the caption prefix, over
            the memory and the memory's share (see `XGPTLayer.forward`), as three tuples.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of decoder_input_ids (BOS first), decoder_inputs_embeds, or labels")
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        memory = encoder_outputs.last_hidden_state
        if memory.shape[0] != batch:
            raise ValueError(f"Batch size mismatch: {memory.shape[0]} images but {batch} caption sequences")
        past = cache.get_seq_length() if cache is not None else 0  # a static cache's is a tensor
        # the keys the layers see: past + length, or a static cache's whole buffer (a fixed shape for every step)
        key_length = cache.self_attention_cache.get_mask_sizes(length, 0)[0] if cache is not None else length
        position_ids = self._positions(position_ids, attention_mask, past, length, batch, memory.device)
        text_mask = caption_mask(attention_mask, past, length, batch, memory.device, key_length)  # checks the mask
        states = self.decoder(input_ids, inputs_embeds, position_ids)
        memory_mask = encoder_outputs.memory_mask
        if memory_mask is None:
            memory_mask = torch.ones(memory.shape[:2], dtype=torch.long, device=memory.device)
        memory_mask = memory_mask.bool()[:, None, None, :]
        all_states = [states] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for index, layer in enumerate(self.decoder_layers):
            memory_states = self._layer_memory(encoder_outputs, index)
            if attentions is None:
                states = layer(states, text_mask, memory_states, memory_mask, past_key_values=cache)
            else:
                states, *probs = layer(
                    states, text_mask, memory_states, memory_mask, past_key_values=cache, output_attentions=True
                )
                attentions.append(probs)
            if all_states is not None:
                all_states.append(states)
        all_states = tuple(all_states) if all_states is not None else None
        return states, all_states, (tuple(zip(*attentions)) if attentions is not None else None)

    def _layer_memory(self, encoder_outputs: XGPTEncoderOutput, index: int) -> torch.Tensor:
        """The memory decoder layer `index` reads: the regions of that layer (`enc`) or the encoder output, plus the
        `"embedding"` encoder signal."""
        if self.config.architecture == "enc":
            memory = encoder_outputs.memory_per_layer[:, index]
        else:
            memory = encoder_outputs.last_hidden_state
        if self.memory_type_embedding is not None:
            memory = memory + self.memory_type_embedding
        return memory

    def _positions(self, position_ids, attention_mask, past, length, batch, device) -> torch.Tensor:
        """Caption positions: given, or counted over the non-padding tokens, or `past .. past + length - 1`."""
        if position_ids is not None:
            position_ids = position_ids[..., -length:]
        elif attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
        else:
            position_ids = (torch.arange(length, device=device) + past)[None].expand(batch, -1)
        limit = self.config.max_position_embeddings
        # a static cache (a tensor count) is no longer than generate()'s max_length, checked before decoding
        if not isinstance(past, torch.Tensor) and past + length > limit and int(position_ids.max()) >= limit:
            raise ValueError(
                f"The caption reaches position {int(position_ids.max())}, beyond max_position_embeddings={limit} (the "
                f"paper's longest text, BOS included): generate with max_length <= {limit}"
            )
        return position_ids


# --------------------------------------------------------------------------------------------------------------
# The captioning model
# --------------------------------------------------------------------------------------------------------------
# Copied from itune_hf.models._shared.captioning.shift_tokens_right
def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Build decoder inputs from labels: prepend the start token, drop the last label, turn -100 into padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


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


#: The fields of `XGPTModelOutput` that the captioning model's output carries as they are.
_MODEL_OUTPUTS_PASSED_ON = (
    OUTPUT_CACHE_FIELD, "decoder_hidden_states", "decoder_attentions", "cross_attentions", "encoder_last_hidden_state",
    "encoder_hidden_states", "encoder_attentions", "memory_shares",
)  # fmt: skip


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


class XGPTForCaptioning(ImageInputGeneration, XGPTPreTrainedModel, GenerationMixin):
    r"""XGPT image captioning: the [`XGPTModel`] and an LM head tied to the token embeddings.

    It behaves like `VisionEncoderDecoderModel`: `get_encoder()` turns the image into the visual memory once per
    `generate` call (beam search expands the memory, never re-encodes), `encoder_outputs` can replace the image, and
    `labels` give the caption loss. Everything trains except the vision tower, which is frozen.

    Args:
        config: The model configuration.
        vision_model: A vision tower to use instead of building one from `config.vision_config` (e.g. pretrained).

    Example:

    ```python
    >>> from itune_hf import build_model, build_processor
    >>> model, processor = build_model("xgpt-tiny-random"), build_processor("xgpt-tiny-random")
    >>> loss = model(**processor(images=image, captions="a cat on a mat")).loss
    >>> captions = processor.batch_decode(model.generate(**processor(images=image)))  # beam 2, as the paper's test
    ```
    """

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch: gradient accumulation as one large batch

    def __init__(self, config: XGPTConfig, vision_model: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        self.model = XGPTModel(config, vision_model)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()
        self.freeze_vision_tower()
        if self.generation_config is not None:
            # The paper's test decoding: beam search with 2 beams; captions within the 60-token text limit.
            self.generation_config.num_beams = 2
            self.generation_config.max_length = config.max_position_embeddings

    @classmethod
    def from_vision_pretrained(
        cls, vision_model_name_or_path: str, *, vision_kwargs: dict | None = None, **config_kwargs
    ) -> XGPTForCaptioning:
        """A fresh XGPT around a pretrained (frozen) vision tower.

        Args:
            vision_model_name_or_path: Hub id or directory of a vision model; a full CLIP/SigLIP checkpoint is reduced
                to its vision tower (e.g. `"openai/clip-vit-base-patch16"`).
            vision_kwargs: Extra `from_pretrained` arguments for the tower (`revision`, `dtype`, ...).
            **config_kwargs: The other [`XGPTConfig`] fields (`architecture`, `num_hidden_layers`, ...).
        """
        tower = load_vision_tower(vision_model_name_or_path, **(vision_kwargs or {}))
        config = XGPTConfig.from_vision_config(tower.config, **config_kwargs)
        config.vision_config._name_or_path = vision_model_name_or_path
        return cls(config, vision_model=tower)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with the vision tower frozen again (loading materialises parameters
        that require grad).

        Args:
            pretrained_model_name_or_path: Local directory or Hub repo id.
            *model_args, **kwargs: As in `PreTrainedModel.from_pretrained`.
        """
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        model.freeze_vision_tower()
        return loaded

    @property
    def vision_model(self) -> PreTrainedModel | None:
        """The frozen vision tower (None for `visual_source="regions"`)."""
        return self.model.vision_model

    def freeze_vision_tower(self) -> None:
        """Freeze the vision tower (`requires_grad=False`): XGPT trains everything else."""
        if self.vision_model is not None:
            self.vision_model.requires_grad_(False)
            self.vision_model.eval()

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part of the model, each counted once (the tied LM head weight is the token embedding; the
        shared stack is counted once, under `"layers (encoder and decoder)"`).

        Returns:
            `{part: count}` for the parts present: `"vision tower (frozen)"`, `"region embedding"`,
            `"AoA refiner"`, `"encoder text (pre-training)"`, `"layers (encoder and decoder)"` or `"encoder layers"` +
            `"decoder layers"`, `"encoder signal"`, `"text embeddings"`, `"LM head"`.
        """
        shared = self.config.architecture != "encdec"
        parts = (
            ("model.encoder.vision_model.", "vision tower (frozen)"),
            ("model.encoder.region_embedding.", "region embedding"),
            ("model.encoder.refiner.", "AoA refiner"),
            ("model.encoder.text.", "encoder text (pre-training)"),
            ("model.encoder.layers.", "layers (encoder and decoder)" if shared else "encoder layers"),
            ("model.decoder.layers.", "decoder layers"),
            ("model.memory_type_embedding", "encoder signal"),
            ("model.decoder.", "text embeddings"),
            ("lm_head.", "LM head"),
        )
        counts = dict.fromkeys((part for _, part in parts), 0)
        for name, parameter in self.named_parameters():
            part = "encoder signal" if "_signal" in name else next(p for prefix, p in parts if name.startswith(prefix))
            counts[part] += parameter.numel()
        return {part: count for part, count in counts.items() if count}

    def train(self, mode: bool = True) -> XGPTForCaptioning:
        """Set training mode; a frozen vision tower stays in eval mode (it is a fixed feature extractor).

        Args:
            mode: Training (`True`) or evaluation (`False`) mode.
        """
        super().train(mode)
        tower = self.vision_model
        if tower is not None and not any(p.requires_grad for p in tower.parameters()):
            tower.eval()
        return self

    def get_encoder(self, modality: str | None = None) -> XGPTEncoder:
        return self.model.encoder

    def get_decoder(self) -> XGPTDecoder:
        return self.model.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.decoder.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    @accepts_old_cache_name
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        vision_hidden_states: torch.Tensor | None = None,
        region_features: torch.Tensor | None = None,
        region_boxes: torch.Tensor | None = None,
        region_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        encoder_outputs: XGPTEncoderOutput | BaseModelOutput | tuple | torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        encoder_input_ids: torch.LongTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        encoder_masked_tokens: torch.Tensor | None = None,
        align_encoder_text: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> XGPTCaptioningOutput | tuple:
        r"""Caption LM forward pass.

        Args:
            pixel_values: `(B, 3, H, W)` images (`visual_source` `"grid"` or `"boxes"`).
            vision_hidden_states: `(B, tokens, D)` the vision tower's last hidden state instead of the images (e.g.
                from a feature cache; a convolutional tower's `(B, D, rows, cols)` feature map is taken too).
            region_features: `(B, N, region_feature_size)` precomputed region features (`visual_source="regions"`).
            region_boxes: `(B, N, 4)` normalised x1, y1, x2, y2 (`"boxes"`: where to pool; `"regions"`: the boxes
                of the features).
            region_mask: `(B, N)` 1 for real regions, 0 for padding.
            decoder_input_ids: `(B, T)` caption tokens, BOS first. Built from `labels` when omitted.
            decoder_attention_mask: `(B, past + T)` 1 for tokens, 0 for padding.
            decoder_position_ids: Explicit caption positions.
            decoder_inputs_embeds: Token embeddings instead of `decoder_input_ids`.
            encoder_outputs: The visual memory (`model.get_encoder()(...)`) instead of the image inputs.
            cache: The generation cache; `past_key_values`, its name before transformers 5.24, is taken too
                (deprecated from 5.24 on).
            labels: `(B, T)` targets aligned with the decoder positions (`labels[t]` is the token after position `t`),
                -100 where no loss is wanted. Never shifted again here.
            use_cache, output_hidden_states, return_dict: As in transformers.
            output_attentions: Return the attention probabilities (computed unfused, so only when asked), as
                `VisionEncoderDecoderModel` does: see [`XGPTCaptioningOutput`].
            logits_to_keep: Compute logits only for the last `logits_to_keep` positions (0 = all).
            encoder_input_ids, encoder_attention_mask, encoder_masked_tokens, align_encoder_text: Caption tokens
                for the encoder, as the pre-training tasks give them (see [`XGPTModel.forward`] and
                `itune_hf.training.pretraining`).
            num_items_in_batch: The caption tokens of the whole accumulated batch (`Trainer` passes it): the loss is
                then this micro-batch's summed cross-entropy over it.

        Returns:
            `XGPTCaptioningOutput` (a `Seq2SeqLMOutput`) with `loss` (mean cross-entropy over the caption tokens)
            when `labels` is given.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            pixel_values=pixel_values, vision_hidden_states=vision_hidden_states, region_features=region_features,
            region_boxes=region_boxes, region_mask=region_mask,
            decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask,
            decoder_position_ids=decoder_position_ids, decoder_inputs_embeds=decoder_inputs_embeds,
            encoder_outputs=encoder_outputs, cache=cache, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
            encoder_input_ids=encoder_input_ids, encoder_attention_mask=encoder_attention_mask,
            encoder_masked_tokens=encoder_masked_tokens, align_encoder_text=align_encoder_text,
        )  # fmt: skip
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(outputs.last_hidden_state[:, keep])
        output = XGPTCaptioningOutput(
            loss=None if labels is None else caption_loss(logits, labels, num_items_in_batch),
            logits=logits,
            **{name: getattr(outputs, name) for name in _MODEL_OUTPUTS_PASSED_ON},
        )
        return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    # ---------------------------------------------------------------- generation
    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate`: greedy (`num_beams=1`), beam search (the default: 2 beams, the paper's test
        setting) or sampling (`do_sample=True`), batched; captions end at `max_length` (60 tokens, BOS included).

        The image may be `pixel_values`, `vision_hidden_states`, `region_features` (+ `region_boxes`, `region_mask`)
        or `encoder_outputs` (the memory of an earlier `get_encoder()` call; copied, since beam search expands it in
        place).

        Args:
            *args, **kwargs: As in `GenerationMixin.generate` (`num_beams`, `do_sample`, `max_length`,
                `max_new_tokens`, `num_return_sequences`, ...) plus the image inputs of `forward`.
        """
        check_generate_inputs(args, kwargs, ("pixel_values", "vision_hidden_states", "region_features",
                                                     "encoder_outputs"))  # fmt: skip
        callers_length(kwargs)  # a caller's max_length wins, as in every family
        if kwargs.get("encoder_outputs") is not None:
            kwargs["encoder_outputs"] = self.model.as_encoder_outputs(kwargs["encoder_outputs"])
        elif not args and kwargs.get("inputs") is None and kwargs.get("pixel_values") is None:
            kwargs = self._encode_for_generation(kwargs)
        return super().generate(*args, **kwargs)

    def prepare_inputs_for_generation(self, *args, **kwargs) -> dict:
        """`GenerationMixin.prepare_inputs_for_generation`, without the tokenizers that `generate` hands its decoding
        loop for `stop_strings` and token healing (forward takes only its own inputs)."""
        inputs = super().prepare_inputs_for_generation(*args, **kwargs)
        for name in ("tokenizer", "assistant_tokenizer"):
            inputs.pop(name, None)
        return inputs

    def _encode_for_generation(self, kwargs: dict) -> dict:
        """`kwargs` with cached tower states or precomputed regions replaced by the memory they encode to.

        generate() encodes only its main input (`pixel_values`); the memory, once given as `encoder_outputs`, is what
        it expands for beams and reads the batch size from (the public route of transformers' encoder-decoders).
        """
        names = ("vision_hidden_states", "region_features", "region_boxes", "region_mask")
        image = {name: kwargs.pop(name) for name in names if kwargs.get(name) is not None}
        if image.keys() & {"vision_hidden_states", "region_features"}:
            passed = kwargs.get("generation_config")  # its flags count as the keywords do
            outputs = {name: kwargs.get(name, getattr(passed, name, None))
                       for name in ("output_attentions", "output_hidden_states")}  # fmt: skip
            with torch.no_grad():
                kwargs["encoder_outputs"] = self.get_encoder()(**image, **outputs, return_dict=True)
        else:
            kwargs.update(image)  # no image at all: generate() says so
        return kwargs

    def _prepare_generated_length(self, generation_config, has_default_max_length, *args, **kwargs):
        # The model's max_length (its position limit) is a default: a call's max_new_tokens replaces it without
        # transformers' "both max_new_tokens and max_length" warning. A length beyond the limit fails here, before any
        # decoding, rather than at the step that runs out of positions.
        if (
            generation_config.max_new_tokens is not None
            and generation_config.max_length == self.generation_config.max_length
        ):
            has_default_max_length = True
        generation_config = super()._prepare_generated_length(
            generation_config, has_default_max_length, *args, **kwargs
        )
        limit = self.config.max_position_embeddings
        if generation_config.max_length > limit:
            raise ValueError(
                f"Generation would reach {generation_config.max_length} caption tokens (max_length, or the prompt plus "
                f"max_new_tokens); the model has {limit} positions (the paper's maximum text length): ask for fewer"
            )
        return generation_config


__all__ = [
    "POSITION_SIZE",
    "XGPTAoARefiner",
    "XGPTAttention",
    "XGPTCaptioningOutput",
    "XGPTDecoder",
    "XGPTEncoder",
    "XGPTEncoderOutput",
    "XGPTEncoderText",
    "XGPTForCaptioning",
    "XGPTLayer",
    "XGPTModel",
    "XGPTModelOutput",
    "XGPTPreTrainedModel",
    "XGPTRegionEmbedding",
    "box_positions",
    "caption_mask",
    "grid_boxes",
    "load_vision_tower",
    "patch_grid",
    "pool_in_boxes",
    "shift_tokens_right",
    "split_shared_attention",
]
