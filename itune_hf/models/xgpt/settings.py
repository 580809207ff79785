"""`XGPTSettings`: the architecture switches of XGPT that the paper ablates (Table 3, appendix A.1), their defaults
and their checks.

Used by the model configuration (`XGPTConfig` inherits them), `itune train` (one option per field, same name, where
the command exposes them) and the model cards. Pure Python, so reading it imports neither torch nor transformers; it is
copied next to full checkpoints with the configuration file for remote code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: Table 3's architectures. ``"enc"``: one stack over [regions; text] with a UniLM-style sequence-to-sequence mask (text
#: attends to the regions of its own layer); ``"encdec"``: separate encoder and decoder stacks, the decoder with its own
#: self-attention and encoder-decoder attention (Vaswani et al.); ``"encdec_share"``: one stack used as encoder and as
#: decoder, the decoder's self-attention and encoder-decoder attention being one attention (the paper's model).
ARCHITECTURES = ("enc", "encdec", "encdec_share")

#: How the decoder tells keys/values of the encoder memory from those of the caption (the paper's "signal", whose form
#: it does not give). ``"key_value"``: learned vectors added to the memory's keys and values in every layer (2 x hidden
#: per layer); ``"embedding"``: one learned type embedding added to the memory before the layers project it
#: (hidden parameters in all); ``"none"``: no signal.
ENCODER_SIGNALS = ("key_value", "embedding", "none")

#: Where the regions come from. ``"grid"``: the frozen vision tower's patch tokens (pooled to a grid of `grid_size`
#: cells); ``"boxes"``: its patch tokens mean-pooled inside given boxes (`region_boxes`); ``"regions"``: precomputed
#: region features (e.g. bottom-up-attention Faster R-CNN features, 2048-d) with their boxes; no vision tower.
VISUAL_SOURCES = ("grid", "boxes", "regions")


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
class XGPTSettings(SettingsFields):
    """The switches of the XGPT architecture that the paper ablates; validated on creation.

    Args:
        architecture: One of `ARCHITECTURES` (paper Table 3); `"encdec_share"` is the paper's model.
        use_aoa_refiner: Refine the region embeddings with one AoA layer before the encoder (appendix A.1).
        encoder_signal: One of `ENCODER_SIGNALS`, for architectures whose decoder attends to the memory and the caption
            in one attention (`"encdec_share"`, `"enc"`); `None` picks `"key_value"` for `"encdec_share"` and
            `"none"` for `"enc"` (UniLM's mask, exactly). `"encdec"` has a separate encoder-decoder attention and takes
            no signal.
        region_feature_norm: Layer-normalise each region's feature vector (learned scale and shift) before the
            projection. Not in the paper, whose Faster R-CNN features go straight into the projection; for towers
            whose states carry a large shared positive component (a ResNet's post-ReLU feature map), see
            docs/xgpt.md.

    Raises:
        ValueError: naming the offending setting and its value.
    """

    architecture: str = field(
        default="encdec_share", metadata={"help": f"Architecture (paper Table 3): {', '.join(ARCHITECTURES)}."}
    )
    use_aoa_refiner: bool = field(default=True, metadata={"help": "Refine the regions with an AoA layer (paper A.1)."})
    encoder_signal: str | None = field(
        default=None,
        metadata={
            "help": f"Signal marking memory keys/values: {', '.join(ENCODER_SIGNALS)} (default: key_value for "
            "encdec_share, none for enc)."
        },
    )
    region_feature_norm: bool = field(
        default=False,
        metadata={
            "help": "Layer-normalise each region's feature vector before its projection (not in the paper: for towers "
            "whose states are unnormalised, e.g. a ResNet's post-ReLU feature map)."
        },
    )

    def __post_init__(self) -> None:
        self.check_settings()

    def check_settings(self) -> None:
        """Check every setting (also callable on a subclass whose fields were changed after creation)."""
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if self.encoder_signal is not None and self.encoder_signal not in ENCODER_SIGNALS:
            raise ValueError(f"encoder_signal must be one of {ENCODER_SIGNALS} or None, got {self.encoder_signal!r}")
        if self.architecture == "encdec" and self.encoder_signal not in (None, "none"):
            raise ValueError(
                f"encoder_signal={self.encoder_signal!r} needs a decoder that attends to the memory and the caption in "
                "one attention; architecture='encdec' has a separate encoder-decoder attention: use encoder_signal=None"
            )

    @property
    def resolved_encoder_signal(self) -> str:
        """The signal actually used: `encoder_signal`, or the architecture's default."""
        if self.encoder_signal is not None:
            return self.encoder_signal
        return "key_value" if self.architecture == "encdec_share" else "none"

    def card_rows(self, model_config: Any) -> dict[str, Any]:
        """The settings and sizes as the card of a model with `model_config` (an `XGPTConfig`) lists them."""
        return {
            **self.describe(),
            "layers": model_config.num_hidden_layers,
            "hidden size": model_config.hidden_size,
            "attention heads": model_config.num_attention_heads,
            "regions": model_config.visual_source,
        }

    def describe(self) -> dict[str, Any]:
        """The resolved settings as a model card lists them."""
        return {
            "architecture": self.architecture,
            "AoA refining layer": "on" if self.use_aoa_refiner else "off",
            "encoder signal": "n/a (separate encoder-decoder attention)"
            if self.architecture == "encdec"
            else self.resolved_encoder_signal,
            "region feature norm": "on" if self.region_feature_norm else "off",
        }


__all__ = ["ARCHITECTURES", "ENCODER_SIGNALS", "VISUAL_SOURCES", "XGPTSettings"]
