"""`ITuningSettings`: the one definition of the I-Tuning module settings, their defaults and their checks.

Used by the model configuration (`ITuningConfig`), the PEFT adapter config (`ITuningAdapterConfig`), the module
(`ITuningModule` gets `module_kwargs`), `itune train` and its recipes (one option per field, same name) and the
model cards. Pure Python, so reading it (`itune train --help`) imports neither torch nor transformers; it is copied
next to full checkpoints with the configuration file for remote code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: Initialisation schemes of the I-Tuning modules.
#: ``"zero"``: ``W_o`` and ``b_o`` start at zero, so a fresh model is exactly the frozen LM (our default, as in
#: Flamingo's zero-initialised gates and LoRA's ``B = 0``); ``"random"``: every projection keeps PyTorch's random
#: ``nn.Linear`` initialisation, the paper's "randomly initialized" modules.
ITUNING_INITS = ("zero", "random")

#: Which of the vision tower's output tokens the I-Tuning modules attend to (their keys and values).
#: ``"all"``: every token of the last hidden state, CLS and patches (197 for CLIP ViT-B/16; the paper's "visual
#: embeddings V"); ``"cls"``: the CLS token alone (one key: the image as one vector, as ClipCap reads it);
#: ``"patches"``: the patch tokens without CLS (196 for ViT-B/16).
VISUAL_TOKENS = ("all", "cls", "patches")
# how a model card lists them
_CARD_TOKENS = {"all": "all (CLS + patches)", "cls": "CLS only", "patches": "patches only"}
_CARD_NORM = {None: "as in the tower's last hidden state (CLIP: none)", True: "on every token", False: "none"}

#: Names used by `ITuningConfig` before the settings had one naming scheme; still accepted when loading.
LEGACY_CONFIG_NAMES = {
    "ituning_num_heads": "num_heads",
    "ituning_scale": "scale",
    "ituning_attention_scale": "attention_scale",
    "ituning_first_layer": "first_layer",
    "ituning_init": "init",
    "ituning_dropout": "dropout",
}


# Copied from itune_hf.models._shared.settings.SettingsFields
class SettingsFields:
    """Field-wise helpers of a settings dataclass (its direct subclass). A class inheriting the settings (a config,
    an adapter config) still reads only the settings' own fields."""

    @classmethod
    def settings_class(cls) -> type:
        """The settings dataclass itself (the class that takes this mixin), also when asked on a subclass."""
        return next(klass for klass in cls.__mro__ if SettingsFields in klass.__bases__)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The setting names, in definition order (the same names everywhere: config, adapter, `itune train`)."""
        return tuple(f.name for f in dataclasses.fields(cls.settings_class()))

    @classmethod
    def help(cls, name: str) -> str:
        """The help text of setting `name` (shown by `itune train --help`).

        Args:
            name: One of `names()`.
        """
        return next(f.metadata["help"] for f in dataclasses.fields(cls.settings_class()) if f.name == name)

    @classmethod
    def from_object(cls, source: Any, **overrides: Any) -> Any:
        """The settings held by `source` (a config, an adapter config, ...), with `overrides` applied (`None`
        overrides are ignored).

        Args:
            source: Any object with the setting names as attributes.
            **overrides: Settings replacing those of `source`.
        """
        values = {name: getattr(source, name) for name in cls.names()}
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (only the setting names, also on subclasses)."""
        return {name: getattr(self, name) for name in self.names()}


@dataclass
class ITuningSettings(SettingsFields):
    """Settings of the I-Tuning modules (paper section 3); validated on creation.

    Args:
        bottleneck_dim: Width `r` of each module's attention space; `None` means half the LM width (the paper).
        num_heads: Attention heads per module (the paper writes single-head attention).
        scale: The paper's `lambda >= 1` multiplying the module output (its value is not given in the paper).
        attention_scale: Factor on `Q K^T` before the softmax; `None` means `1/sqrt(head_dim)` (standard attention),
            `1.0` is the paper's equation (4), which has no factor.
        first_layer: I-Tuning Dropping: LM layers below this index get no module and run without autograd in
            training (the paper's large model with dropping: 18 of 36).
        init: `"zero"` (output projection at zero: a fresh model equals the frozen LM) or `"random"` (the paper).
        dropout: Dropout on the cross-attention probabilities (the paper uses none).
        visual_tokens: Which vision tokens the modules attend to: `"all"` (CLS and patches, the paper's `V`),
            `"cls"` (the CLS token alone) or `"patches"` (the patch tokens without CLS).
        final_norm: The vision tower's final layer norm on the tokens the modules read. `None` (the default): the
            tower's last hidden state as the tower returns it (CLIP: *before* its `post_layernorm`, which CLIP
            applies to the pooled CLS output only; ViT, SigLIP, DINOv2: after their final norm, which they apply to
            every token). `True`: after the final norm (CLIP's `post_layernorm` applied to every token). `False`:
            before it (refused for towers that apply it inside their last hidden state: it cannot be undone). The
            paper is silent; it reads "the output of the vision encoder".

    Raises:
        ValueError: naming the offending setting and its value.
    """

    bottleneck_dim: int | None = field(default=None, metadata={"help": "Attention width r (default: LM width / 2)."})
    num_heads: int = field(default=1, metadata={"help": "Attention heads per module (paper: 1)."})
    scale: float = field(default=1.0, metadata={"help": "The paper's lambda, multiplying the module output."})
    attention_scale: float | None = field(
        default=None, metadata={"help": "Factor on QK^T (default 1/sqrt(head_dim); 1.0 is the paper's eq. 4)."}
    )
    first_layer: int = field(default=0, metadata={"help": "I-Tuning Dropping: first LM layer with a module."})
    init: str = field(default="zero", metadata={"help": f"Module initialisation: {' or '.join(ITUNING_INITS)}."})
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the attention probabilities (paper: 0)."})
    visual_tokens: str = field(
        default="all",
        metadata={"help": "Vision tokens the modules attend to: all (CLS + patches, the paper), cls or patches."},
    )
    final_norm: bool | None = field(
        default=None,
        metadata={
            "help": "The vision tower's final layer norm on the tokens read: true (CLIP: its post_layernorm on every "
            "token) or false (before it); default: as the tower's last hidden state (CLIP: before; ViT, SigLIP: after)."
        },
    )

    def __post_init__(self) -> None:
        self.check_settings()

    def check_settings(self) -> None:
        """Check every setting (also callable on a subclass whose fields were changed after creation)."""
        if self.bottleneck_dim is not None and self.bottleneck_dim <= 0:
            raise ValueError(
                f"bottleneck_dim must be a positive integer or None (LM width / 2), got {self.bottleneck_dim}"
            )
        if self.num_heads <= 0:
            raise ValueError(f"num_heads must be a positive integer, got {self.num_heads}")
        if self.bottleneck_dim is not None and self.bottleneck_dim % self.num_heads != 0:
            raise ValueError(
                f"bottleneck_dim={self.bottleneck_dim} is not divisible by num_heads={self.num_heads}; pick values "
                "where bottleneck_dim % num_heads == 0"
            )
        if self.scale <= 0:
            raise ValueError(
                f"scale (the paper's lambda) must be positive, got {self.scale}; the paper uses lambda >= 1"
            )
        if self.attention_scale is not None and self.attention_scale <= 0:
            raise ValueError(f"attention_scale must be positive or None (1/sqrt(head_dim)), got {self.attention_scale}")
        if self.first_layer < 0:
            raise ValueError(f"first_layer must be >= 0, got {self.first_layer}")
        if self.init not in ITUNING_INITS:
            raise ValueError(f"init must be one of {ITUNING_INITS}, got {self.init!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.visual_tokens not in VISUAL_TOKENS:
            raise ValueError(f"visual_tokens must be one of {VISUAL_TOKENS}, got {self.visual_tokens!r}")
        if self.final_norm is not None and not isinstance(self.final_norm, bool):
            raise ValueError(
                f"final_norm must be true, false or None (the tower's output as it is), got {self.final_norm!r}"
            )

    def resolved_bottleneck_dim(self, hidden_size: int) -> int:
        """The bottleneck width used with an LM of width `hidden_size`: `bottleneck_dim`, or half the LM width."""
        width = self.bottleneck_dim if self.bottleneck_dim is not None else hidden_size // 2
        if width % self.num_heads:
            raise ValueError(
                f"bottleneck_dim={width} (half the LM width {hidden_size}) is not divisible by num_heads="
                f"{self.num_heads}; set bottleneck_dim explicitly"
            )
        return width

    def layers(self, num_layers: int) -> list[int]:
        """Indices of the LM layers that carry a module, for an LM of `num_layers` layers.

        Raises:
            ValueError: when `first_layer` leaves no layer with a module.
        """
        if self.first_layer >= num_layers:
            raise ValueError(
                f"first_layer={self.first_layer} leaves no layer with a module: the LM has {num_layers} layers; "
                f"use a value below {num_layers}"
            )
        return list(range(self.first_layer, num_layers))

    def module_kwargs(self, hidden_size: int, vision_hidden_size: int) -> dict[str, Any]:
        """Keyword arguments of `ITuningModule` for an LM of width `hidden_size` and vision states of
        `vision_hidden_size`."""
        return {
            "hidden_size": hidden_size,
            "vision_hidden_size": vision_hidden_size,
            "bottleneck_dim": self.resolved_bottleneck_dim(hidden_size),
            "num_heads": self.num_heads,
            "scale": self.scale,
            "attention_scale": self.attention_scale,
            "dropout": self.dropout,
            "init": self.init,
        }

    def card_rows(self, model_config: Any) -> dict[str, Any]:
        """The settings as the card of a model with `model_config` (an `ITuningConfig`) lists them."""
        text = model_config.text_config
        return self.describe(text.hidden_size, text.num_hidden_layers)

    def describe(self, hidden_size: int, num_layers: int) -> dict[str, Any]:
        """The resolved settings as a model card lists them."""
        layers = self.layers(num_layers)
        return {
            "layers with modules": f"{layers[0]}..{layers[-1]} ({len(layers)} of {num_layers})",
            "bottleneck width": self.resolved_bottleneck_dim(hidden_size),
            "heads": self.num_heads,
            "lambda": self.scale,
            "attention scale": "1/sqrt(head_dim)" if self.attention_scale is None else self.attention_scale,
            "init": self.init,
            "dropout": self.dropout,
            "visual tokens": _CARD_TOKENS[self.visual_tokens],
            "vision final norm": _CARD_NORM[self.final_norm],
        }


__all__ = ["ITUNING_INITS", "ITuningSettings", "LEGACY_CONFIG_NAMES", "VISUAL_TOKENS"]
