"""ClipCap (Mokady, Hertz and Bermano, "ClipCap: CLIP Prefix for Image Captioning", 2021), "frozen GPT-2" variant:
the frozen vision tower's image embedding is mapped by a trainable network to `prefix_length` embeddings that are
placed before the caption in the input of a frozen causal LM; only the mapping network trains.

The model behaves like the other captioners of the package (and `VisionEncoderDecoderModel`): the vision tower is
the encoder (`get_encoder()`), `generate` encodes the image once, builds the prefix on the first decoding step (it
then lives in the LM's cache), and `labels` aligned with `decoder_input_ids` give the caption loss.

This file is copied next to a full checkpoint by ``register_for_auto_class``; it imports only torch, transformers
and its sibling files (`generation.py` is generated from `itune_hf/models/_shared/`), so the checkpoint loads with
``trust_remote_code=True`` anywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .configuration_clipcap import ClipCapConfig
from .generation import OUTPUT_CACHE_FIELD, accepts_old_cache_name, cache_argument_of, callers_length, output_cache


def _default_init(module: nn.Module) -> nn.Module:
    """Mark a mapper layer for PyTorch's own initialisation (the paper's code keeps it)."""
    module._clipcap_default_init = True
    return module


class ClipCapMLPMapper(nn.Module):
    """ClipCap's MLP mapping network: `Linear(d_img, h) -> tanh -> Linear(h, prefix_length * d)`.

    Args:
        input_size: Width of the image embedding.
        hidden_size: LM width `d`.
        prefix_length: Prefix embeddings produced.
        mlp_hidden_size: Hidden width `h`.
    """

    def __init__(self, input_size: int, hidden_size: int, prefix_length: int, mlp_hidden_size: int) -> None:
        super().__init__()
        self.prefix_length, self.hidden_size = prefix_length, hidden_size
        self.fc1 = _default_init(nn.Linear(input_size, mlp_hidden_size))
        self.fc2 = _default_init(nn.Linear(mlp_hidden_size, prefix_length * hidden_size))

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        """`(B, d_img)` image embeddings -> `(B, prefix_length, d)` prefix embeddings."""
        return self.fc2(torch.tanh(self.fc1(embedding))).view(-1, self.prefix_length, self.hidden_size)


class ClipCapMapperLayer(nn.Module):
    """One layer of ClipCap's transformer mapper (its code's `TransformerLayer`): pre-LayerNorm multi-head
    self-attention (queries and keys/values without bias, output projection with bias) and a ReLU MLP of ratio 2."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = _default_init(nn.LayerNorm(hidden_size))
        self.to_queries = _default_init(nn.Linear(hidden_size, hidden_size, bias=False))
        self.to_keys_values = _default_init(nn.Linear(hidden_size, 2 * hidden_size, bias=False))
        self.project = _default_init(nn.Linear(hidden_size, hidden_size))
        self.norm2 = _default_init(nn.LayerNorm(hidden_size))
        self.fc1 = _default_init(nn.Linear(hidden_size, 2 * hidden_size))
        self.fc2 = _default_init(nn.Linear(2 * hidden_size, hidden_size))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.num_heads, -1).transpose(1, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        normed = self.norm1(tokens)
        keys, values = self.to_keys_values(normed).chunk(2, dim=-1)
        attended = F.scaled_dot_product_attention(
            self._heads(self.to_queries(normed)), self._heads(keys), self._heads(values)
        )
        tokens = tokens + self.project(attended.transpose(1, 2).reshape(tokens.shape))
        return tokens + self.fc2(F.relu(self.fc1(self.norm2(tokens))))


class ClipCapTransformerMapper(nn.Module):
    """ClipCap's transformer mapping network: the image embedding is mapped linearly to `clip_length` tokens, which
    are attended together with `prefix_length` learned constant tokens; the outputs at the constants are the prefix.

    Args:
        input_size: Width of the image embedding.
        hidden_size: LM width `d`.
        prefix_length: Learned constant tokens (and prefix embeddings produced).
        clip_length: Tokens the image embedding is mapped to.
        num_layers: Mapper layers (the paper: 8).
        num_heads: Attention heads (the paper: 8).
    """

    _no_weight_decay = ("prefix_const",)  # learned prefix tokens (input embeddings): not decayed

    def __init__(
        self, input_size: int, hidden_size: int, prefix_length: int, clip_length: int, num_layers: int, num_heads: int
    ) -> None:
        super().__init__()
        self.clip_length, self.hidden_size = clip_length, hidden_size
        self.linear = _default_init(nn.Linear(input_size, clip_length * hidden_size))
        self.prefix_const = nn.Parameter(torch.randn(prefix_length, hidden_size))
        self.layers = nn.ModuleList(ClipCapMapperLayer(hidden_size, num_heads) for _ in range(num_layers))

    def reset_parameters(self) -> None:
        """Draw the constant prefix tokens from N(0, 1), as the paper's code does."""
        nn.init.normal_(self.prefix_const)

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        """`(B, d_img)` image embeddings -> `(B, prefix_length, d)` prefix embeddings."""
        mapped = self.linear(embedding).view(-1, self.clip_length, self.hidden_size)
        tokens = torch.cat([mapped, self.prefix_const.unsqueeze(0).expand(mapped.shape[0], -1, -1)], dim=1)
        for layer in self.layers:
            tokens = layer(tokens)
        return tokens[:, self.clip_length :]


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


# Copied from itune_hf.models._shared.backbones.vision_width
def vision_width(vision_config) -> int:
    """The width of the vision states a tower gives: `hidden_size` (ViT, CLIP, SigLIP, DINOv2, Swin), else the last of
    `hidden_sizes` (a convolutional network's last stage: ResNet, ConvNeXt).

    Args:
        vision_config: The tower's config.

    Raises:
        ValueError: naming the model type, when the config has neither.
    """
    width = getattr(vision_config, "hidden_size", None)
    if isinstance(width, int):
        return width
    sizes = getattr(vision_config, "hidden_sizes", None)
    if isinstance(sizes, (list, tuple)) and sizes and isinstance(sizes[-1], int):
        return sizes[-1]
    raise ValueError(
        f"the vision config {getattr(vision_config, 'model_type', type(vision_config).__name__)!r} has neither "
        "hidden_size nor hidden_sizes, so the width of its states is unknown; set vision_config.hidden_size"
    )


class ClipCapPreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading glue of ClipCap."""

    config: ClipCapConfig
    config_class = ClipCapConfig
    base_model_prefix = "clipcap"
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch: gradient accumulation as one large batch
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    _supports_sdpa = True
    #: The mapper's gradients pass back through the frozen LM, whose activations checkpointing recomputes
    #: (`Trainer(gradient_checkpointing=True)`, `itune train --gradient-checkpointing`).
    supports_gradient_checkpointing = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if getattr(module, "_clipcap_default_init", False) or isinstance(module, ClipCapTransformerMapper):
            module.reset_parameters()
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


# Copied from itune_hf.models._shared.captioning.FrozenBackbonesCaptioner
class FrozenBackbonesCaptioner(ImageInputGeneration):
    """Loading and generation of a captioner that trains a part between two frozen backbones and reads cached vision
    states as `encoder_outputs` (the baselines: ClipCap's mapper, cross-attention in a frozen LM). The model defines
    `freeze_backbones()`."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with the backbones frozen again (loading makes fresh parameters)."""
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).freeze_backbones()
        return loaded

    def train(self, mode: bool = True):
        """`nn.Module.train`, except that a frozen vision tower stays in eval mode: it computes as at inference (a
        convolutional tower's batch norm keeps its statistics, as I-Tuning's and XGPT's towers do).

        Args:
            mode: Training mode (True) or evaluation mode (False).
        """
        super().train(mode)
        tower = self.get_encoder()
        if tower is not None and not any(p.requires_grad for p in tower.parameters()):
            tower.eval()
        return self

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate` (beam search with 5 beams by default); `encoder_outputs` (cached vision
        states) may be a tensor, a tuple or a `BaseModelOutput` and is wrapped anew (beam search expands it). A
        `max_length=` given without `max_new_tokens` replaces the saved default `max_new_tokens`."""
        check_generate_inputs(args, kwargs, ("pixel_values", "encoder_outputs"))
        callers_length(kwargs)
        encoder_outputs = kwargs.get("encoder_outputs")
        if encoder_outputs is not None:
            states = encoder_outputs if isinstance(encoder_outputs, torch.Tensor) else encoder_outputs[0]
            kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=states)
        return super().generate(*args, **kwargs)


def _refuse_position_ids(kwargs: dict) -> None:
    """ClipCap numbers its caption's positions after the prefix itself: given ones would be ignored."""
    if kwargs.get("decoder_position_ids") is not None:
        raise ValueError(
            "decoder_position_ids: ClipCap numbers the caption's positions after its prefix itself, from "
            "decoder_attention_mask (left padding included); drop decoder_position_ids"
        )


class ClipCapForCaptioning(FrozenBackbonesCaptioner, ClipCapPreTrainedModel, GenerationMixin):
    r"""Image captioning with a frozen vision tower, a frozen causal LM and a trainable ClipCap mapping network.

    Args:
        config: The composite configuration.
        vision_model: A vision tower to use instead of building one from `config.vision_config`.
        language_model: A causal LM to use instead of building one from `config.text_config`.
    """

    def __init__(
        self,
        config: ClipCapConfig,
        vision_model: PreTrainedModel | None = None,
        language_model: PreTrainedModel | None = None,
    ) -> None:
        super().__init__(config)
        self.vision_model = vision_model if vision_model is not None else AutoModel.from_config(config.vision_config)
        self.language_model = (
            language_model if language_model is not None else AutoModelForCausalLM.from_config(config.text_config)
        )
        self.vision_model.config = self.config.vision_config
        self.language_model.config = self.config.text_config
        width, image_width = config.text_config.hidden_size, vision_width(config.vision_config)
        if config.mapping_type == "mlp":
            self.mapper = ClipCapMLPMapper(image_width, width, config.prefix_length, config.mlp_hidden_size)
        else:
            self.mapper = ClipCapTransformerMapper(
                image_width, width, config.prefix_length, config.clip_length, config.mapper_num_layers,
                config.mapper_num_heads,
            )  # fmt: skip
        self.freeze_backbones()
        self.post_init()
        if self.generation_config is not None:
            self.generation_config.num_beams = 5
            self.generation_config.max_new_tokens = 30

    def generate(self, *args, **kwargs):
        """`FrozenBackbonesCaptioner.generate`; assisted decoding (`assistant_model=`) is refused: the LM's cache holds
        the prefix too, which the candidate checks do not count (they failed inside the LM)."""
        if kwargs.get("assistant_model") is not None:
            raise ValueError(
                "assistant_model: ClipCap's LM cache also holds its image prefix, which assisted decoding does not "
                "count; generate without assistant_model (prompt_lookup_num_tokens works)"
            )
        return super().generate(*args, **kwargs)

    def _prepare_static_cache(self, *args, **kwargs):
        # `generate` sizes a static cache for the caption; the LM's cache also holds the prefix embeddings
        kwargs["max_cache_len"] = kwargs["max_cache_len"] + self.config.prefix_length
        return super()._prepare_static_cache(*args, **kwargs)

    def freeze_backbones(self) -> None:
        """Freeze the vision tower and the LM: only the mapping network trains (the paper's frozen-LM variant)."""
        self.vision_model.requires_grad_(False)
        self.language_model.requires_grad_(False)

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

    # ---------------------------------------------------------------- the prefix
    def image_embedding(self, vision_states: torch.Tensor) -> torch.Tensor:
        """The image embedding the mapper reads: the CLS state after the tower's final layer norm (CLIP's
        `pooler_output`), or a convolutional tower's feature map averaged (its `pooler_output`), computed from the
        last hidden state so that cached vision states give the same.

        Args:
            vision_states: `(B, N_v, d_v)`, the vision tower's last hidden state, or `(B, C, H, W)`.
        """
        if vision_states.dim() == 4:
            return vision_states.mean(dim=(2, 3))
        tower = getattr(self.vision_model, "vision_model", self.vision_model)
        norm = getattr(tower, "post_layernorm", None)
        cls = vision_states[:, 0]
        return norm(cls) if norm is not None else cls

    def prefix_embeddings(self, vision_states: torch.Tensor) -> torch.Tensor:
        """`(B, prefix_length, d)` LM input embeddings of the images whose vision states are given."""
        embedding = self.image_embedding(vision_states)
        return self.mapper(embedding.to(next(self.mapper.parameters()).dtype))

    def _as_encoder_outputs(
        self, pixel_values, encoder_outputs, attentions=None, hidden_states=None
    ) -> BaseModelOutput:
        if encoder_outputs is None:
            if pixel_values is None:
                raise ValueError("Pass pixel_values (images through the processor) or encoder_outputs (vision states)")
            flags = {"output_attentions": attentions, "output_hidden_states": hidden_states}
            flags = {name: value for name, value in flags.items() if value is not None}  # the tower's own otherwise
            with torch.no_grad():
                dtype = next(self.vision_model.parameters()).dtype
                return self.vision_model(
                    pixel_values=check_pixel_values(pixel_values).to(dtype), return_dict=True, **flags
                )
        if isinstance(encoder_outputs, torch.Tensor):
            return BaseModelOutput(last_hidden_state=encoder_outputs)
        if isinstance(encoder_outputs, (tuple, list)):
            return BaseModelOutput(*encoder_outputs)
        return encoder_outputs

    # ---------------------------------------------------------------- forward
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
        num_items_in_batch: torch.Tensor | int | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput | tuple:
        r"""Caption LM forward pass: [prefix; caption embeddings] through the frozen LM.

        Args:
            pixel_values: `(B, 3, H, W)` images; not needed with `encoder_outputs`.
            decoder_input_ids: `(B, T)` caption tokens, BOS first; built from `labels` when omitted.
            decoder_attention_mask: `(B, T)` (or `(B, past + T)` while decoding) mask of the caption tokens, 0 on
                padding; the prefix is always attended.
            encoder_outputs: Precomputed vision states (`BaseModelOutput`, tuple or `(B, N_v, d_v)` tensor).
            cache: The LM's cache (or `generate`'s `EncoderDecoderCache`); once it holds the prefix, only new caption
                tokens are fed. `past_key_values` (its name before transformers 5.24, deprecated since) is taken too.
            decoder_inputs_embeds: Embeddings instead of `decoder_input_ids`.
            labels: `(B, T)` targets aligned with the decoder positions, -100 where no loss is wanted.
            use_cache, output_attentions, output_hidden_states, return_dict: As in transformers.
            num_items_in_batch: `Trainer`'s count of the accumulated batch's caption tokens: the loss sums over it.

        Returns:
            `Seq2SeqLMOutput` whose logits cover the caption positions only (not the prefix).
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        encoder_outputs = self._as_encoder_outputs(
            pixel_values, encoder_outputs, output_attentions, output_hidden_states
        )
        _refuse_position_ids(kwargs)
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
        if decoder_inputs_embeds is None:
            if decoder_input_ids is None:
                raise ValueError("Pass decoder_input_ids (BOS first), decoder_inputs_embeds, or labels.")
            decoder_inputs_embeds = self.get_input_embeddings()(decoder_input_ids)
        lm_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        prepend = lm_cache is None or lm_cache.get_seq_length() == 0
        embeds, length = decoder_inputs_embeds, decoder_inputs_embeds.shape[1]
        if prepend:
            prefix = self.prefix_embeddings(encoder_outputs.last_hidden_state)
            if prefix.shape[0] != embeds.shape[0]:
                raise ValueError(f"Batch size mismatch: {prefix.shape[0]} images but {embeds.shape[0]} captions")
            embeds = torch.cat([prefix.to(embeds.dtype), embeds], dim=1)
        attention_mask, position_ids = self._mask_and_positions(decoder_attention_mask, embeds, lm_cache)
        kwargs.pop("cache_position", None)  # generate() counts caption tokens; the LM's cache also holds the prefix
        outputs = self.language_model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **{cache_argument_of(self.language_model): lm_cache},
            **kwargs,
        )
        logits = outputs.logits[:, -length:]
        cache_out = cache if isinstance(cache, EncoderDecoderCache) else output_cache(outputs)
        output = Seq2SeqLMOutput(
            loss=None if labels is None else caption_loss(logits, labels, num_items_in_batch),
            logits=logits,
            **{OUTPUT_CACHE_FIELD: cache_out},
            decoder_hidden_states=outputs.hidden_states,
            decoder_attentions=outputs.attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=getattr(encoder_outputs, "hidden_states", None),
            encoder_attentions=getattr(encoder_outputs, "attentions", None),
        )
        return output if return_dict else output.to_tuple()

    def _mask_and_positions(self, caption_mask, embeds: torch.Tensor, lm_cache) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM's attention mask over [prefix; past; new tokens] and the positions of the new embeddings."""
        batch, new = embeds.shape[:2]
        past = 0 if lm_cache is None else lm_cache.get_seq_length()
        prefix = self.config.prefix_length
        if caption_mask is None:
            caption_mask = torch.ones(batch, past + new - prefix, dtype=torch.long, device=embeds.device)
        caption_mask = caption_mask[:, -(past + new - prefix) :]
        ones = torch.ones(batch, prefix, dtype=caption_mask.dtype, device=caption_mask.device)
        mask = torch.cat([ones, caption_mask], dim=1)
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, -new:]
        return mask, positions

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = [
    "ClipCapForCaptioning",
    "ClipCapMLPMapper",
    "ClipCapMapperLayer",
    "ClipCapPreTrainedModel",
    "ClipCapTransformerMapper",
]
