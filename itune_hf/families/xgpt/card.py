"""What every model card of an XGPT model says about the method (see `itune_hf.hub.cards`)."""

from __future__ import annotations

from typing import Any

from ...hub.cards import CardInfo, FamilyCard


def _parts(info: CardInfo) -> list[str]:
    parts = [
        f"Vision tower (frozen), giving the image regions: `{info.vision_model}`",
        f"Tokenizer: `{info.text_model}` (the paper's BPE vocabulary, built from Wikipedia, is not available)",
        f"Trainable parameters (the whole XGPT Transformer, shared by encoder and decoder): "
        f"{info.trainable_parameters:,}",
        "Files: the full model (frozen vision tower and the Transformer) with its code, so it also loads with "
        "`trust_remote_code=True` where `itune_hf` is not installed.",
    ]
    if info.visual_input:
        parts.insert(1, f"Visual input: {info.visual_input}")
    return parts


def visual_input(config: Any) -> str:
    """Where an XGPT model's regions come from, and what that means for comparing with the paper.

    Args:
        config: The model's `XGPTConfig`.
    """
    if config.visual_source == "regions":
        return (
            f"precomputed region features ({config.region_feature_size}-d, e.g. bottom-up-attention detector "
            "regions): the paper's setting when they come from its Faster R-CNN"
        )
    tower = getattr(config.vision_config, "model_type", "vision tower").replace("_vision_model", "").upper()
    if config.visual_source == "boxes":
        return (
            f"{tower} patch tokens pooled inside given boxes, not detector features: not comparable to the paper's "
            "numbers"
        )
    patch = "feature-map cell" if config.reads_feature_map else "patch"
    cells = f"{config.grid_size}x{config.grid_size} cells" if config.grid_size else f"every {patch}"
    cls = (" + their mean" if config.reads_feature_map else " + CLS") if config.use_cls_region else ""
    return f"{tower} grid ({cells}{cls}), not detector regions: not comparable to the paper's numbers"


CARD = FamilyCard(
    title="XGPT",
    paper_url="https://arxiv.org/abs/2003.01473",
    about="XGPT ([paper]({paper_url})) captions images with one Transformer whose parameters are shared by encoder "
    "and\ndecoder: the encoder reads image regions (features plus 5-d boxes, refined by an AoA layer), the decoder "
    "generates\nthe caption attending to the encoder's memory and its own prefix in one shared attention.",
    parts=_parts,
    citation="""@article{xia2020xgpt,
  title={XGPT: Cross-modal Generative Pre-Training for Image Captioning},
  author={Xia, Qiaolin and Huang, Haoyang and Duan, Nan and Zhang, Dongdong and Ji, Lei and Sui, Zhifang and
          Cui, Edward and Bharti, Taroon and Liu, Xin and Zhou, Ming},
  journal={arXiv preprint arXiv:2003.01473},
  year={2020}
}""",
    tag="xgpt",
    classes=("XGPTForCaptioning", "XGPTProcessor"),
    num_beams=2,
    limitation="The paper's regions come from a Faster R-CNN detector; without one, the model reads a frozen vision "
    "tower's\n  patch grid (or boxes pooled from it), so its numbers are not comparable to the paper's.",
    untrained="Not trained yet: a preset definition (randomly initialised Transformer).",
    visual_input=visual_input,
    text_is_base=False,
)


def describe_preset(preset, config, model, overrides: dict) -> list[str]:
    """What `itune params` says of an XGPT preset: it trains everything but its vision tower; the parts, and the
    total of each Table 3 architecture.

    Args:
        preset: The `itune_hf.presets.Preset`.
        config: Its `XGPTConfig`.
        model: The model built on the meta device (shapes only).
        overrides: The settings `itune params` replaced (none apply to XGPT).
    """
    import torch

    lines = [
        f"vision: {preset.vision.source}, frozen  tokenizer: GPT-2 BPE, {config.vocab_size:,} tokens",
        f"architecture: {config.architecture}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, AoA refiner {'on' if config.use_aoa_refiner else 'off'}",
        *(f"  {part}: {count:,}" for part, count in model.parameter_counts().items()),
    ]
    others = []
    for architecture in ("enc", "encdec", "encdec_share"):
        if architecture != config.architecture:
            variant = preset.config(architecture=architecture, encoder_signal=None)
            with torch.device("meta"):
                other = type(model)(variant)
            others.append(f"{architecture} {sum(p.numel() for p in other.parameters() if p.requires_grad):,}")
    lines.append(f"trainable in the other architectures (Table 3): {', '.join(others)}")
    lines.append("trainable (everything but the vision tower; the paper gives no count):")
    return lines


__all__ = ["CARD", "describe_preset"]
