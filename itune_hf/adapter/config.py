"""Configuration of the I-Tuning PEFT adapter type."""

from __future__ import annotations

from dataclasses import dataclass, field

from peft.config import PeftConfig
from peft.utils import PeftType

from ..configuration_ituning import ITUNING_INITS, validate_ituning_settings


@dataclass
class ITuningAdapterConfig(PeftConfig):
    """Configuration of an I-Tuning adapter: cross-attention modules parallel to the LM's feed-forward blocks.

    The base model must be an [`ITuningForCaptioning`] (usually a bare one, `add_ituning_modules=False`), which
    provides the vision states every module attends to.

    Args:
        bottleneck_dim (`int`, *optional*):
            Width `r` of each module's attention space; `None` means half the LM width (the paper).
        num_heads (`int`, defaults to 1):
            Attention heads per module (the paper: 1).
        scale (`float`, defaults to 1.0):
            The paper's `lambda` multiplying the module output.
        attention_scale (`float`, *optional*):
            Factor on `Q K^T`; `None` means `1/sqrt(head_dim)`, `1.0` is the paper's eq. (4).
        first_layer (`int`, defaults to 0):
            I-Tuning Dropping: no modules below this LM layer (the paper's large model: 18).
        init (`str`, defaults to `"zero"`):
            `"zero"` (a fresh adapter leaves the LM unchanged) or `"random"` (the paper).
        dropout (`float`, defaults to 0.0):
            Dropout on the cross-attention probabilities.
        target_modules (`str`, *optional*):
            Regex of the feed-forward blocks to wrap. Filled in from the base model and `first_layer` when `None`.
        text_model_type, text_hidden_size, text_num_layers, vision_model_type, vision_hidden_size:
            The base the adapter was built for; recorded when it is created and checked when it is loaded, so an
            adapter never loads silently into a base of another size or architecture.
    """

    bottleneck_dim: int | None = field(default=None, metadata={"help": "Attention width r; None = LM width / 2."})
    num_heads: int = field(default=1, metadata={"help": "Attention heads per module (paper: 1)."})
    scale: float = field(default=1.0, metadata={"help": "The paper's lambda multiplying the module output."})
    attention_scale: float | None = field(
        default=None, metadata={"help": "Factor on QK^T; None = 1/sqrt(head_dim), 1.0 = the paper's eq. (4)."}
    )
    first_layer: int = field(default=0, metadata={"help": "I-Tuning Dropping: first LM layer with a module."})
    init: str = field(default="zero", metadata={"help": f"Initialisation, one of {ITUNING_INITS}."})
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the attention probabilities."})
    target_modules: list[str] | str | None = field(
        default=None, metadata={"help": "Regex of the FFN blocks to wrap; derived from the base when None."}
    )
    text_model_type: str | None = field(default=None, metadata={"help": "LM type the adapter was built for."})
    text_hidden_size: int | None = field(default=None, metadata={"help": "LM width the adapter was built for."})
    text_num_layers: int | None = field(default=None, metadata={"help": "LM depth the adapter was built for."})
    vision_model_type: str | None = field(default=None, metadata={"help": "Vision tower type it was built for."})
    vision_hidden_size: int | None = field(default=None, metadata={"help": "Vision width it was built for."})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = PeftType.ITUNING
        validate_ituning_settings(
            bottleneck_dim=self.bottleneck_dim,
            num_heads=self.num_heads,
            scale=self.scale,
            attention_scale=self.attention_scale,
            first_layer=self.first_layer,
            init=self.init,
            dropout=self.dropout,
        )

    def module_kwargs(self) -> dict:
        """Keyword arguments for `ITuningModule` (without the widths, which come from the base model)."""
        return {
            "bottleneck_dim": self.bottleneck_dim,
            "num_heads": self.num_heads,
            "scale": self.scale,
            "attention_scale": self.attention_scale,
            "dropout": self.dropout,
            "init": self.init,
        }
