"""What the configs of the families made of a vision-tower config and an LM config do alike.

A family's configuration file carries a copy of `VisionTextConfig` under a `# Copied from` marker
(`make fix-copies`), and its config takes it as its first base.
"""

from __future__ import annotations

from transformers import PreTrainedConfig


class VisionTextConfig:
    """`from_vision_text_configs` for a config holding a `vision_config` and a `text_config`."""

    @classmethod
    def from_vision_text_configs(
        cls, vision_config: PreTrainedConfig, text_config: PreTrainedConfig, **kwargs
    ) -> PreTrainedConfig:
        """Build a config from a vision-tower config and an LM config.

        Args:
            vision_config: Config of the vision tower (a full CLIP/SigLIP config is reduced to its `vision_config`).
            text_config: Config of the causal LM.
            **kwargs: The config's other fields (the family's settings) and special tokens, as in its docstring.
        """
        vision_config = getattr(vision_config, "vision_config", None) or vision_config
        return cls(vision_config=vision_config.to_dict(), text_config=text_config.to_dict(), **kwargs)


__all__ = ["VisionTextConfig"]
