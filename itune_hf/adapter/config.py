"""Configuration of the I-Tuning PEFT adapter type."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from peft.config import PeftConfig
from peft.utils import PeftType

from ..models.ituning.settings import ITuningSettings


@dataclass
class ITuningAdapterConfig(PeftConfig, ITuningSettings):
    """Configuration of an I-Tuning adapter: cross-attention modules parallel to the LM's feed-forward blocks.

    The base model must be an [`ITuningForCaptioning`] (usually a bare one, `add_ituning_modules=False`), which
    provides the vision states every module attends to.

    Args:
        bottleneck_dim, num_heads, scale, attention_scale, first_layer, init, dropout, visual_tokens, final_norm:
            The I-Tuning settings, as defined (with defaults and checks) by [`ITuningSettings`].
        target_modules (`str`, *optional*):
            Regex (or names) of the feed-forward blocks to wrap. Filled in from the base model and `first_layer`
            when `None`; when given, `first_layer` still applies: a matched block below it gets no module.
        text_model_type, text_hidden_size, text_num_layers, vision_model_type, vision_hidden_size:
            The base the adapter was built for; recorded when it is created and checked when it is loaded, so an
            adapter never loads silently into a base of another size or architecture.
        backbones (`list[str]`, *optional*):
            The references (Hub ids or folders) of the vision tower and the LM of the base, recorded when the adapter
            is created: the card's `base_model` lists the Hub ids among them, and a folder without `config.json` or
            `base_model_name_or_path` rebuilds its base from them.
    """

    target_modules: list[str] | str | None = field(
        default=None, metadata={"help": "Regex of the FFN blocks to wrap; derived from the base when None."}
    )
    text_model_type: str | None = field(default=None, metadata={"help": "LM type the adapter was built for."})
    text_hidden_size: int | None = field(default=None, metadata={"help": "LM width the adapter was built for."})
    text_num_layers: int | None = field(default=None, metadata={"help": "LM depth the adapter was built for."})
    vision_model_type: str | None = field(default=None, metadata={"help": "Vision tower type it was built for."})
    vision_hidden_size: int | None = field(default=None, metadata={"help": "Vision width it was built for."})
    backbones: list[str] | None = field(
        default=None, metadata={"help": "References of the base's vision tower and LM (Hub ids or folders)."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = PeftType.ITUNING
        if self.task_type is not None:  # PEFT would wrap the captioner in a text model's PeftModel class
            raise ValueError(
                f"task_type={self.task_type!r}: an I-Tuning adapter has no PEFT task type (its base is a captioner, "
                "whose forward takes pixel_values and decoder_input_ids, not a causal or seq2seq LM); leave task_type "
                "unset and load it with PeftModel or AutoPeftModel"
            )
        self.check_settings()

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> None:
        """Write `adapter_config.json`, and the base's reference `config.json` when the folder has none (so that the
        Auto classes and `pipeline` open a plain `PeftModel.save_pretrained` folder). The card that
        `PeftModel.save_pretrained` has just written next to it gets a valid `base_model`: PEFT copies the base
        config's name there (empty for a base built from backbones or a preset), which becomes the Hub ids among
        `backbones` (none: no `base_model`).

        Args:
            save_directory: The adapter folder.
            **kwargs: As in `PeftConfig.save_pretrained`.
        """
        from .base import AUTO_MAPPING

        # AutoPeftModel rebuilds the base bare through ITuningBase (PEFT would name the captioner's own class, whose
        # from_pretrained of a full checkpoint brings its native modules)
        super().save_pretrained(str(save_directory), **{**kwargs, "auto_mapping_dict": AUTO_MAPPING})
        folder = Path(save_directory)
        base = getattr(self, "_base_model", None)  # set when the adapter was attached (not serialised)
        if base is not None and _holds_no_model_config(folder):
            from .saving import save_reference_config

            save_reference_config(base.config, base.architecture, folder)
        from ..hub.cards import set_adapter_card_base

        # PEFT writes the card into the folder it was given: the parent of a named adapter's subfolder
        card = folder / "README.md" if (folder / "README.md").is_file() else folder.parent / "README.md"
        set_adapter_card_base(card, self.backbones or [], only_peft_cards=card.parent != folder)

    @property
    def settings(self) -> ITuningSettings:
        """The I-Tuning settings of this adapter, as an `ITuningSettings`."""
        return ITuningSettings.from_object(self)


def _holds_no_model_config(folder: Path) -> bool:
    """Whether `folder` has no `config.json`, or only the reference config an earlier adapter save wrote there
    (a bare `ITuningConfig`, no model weights beside it): the one to (re)write for the adapter saved now. A full
    checkpoint's config is left alone."""
    import json

    from .weight_files import folder_holds_full_weights

    path = folder / "config.json"
    if not path.is_file():
        return True
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    bare = isinstance(config, dict) and config.get("add_ituning_modules", True) is False  # (I-Tuning configs' key)
    return bare and not folder_holds_full_weights(folder)
