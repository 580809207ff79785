"""What every model card of an I-Tuning model says about the method (see `itune_hf.hub.cards`)."""

from __future__ import annotations

from ...hub.cards import CardInfo, FamilyCard


def _parts(info: CardInfo) -> list[str]:
    stored = [name for name in (info.vision_model, info.text_model) if name and "backbones/" in name]
    backbones = (
        "random backbones are stored here under `backbones/` (frozen, not trained), the others load from their own "
        "repositories"
        if stored
        else "which are loaded from their own repositories (no backbone weight is stored here)"
    )
    files = (
        "`adapter_config.json` and `adapter_model.safetensors` hold only the I-Tuning weights; `config.json` names "
        f"the frozen backbones: {backbones}."
        if info.adapter
        else "The repository holds the full model (backbones and I-Tuning modules) with its code, so it also loads "
        "with `trust_remote_code=True` where `itune_hf` is not installed."
    )
    return [
        f"Vision encoder (frozen): `{info.vision_model}`",
        f"Language model (frozen): `{info.text_model}`",
        f"Trainable I-Tuning parameters: {info.trainable_parameters:,}",
        f"Files: {files}",
    ]


CARD = FamilyCard(
    title="I-Tuning",
    paper_url="https://arxiv.org/abs/2202.06574",
    about="I-Tuning ([paper]({paper_url})) joins a frozen vision encoder and a frozen causal language model with "
    "small\ntrainable cross-attention modules placed in parallel to the LM's feed-forward blocks; only those modules "
    "are trained.",
    parts=_parts,
    citation="""@inproceedings{luo2023ituning,
  title={I-Tuning: Tuning Frozen Language Models with Image for Lightweight Image Captioning},
  author={Luo, Ziyang and Hu, Zhipeng and Xi, Yadong and Zhang, Rongsheng and Ma, Jing},
  booktitle={ICASSP},
  year={2023}
}""",
    tag="i-tuning",
    classes=("ITuningForCaptioning", "ITuningProcessor"),
    num_beams=5,
    also_registers=("the PEFT adapter type",),
    limitation="The frozen LM keeps its own biases and knowledge; the frozen vision encoder sees each image resized to "
    "its own input size (224x224 for the presets' CLIP ViT-B/16), so small details can be lost.",
    untrained="Not trained yet: a preset definition (random I-Tuning modules).",
)


def describe_preset(preset, config, model, overrides: dict) -> list[str]:
    """What `itune params` says of an I-Tuning preset: its backbones, the layers with a module and their size, the
    frozen parameters and the paper's count (Table 1) when nothing is overridden.

    Args:
        preset: The `itune_hf.presets.Preset`.
        config: Its `ITuningConfig` (with the overrides).
        model: The model built on the meta device (shapes only).
        overrides: The settings `itune params` replaced.
    """
    layers = config.ituning_layers
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    lines = [
        f"vision: {preset.vision.source}  text: {preset.text.source}",
        f"I-Tuning layers: {layers[0]}..{layers[-1]} ({len(layers)} of {config.text_config.num_hidden_layers}), "
        f"bottleneck {config.resolved_bottleneck_dim}, {trainable // len(layers):,} parameters per layer",
        f"frozen backbone parameters: {frozen:,}",
    ]
    if preset.paper_trainable_params and not overrides:
        lines.append(f"paper (Table 1): {preset.paper_trainable_params} trainable")
    return lines


__all__ = ["CARD", "describe_preset"]
